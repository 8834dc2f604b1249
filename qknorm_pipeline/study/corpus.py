"""The study's corpus in $DATA_DIR/NAME/PAIR/raw/: downloaded once (corpus: source:), or copied from
a folder (corpus: dir:, or --source-dir), and checked at every call against the config's line counts
and sha256, so that every run of a study, on any machine and in any clone, trains on the same bytes."""
import os
import shutil
from types import SimpleNamespace

from .. import processes
from ..cli import log
from ..data.common import SPLITS
from ..files import atomic_dir, count_lines, file_digest
from ..paths import ROOT, short
from .config import StudyError, corpus_files

TAG = "study"


def check(cfg, folder, origin):
    """Every file of the corpus in FOLDER, with the config's line counts and sha256; ORIGIN says where
    FOLDER came from, for the messages."""
    c = cfg.corpus
    for name in corpus_files(cfg):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise StudyError(f"{origin}: no {name}: the study's corpus needs {' '.join(corpus_files(cfg))}")
        split = name.split(".")[0]
        want, got = c.expected_lines.get(split), count_lines(path)
        if want is not None and got != want:
            raise StudyError(f"{origin}: {name} has {got} lines where {cfg.config} expects {want} "
                             f"(corpus: expected_lines): not the study's corpus")
        want, got = c.sha256.get(name), file_digest(path, "sha256")
        if want and got != want:
            raise StudyError(f"{origin}: {name} is not the corpus of the study's records (sha256 {got[:16]}..., "
                             f"{cfg.config} corpus: sha256: {want[:16]}...): runs on it would not compare with the "
                             "recorded ones; give --source-dir the corpus they used, or copy the config under a new "
                             "name: without sha256 for a study of this corpus")


def copy_from(cfg, source_dir, out, origin):
    check(cfg, source_dir, origin)
    with atomic_dir(out) as tmp:
        for name in corpus_files(cfg):
            shutil.copyfile(os.path.join(source_dir, name), os.path.join(tmp, name))
    processes.mark_done(out)


def download(cfg, where):
    from ..data import sources
    from ..download import download as fetch_pair

    src, tgt = cfg.pair.split("-")
    every = [name for name, _, _ in sources.sources_for(cfg.corpus.source, src, tgt)]
    data = SimpleNamespace(source=cfg.corpus.source, expected_lines=dict(cfg.corpus.expected_lines), exact_sources=every)
    fetch_pair(cfg.pair, where=where, data=data)


def ensure(cfg, where, source_dir=None):
    """$DATA_DIR/NAME/PAIR/raw with the study's corpus, checked: from SOURCE_DIR when given (copied
    again), else as it is once there, else from corpus: dir: or the corpus: source: download."""
    out = os.path.join(where.data, cfg.pair, "raw")
    if source_dir or (cfg.corpus.dir and not processes.is_done(out)):
        given = source_dir or cfg.corpus.dir
        origin = f"--source-dir {given}" if source_dir else f"{cfg.config}: corpus: dir: {given}"
        folder = given if os.path.isabs(given) else os.path.join(ROOT, given)
        if not os.path.isdir(folder):
            raise StudyError(f"{origin} is not a folder")
        copy_from(cfg, folder, out, origin)
        log(TAG, f"corpus: copied from {short(folder)} to {short(out)}")
    elif not processes.is_done(out):
        log(TAG, f"corpus: downloading {cfg.pair} from the {cfg.corpus.source} sources into {short(out)}")
        download(cfg, where)
    check(cfg, out, short(out))
    return out


def describe(cfg):
    """The corpus as the report names it."""
    c = cfg.corpus
    lines = " / ".join(f"{c.expected_lines[s]:,}" for s in SPLITS if s in c.expected_lines)
    where = f"the {c.source} download" if c.source else c.dir
    return f"{cfg.pair}, {where}" + (f", {lines} train / dev / test lines" if lines else "")
