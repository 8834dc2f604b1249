"""Downloads, verifies and extracts one pair's train/dev/test into $DATA_DIR/PAIR/raw/.

usage: bash scripts/download.sh [--pair] PAIR [--source NAME] [--force]
       (python -m qknorm_pipeline.download takes the same arguments)

PAIR: gl-en sk-en ar-en en-he en-vi (from configs/), or demo (generated offline, seeded).
Sources are tried in order until one passes every check (no HTML page, complete archive,
published size + sha256 (+ md5) where known, aligned sides, expected line counts where the source
reproduces the papers' split); each failure is reported. See data/README.md for the URLs and
qknorm_pipeline/data/sources.py for the environment variables that point them at mirrors.
Transfers retry network errors, resume an interrupted file over HTTP Range and show progress.
Idempotent: a finished pair (raw/.done) is skipped; archives are cached in $DATA_DIR/downloads/
and reused, and are only ever stored complete and verified.
Exit status: 0 ok, 2 a usage error, 1 a failure.
"""
import os
import sys

from . import processes, recipes
from .cli import Parser, UsageError, log, one_pair, prog
from .cli import main as run_main
from .data import demo
from .files import atomic_dir
from .paths import folders

TAG = "download"


def download(pair, source=None, force=False, where=None, data=None):
    """$DATA_DIR/PAIR/raw/{train,dev,test}.{src,tgt}, unless already there. DATA: the data settings
    (source, expected_lines, exact_sources) instead of the pair config's (a study's corpus)."""
    where = where or folders()
    out = os.path.join(where.data, pair, "raw")
    if source:  # a source the pair does not have is refused, downloaded or not
        from .data.download import candidates

        if pair == "demo":
            raise UsageError(f"--source {source}: the demo is generated here, from no source")
        candidates(pair, source, data)
    if not force and processes.is_done(out):
        log(TAG, f"{pair}: already downloaded ({out}); --force to fetch again")
        return out
    if pair == "demo":
        lines = recipes.load("demo").data.expected_lines
        with atomic_dir(out) as tmp:
            demo.write(tmp, 1, lines.get("train") or 4000, lines.get("dev") or 300, lines.get("test") or 300)
    else:
        from .data.download import download as fetch_pair

        # writes OUT whole or not at all: a failed --force keeps the finished download
        fetch_pair(pair, out, os.path.join(where.data, "downloads"), source, data)
    processes.mark_done(out)
    log(TAG, f"{pair}: done -> {out}")
    return out


def parser():
    p = Parser(prog=prog("qknorm_pipeline.download"), tag=TAG, description=__doc__)
    p.add_argument("pair_arg", nargs="?", metavar="PAIR")
    p.add_argument("--pair", help="the pair (or give it as the first argument)")
    p.add_argument("--source", help="use only this source (default: try each in order)")
    p.add_argument("--force", action="store_true", help="fetch again even when the pair is downloaded")
    return p


def run(a):
    download(one_pair(a), a.source, a.force)


def main(argv=None):
    return run_main(run, parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
