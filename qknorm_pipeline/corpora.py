"""Command line of the corpus tools (qknorm_pipeline/data/), called by scripts/download.sh and
scripts/prepare.sh:
    python -m qknorm_pipeline.corpora download --pair PAIR --out DIR --cache DIR [--source NAME]
    python -m qknorm_pipeline.corpora tokenize --in-dir D --out-dir O --src S --tgt T
                                              (--tokenized | --raw) [--max-len 250]
    python -m qknorm_pipeline.corpora spm --bpe-dir B --tok-dir T --src S --tgt T --vocab-size N
    python -m qknorm_pipeline.corpora stats --data-bin D --tok-dir T --bpe-dir B --src S --tgt T ...
    python -m qknorm_pipeline.corpora config --pair PAIR

Every file is written under a temporary name and renamed only once it is complete and verified,
so a later stage never mistakes a half-written file for a finished one. Where the data comes
from, and the environment variables that move it: qknorm_pipeline/data/sources.py.
"""
import shlex
import sys

from . import recipes
from .data.common import SPLITS, DataError, log
from .cli import Parser, fail


def shell_config(pair):
    """src, tgt and the data: settings of PAIR's recipe as `name=value` shell lines; for a pair
    without a config (a user's own corpus) `known=0` and the base recipe's data: settings."""
    if pair in recipes.available_pairs():
        cfg = recipes.load(pair)
        vals = {"known": 1, "src": cfg["src"], "tgt": cfg["tgt"]}
    else:
        cfg = recipes.base_recipe()
        vals = {"known": 0}
    d = cfg.get("data") or {}
    vals.update({"source": d.get("source"), "tokenized": str(bool(d.get("tokenized"))).lower(),
                 "max_len": d["max_len"], "bpe": d["bpe"], "bpe_merges": d["bpe_merges"]})
    if vals["known"]:
        exp = d.get("expected_lines") or {}
        vals.update({f"expected_{s}": exp.get(s) or "" for s in SPLITS})
    else:
        del vals["source"], vals["tokenized"]
    return "\n".join(f"{k}={shlex.quote(str(v))}" for k, v in vals.items())


def main(argv=None):
    p = Parser(prog="python -m qknorm_pipeline.corpora", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download", help="fetch, verify and extract a pair's train/dev/test")
    d.add_argument("--pair", required=True)
    d.add_argument("--out", required=True, help="folder for {train,dev,test}.{src,tgt}")
    d.add_argument("--cache", required=True, help="folder for downloaded archives")
    d.add_argument("--source", help="use only this source (default: try each in order)")
    t = sub.add_parser("tokenize", help="alignment check, tokenization, train length filter")
    t.add_argument("--in-dir", required=True)
    t.add_argument("--out-dir", required=True)
    t.add_argument("--src", required=True)
    t.add_argument("--tgt", required=True)
    g = t.add_mutually_exclusive_group(required=True)
    g.add_argument("--tokenized", action="store_true", help="input is already Moses-tokenized")
    g.add_argument("--raw", action="store_true", help="tokenize with sacremoses")
    t.add_argument("--max-len", type=int, default=250)
    s = sub.add_parser("spm", help="SentencePiece BPE instead of fastBPE")
    for a in ("--tok-dir", "--bpe-dir", "--src", "--tgt"):
        s.add_argument(a, required=True)
    s.add_argument("--vocab-size", type=int, required=True)
    st = sub.add_parser("stats", help="write DATA_BIN/stats.json")
    for a in ("--data-bin", "--tok-dir", "--bpe-dir", "--src", "--tgt", "--pair", "--bpe"):
        st.add_argument(a, required=True)
    st.add_argument("--bpe-size", type=int, required=True)
    c = sub.add_parser("config", help="print a pair's data settings as shell assignments")
    c.add_argument("--pair", required=True)
    a = p.parse_args(argv)
    try:
        if a.cmd == "config":
            print(shell_config(a.pair))
        elif a.cmd == "download":
            from .data.download import download

            download(a.pair, a.out, a.cache, a.source)
        elif a.cmd == "tokenize":
            from .data.tokenize import tokenize_dir

            counts = tokenize_dir(a.in_dir, a.out_dir, a.src, a.tgt, a.raw, a.max_len)
            log("lines: " + ", ".join(f"{k} {v['kept']}/{v['input']}" for k, v in counts.items()))
        elif a.cmd == "spm":
            from .data.spm import spm_encode_dir

            spm_encode_dir(a.tok_dir, a.bpe_dir, a.src, a.tgt, a.vocab_size)
        elif a.cmd == "stats":
            from .data.stats import write_stats

            st = write_stats(a.data_bin, a.tok_dir, a.bpe_dir, a.src, a.tgt, a.pair, a.bpe, a.bpe_size)
            log(f"stats: L(97.5%) = {st['length_p97.5']}, target vocab {st['target_vocab_size']} types")
    except DataError as e:
        return fail(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
