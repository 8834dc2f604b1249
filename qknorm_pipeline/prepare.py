"""Prepares one pair for training: tokenize -> length filter -> joint BPE -> fairseq binarization.

usage: bash scripts/prepare.sh [--pair] PAIR [--src-dir DIR] [--tokenized | --raw]
                               [--bpe fastbpe|sentencepiece] [--merges N] [--max-len N] [--force]
       (python -m qknorm_pipeline.prepare takes the same arguments)

Input: $DATA_DIR/PAIR/raw/ (written by scripts/download.sh), or --src-dir DIR holding
  train.xx train.yy dev.xx dev.yy test.xx test.yy for --pair xx-yy (any pair: a pair without
  configs/xx-yy.yaml needs --tokenized or --raw and takes configs/base.yaml's data settings:
  fastbpe, 8000 merges, max length 250). train.sh, evaluate.sh and reproduce.sh then work on it
  with the base recipe sized from its training set (docs/training.md).
--tokenized: text is already Moses-tokenized (TED, IWSLT); --raw: tokenize with sacremoses
  (escape=False, i.e. Moses -no-escape; see data/README.md). Default: data.tokenized of the config.
Output:
  $DATA_DIR/PAIR/tok/{train,valid,test}.{xx,yy}  tokenized text; train length-filtered (--max-len,
                                                  default data.max_len = 250); valid/test complete:
                                                  the scoring references
  $DATA_DIR/PAIR/bpe/                            codes + vocab (or spm.model) + BPE'd text
  $DATA_BIN/PAIR/                                fairseq-preprocess --joined-dictionary output, the
                                                  BPE codes/vocab, and stats.json
Idempotent and resumable: each stage is built in a temporary folder, renamed into place when
complete, and skipped next time when its settings are unchanged (--force redoes all stages).
Exit status: 0 ok, 2 a usage error, 1 a failure.
"""
import hashlib
import os
import shutil
import subprocess
import sys

from . import processes, recipes
from .cli import Parser, UsageError, UserError, log, one_pair, prog
from .cli import main as run_main
from .data.common import FAIRSEQ_SPLIT
from .files import atomic_dir, file_digest, locked
from .names import PAIR
from .paths import folders

TAG = "prepare"


def settings(pair, src_dir, tokenized, bpe, merges, max_len):
    """(src, tgt, tokenized, bpe, merges, max_len): the options, else the pair's data: settings."""
    if pair in recipes.available_pairs():
        cfg = recipes.load(pair)
        src, tgt = cfg.src, cfg.tgt
        data = cfg.data
    else:
        if not src_dir:
            raise UsageError(f"unknown pair {pair!r} (no configs/{pair}.yaml): for your own corpus pass --src-dir DIR")
        m = PAIR.fullmatch(pair)
        if not m:
            raise UsageError(f"--pair must look like xx-yy (source-target language codes), got {pair!r}")
        if tokenized is None:
            raise UsageError(f"pair {pair!r} has no config: say whether DIR holds Moses-tokenized text (--tokenized) "
                             "or raw text (--raw)")
        src, tgt = m.groups()
        data = recipes.base().data
    tokenized = data.tokenized if tokenized is None else tokenized
    bpe = bpe or data.bpe.value
    if bpe not in ("fastbpe", "sentencepiece"):
        raise UsageError(f"--bpe must be fastbpe or sentencepiece, got {bpe!r}")
    for flag, value in (("--merges", merges), ("--max-len", max_len)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be a positive integer, got {value}")
    return src, tgt, tokenized, bpe, merges or data.bpe_merges, max_len or data.max_len


def fastbpe(tok, out, src, tgt, merges, work_log):
    """Joint BPE learned with fastBPE's command-line tool on train (both sides), applied to every split."""
    fast = shutil.which("fast")
    if not fast:
        raise UserError("fastBPE's 'fast' binary is not on PATH: run bash scripts/install.sh")
    log(TAG, f"learning {merges} joint BPE merges with fastBPE")
    proc = subprocess.run([fast, "learnbpe", str(merges), f"{tok}/train.{src}", f"{tok}/train.{tgt}"],
                          capture_output=True, text=True)
    if proc.returncode:
        raise UserError(f"fastBPE learnbpe failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    learned = proc.stdout
    # When the corpus allows fewer merges than asked, learnbpe repeats its last pair and applybpe
    # then aborts on the duplicate: keep each pair's first occurrence.
    seen, codes = set(), []
    for line in learned.splitlines():
        pair = tuple(line.split()[:2])
        if pair not in seen:
            seen.add(pair)
            codes.append(line)
    with open(f"{out}/codes", "w", encoding="utf-8") as f:
        f.write("".join(c + "\n" for c in codes))
    log(TAG, f"{len(codes)} merges learned")
    for split in FAIRSEQ_SPLIT.values():
        for lang in (src, tgt):
            processes.run_logged([fast, "applybpe", f"{out}/{split}.{lang}", f"{tok}/{split}.{lang}", f"{out}/codes"],
                                 work_log, f"fastBPE applybpe on {tok}/{split}.{lang}")
    with open(f"{out}/vocab", "w", encoding="utf-8") as f:
        if subprocess.run([fast, "getvocab", f"{out}/train.{src}", f"{out}/train.{tgt}"], stdout=f,
                          stderr=subprocess.DEVNULL).returncode:
            raise UserError("fastBPE getvocab failed")
    os.remove(work_log)


def prepare(pair, src_dir=None, tokenized=None, bpe=None, merges=None, max_len=None, force=False, where=None):
    """Tokenized text, BPE and binarized data of PAIR, each stage skipped when done with the same settings."""
    from .data.spm import NORMALIZATION, spm_encode_dir
    from .data.stats import write_stats
    from .data.tokenize import tokenize_dir

    where = where or folders()
    src, tgt, tokenized, bpe, merges, max_len = settings(pair, src_dir, tokenized, bpe, merges, max_len)
    work = os.path.join(where.data, pair)
    if "," in work:
        raise UsageError(f"the data folder {work} holds a comma, which fairseq-preprocess reads as a list of files: "
                         "set DATA_DIR to a path without one")
    if src_dir:
        if not os.path.isdir(src_dir):
            raise UsageError(f"--src-dir {src_dir} is not a folder")
        in_dir = os.path.abspath(src_dir)
    else:
        in_dir = os.path.join(where.data, pair, "raw")
        if not processes.is_done(in_dir):
            raise UserError(f"no downloaded data for {pair} in {in_dir}: run bash scripts/download.sh --pair {pair} "
                            "first (or pass --src-dir DIR)")
    out = os.path.join(where.data_bin, pair)
    tok, bpe_dir = os.path.join(work, "tok"), os.path.join(work, "bpe")
    os.makedirs(work, exist_ok=True)
    # two prepares of one pair at once would replace each other's stages
    with locked(work, lambda: log(TAG, f"waiting for another prepare of {pair} ({work}) to finish")):
        raw_flag = "--tokenized" if tokenized else "--raw"
        # the input's content, not only its folder: a corpus replaced in place is prepared again
        inputs = [os.path.join(in_dir, f"{split}.{lang}") for split in FAIRSEQ_SPLIT for lang in (src, tgt)]
        content = hashlib.sha256("".join(file_digest(p) if os.path.isfile(p) else "-" for p in inputs).encode()).hexdigest()
        key_tok = f"input={in_dir} {raw_flag} max_len={max_len} content={content}"
        key_bpe = f"{key_tok} bpe={bpe} size={merges}" + (f" normalization={NORMALIZATION}" if bpe == "sentencepiece" else "")

        def up_to_date(folder, key):
            return not force and processes.is_done(folder, key)

        # 1. tokenize (raw input only), check alignment, filter train by length
        if up_to_date(tok, key_tok):
            log(TAG, f"tokenized text up to date: {tok}")
        else:
            log(TAG, f"tokenizing {in_dir} ({raw_flag}, train length filter {max_len} tokens)")
            counts = tokenize_dir(in_dir, tok, src, tgt, not tokenized, max_len)  # checks the input, then replaces tok
            for stale in (bpe_dir, out):  # built from the text just replaced; a bad input left them as they were
                shutil.rmtree(stale, ignore_errors=True)
            log(TAG, "lines: " + ", ".join(f"{k} {v['kept']}/{v['input']}" for k, v in counts.items()))
            processes.mark_done(tok, key_tok)

        # 2. joint BPE learned on train (both sides), applied to every split
        if up_to_date(bpe_dir, key_bpe):
            log(TAG, f"BPE up to date: {bpe_dir}")
        else:
            with atomic_dir(bpe_dir) as tmp:
                if bpe == "fastbpe":
                    fastbpe(tok, tmp, src, tgt, merges, os.path.join(work, "applybpe.log"))
                else:
                    log(TAG, f"training a joint SentencePiece BPE model (vocabulary {merges})")
                    spm_encode_dir(tok, tmp, src, tgt, merges)
                processes.mark_done(tmp, key_bpe)
            shutil.rmtree(out, ignore_errors=True)  # binarized from the BPE just replaced

        # 3. binarize with a joined dictionary, then stats.json
        if up_to_date(out, key_bpe):
            log(TAG, f"binarized data up to date: {out}")
            return out
        with atomic_dir(out) as tmp:
            log(TAG, "binarizing with fairseq-preprocess --joined-dictionary")
            workers = min(os.cpu_count() or 1, 8)
            processes.run_logged(
                ["fairseq-preprocess", "--source-lang", src, "--target-lang", tgt, "--trainpref", f"{bpe_dir}/train",
                 "--validpref", f"{bpe_dir}/valid", "--testpref", f"{bpe_dir}/test", "--destdir", tmp,
                 "--joined-dictionary", "--workers", str(workers)], os.path.join(work, "preprocess.log"),
                "fairseq-preprocess")
            for name in (("codes", "vocab") if bpe == "fastbpe" else ("spm.model", "spm.vocab")):
                shutil.copy(os.path.join(bpe_dir, name), tmp)
            st = write_stats(tmp, tok, bpe_dir, src, tgt, pair, bpe, merges)
            log(TAG, f"stats: L(97.5%) = {st['length_p97.5']}, target vocab {st['target_vocab_size']} types")
            processes.mark_done(tmp, key_bpe)
        log(TAG, f"{pair}: done -> {out}")
        return out


def parser():
    p = Parser(prog=prog("qknorm_pipeline.prepare"), tag=TAG, description=__doc__)
    p.add_argument("pair_arg", nargs="?", metavar="PAIR")
    p.add_argument("--pair", help="the pair (or give it as the first argument)")
    p.add_argument("--src-dir", help="folder with {train,dev,test}.{xx,yy} (default: $DATA_DIR/PAIR/raw)")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--tokenized", dest="tokenized", action="store_const", const=True,
                      help="the text is already Moses-tokenized")
    form.add_argument("--raw", dest="tokenized", action="store_const", const=False, help="tokenize with sacremoses")
    p.add_argument("--bpe", help="fastbpe or sentencepiece (default: the config's data.bpe)")
    p.add_argument("--merges", type=int, help="BPE merges (SentencePiece: vocabulary size); default data.bpe_merges")
    p.add_argument("--max-len", type=int, help="train length filter in tokens (default data.max_len)")
    p.add_argument("--force", action="store_true", help="redo every stage")
    return p


def run(a):
    prepare(one_pair(a), a.src_dir, a.tokenized, a.bpe, a.merges, a.max_len, a.force)


def main(argv=None):
    return run_main(run, parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
