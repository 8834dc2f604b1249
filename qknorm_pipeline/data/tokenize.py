"""prepare.sh stage 1: IN_DIR/{train,dev,test}.{src,tgt} -> OUT_DIR/{train,valid,test}.{src,tgt}:
alignment check, Moses tokenization of raw text, whitespace normalised, train length filter."""
import json
import os

from ..cli import log
from ..files import atomic_dir, read_lines, write_lines
from .common import FAIRSEQ_SPLIT, DataError
from .readers import check_aligned

BOM = "\ufeff"


def tokenize_dir(in_dir, out_dir, src, tgt, raw, max_len):
    texts = {}
    for name, split in FAIRSEQ_SPLIT.items():
        sides = []
        for lang in (src, tgt):
            path = os.path.join(in_dir, f"{name}.{lang}")
            if not os.path.exists(path):
                raise DataError(f"missing {path}: --src-dir needs train, dev and test files for both "
                                f"languages ({name}.{src}, {name}.{tgt})")
            lines = read_lines(path)
            if lines and lines[0].startswith(BOM):  # an editor's byte-order mark, not text
                log("prepare", f"{path}: a byte-order mark (U+FEFF) before the first line, left out")
                lines[0] = lines[0][1:]
            sides.append(lines)
        check_aligned(len(sides[0]), len(sides[1]), f"{in_dir}/{name}.{{{src},{tgt}}}")
        if not sides[0]:
            raise DataError(f"{in_dir}/{name}.{src} is empty")
        texts[split] = sides
    if raw:
        from sacremoses import MosesTokenizer

        for i, lang in enumerate((src, tgt)):
            # escape=False (Moses -no-escape): fairseq and BPE take any character, and escaping
            # only turns ' into the 6-character &apos; that BPE then has to split.
            tok = MosesTokenizer(lang=lang)
            for split in texts:
                log("prepare", f"tokenizing {split}.{lang} ({len(texts[split][i])} lines)")
                texts[split][i] = [tok.tokenize(line, escape=False, return_str=True) for line in texts[split][i]]
    # One space between tokens. str.split() also takes \x0b, \x0c, \x1c-\x1f, \x85, \u2028, \u2029
    # and a lone \r for spaces, so no later tool can break a line at them.
    texts = {split: [[" ".join(line.split()) for line in side] for side in sides] for split, sides in texts.items()}
    counts = {}
    for split, (a, b) in texts.items():
        n = len(a)
        if split == "train":
            kept = [(x, y) for x, y in zip(a, b) if 0 < len(x.split()) <= max_len and 0 < len(y.split()) <= max_len]
            if not kept:
                raise DataError(f"no training pair left after the length filter (1..{max_len} tokens)")
            a, b = [k[0] for k in kept], [k[1] for k in kept]
            texts[split] = [a, b]
        counts[split] = {"input": n, "kept": len(a)}
    with atomic_dir(out_dir) as tmp:
        for split, sides in texts.items():
            for lang, lines in zip((src, tgt), sides):
                write_lines(os.path.join(tmp, f"{split}.{lang}"), lines)
        with open(os.path.join(tmp, "counts.json"), "w") as f:
            json.dump({"max_len": max_len, "raw_input": raw, "lines": counts}, f, indent=2)
    return counts
