"""prepare.sh's last stage: data-bin/PAIR/stats.json, what every later stage reads about the data
(the segmentation and how to undo it, sizes, QKNorm's L); recipes.read_stats reads it."""
import json
import os

import numpy as np

from ..files import count_lines, read_json, write_atomic
from ..paths import redo
from ..recipes import REMOVE_BPE
from .common import FAIRSEQ_SPLIT, DataError


def _tokens(path):
    with open(path, encoding="utf-8") as f:
        return sum(len(line.split()) for line in f)


def _lengths(path):
    """Each line's length as fairseq-preprocess stores it: its tokens plus EOS."""
    with open(path, encoding="utf-8") as f:
        return [len(line.split()) + 1 for line in f]


def write_stats(data_bin, tok_dir, bpe_dir, src, tgt, pair, bpe, bpe_size, percentile=97.5):
    tok_counts = read_json(os.path.join(tok_dir, "counts.json"), redo(tok_dir, pair))
    lines, tokens = {}, {}
    for split in FAIRSEQ_SPLIT.values():
        segmented = {lang: count_lines(os.path.join(bpe_dir, f"{split}.{lang}")) for lang in (src, tgt)}
        tok_lines = count_lines(os.path.join(tok_dir, f"{split}.{src}"))
        if set(segmented.values()) != {tok_lines}:
            raise DataError(f"{bpe_dir}: segmented {split} has {segmented} lines, tokenized text "
                            f"{tok_lines}: {redo(bpe_dir, pair)}")
        lines[split] = {"input": tok_counts["lines"][split]["input"], "kept": tok_lines}
        tokens[split] = {lang: {"words": _tokens(os.path.join(tok_dir, f"{split}.{lang}")),
                                "subwords": _tokens(os.path.join(bpe_dir, f"{split}.{lang}"))}
                         for lang in (src, tgt)}
    tgt_types = set()
    with open(os.path.join(bpe_dir, f"train.{tgt}"), encoding="utf-8") as f:
        for line in f:
            tgt_types.update(line.split())
    dict_size = count_lines(os.path.join(data_bin, f"dict.{src}.txt"))
    # QKNorm's L, as the plugin computes it from the binarized data (qknorm_fairseq/data_stats.py): for
    # the user (prepare.sh prints it) to compare with a paper's L (configs/PAIR.yaml model.qknorm_length)
    lengths = _lengths(os.path.join(bpe_dir, f"train.{src}")) + _lengths(os.path.join(bpe_dir, f"train.{tgt}"))
    length = float(np.percentile(lengths, percentile))
    stats = {
        "pair": pair, "src": src, "tgt": tgt, "bpe": bpe, "bpe_size": bpe_size,
        "remove_bpe": REMOVE_BPE[bpe],
        "max_len": tok_counts["max_len"], "raw_input": tok_counts["raw_input"],
        "lines": lines, "tokens": tokens,
        # counted in BPE tokens + EOS, over source and target sides of the binarized train split
        f"length_p{percentile:g}": length,
        "dict_size": dict_size,  # fairseq's dictionary: 4 specials + types (+ padding to a multiple of 8)
        "target_vocab_size": len(tgt_types),  # types seen on the target side of train (logit masking keeps them)
    }
    write_atomic(os.path.join(data_bin, "stats.json"), json.dumps(stats, indent=1, ensure_ascii=False))
    return stats
