"""prepare.sh stage 2 with --bpe sentencepiece: a joint SentencePiece BPE model instead of fastBPE."""
import os

from ..files import read_lines, write_lines
from .common import FAIRSEQ_SPLIT

# SentencePiece's default rule (nmt_nfkc) rewrites characters (full-width digits, ligatures, "…"), so
# decoded pieces would no longer match the references in tok/; "identity" keeps the text as it is
NORMALIZATION = "identity"


def spm_encode_dir(tok_dir, bpe_dir, src, tgt, vocab_size):
    """Model learned on train (both sides) -> BPE_DIR/{split}.{lang} as pieces and
    BPE_DIR/spm.model / spm.vocab. Writes into BPE_DIR, which the caller makes atomic."""
    import sentencepiece as spm

    os.makedirs(bpe_dir, exist_ok=True)
    train = [line for lang in (src, tgt) for line in read_lines(os.path.join(tok_dir, f"train.{lang}"))]
    prefix = os.path.join(bpe_dir, "spm")
    # the lines themselves, not a comma-separated list of file names (a folder's name may hold a comma)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(train), model_prefix=prefix, vocab_size=vocab_size, model_type="bpe",
        character_coverage=1.0, hard_vocab_limit=False, minloglevel=2, normalization_rule_name=NORMALIZATION,
        bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    for split in FAIRSEQ_SPLIT.values():
        for lang in (src, tgt):
            lines = read_lines(os.path.join(tok_dir, f"{split}.{lang}"))
            write_lines(os.path.join(bpe_dir, f"{split}.{lang}"), [" ".join(sp.encode(x, out_type=str)) for x in lines])
