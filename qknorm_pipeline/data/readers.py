"""Readers of the TED and IWSLT layouts, with the rules of the original TED reader
(neulab/word-embeddings-for-nmt, ted_reader.py): a pair is kept when neither side is empty and
neither contains "NULL" (the marker of a missing translation, written __NULL__ or _ _ NULL _ _).
Lines are cut at "\\n" only (qknorm_pipeline/files.py split_lines)."""
import gzip
import io
import os
import tarfile

from ..files import split_lines
from .common import SPLITS, DataError, log

NULL_MARKER = "NULL"


def complete(text):
    """The TED reader's test for a usable sentence. One difference: a side of spaces only counts
    as empty here (the original keeps such a target; it would be an empty sentence)."""
    return bool(text) and bool(text.strip()) and NULL_MARKER not in text


def read_ted_tsv(text, src, tgt):
    """Pairs from one all_talks_<split>.tsv (tab-separated, no quoting; header: talk_name and
    language codes). Adds no language tag (the original reader's target_token is for
    multilingual training)."""
    lines = split_lines(text)
    header = lines[0].split("\t") if lines else []
    missing = [lang for lang in (src, tgt) if lang not in header]
    if missing:
        raise DataError(f"TED tsv has no column for {', '.join(missing)} (columns: "
                        f"{', '.join(header[:10])}...): check the pair name")
    i, j = header.index(src), header.index(tgt)
    pairs = []
    for line in lines[1:]:
        fields = line.split("\t")
        a, b = (fields[k] if k < len(fields) else "" for k in (i, j))
        if complete(a) and complete(b):
            pairs.append((a.strip(), b.strip()))
    return pairs


def read_parquet(path):
    import pyarrow.parquet as pq

    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(-4, os.SEEK_END)
        tail = f.read(4)
    if head != b"PAR1" or tail != b"PAR1":
        raise DataError(f"{path} is not a complete parquet file (truncated or not parquet); delete it and retry")
    try:
        return pq.read_table(path)
    except Exception as e:
        raise DataError(f"{path}: unreadable parquet ({e}); delete it and retry") from None


def read_ted_multi_parquet(paths, src, tgt):
    """Pairs from neulab/ted_multi rows, translations{language[], translation[]}: its loader
    already left out translations marked __NULL__ / _ _ NULL _ _; complete() applies the rest."""
    pairs = []
    for path in paths:
        table = read_parquet(path)
        if "translations" not in table.column_names:
            raise DataError(f"{path}: no 'translations' column (columns {table.column_names}): "
                            "not the neulab/ted_multi schema")
        for row in table.column("translations").to_pylist():
            d = dict(zip(row["language"], row["translation"]))
            if complete(d.get(src)) and complete(d.get(tgt)):
                pairs.append((d[src].strip(), d[tgt].strip()))
    return pairs


def drop_empty(pairs, what):
    """The Qi et al. files as converted by Hugging Face end every split with one empty pair (its
    loader cut the files at "\\n" and kept what follows the final newline): pairs with an empty
    side are dropped before any count check."""
    kept = [(a.strip(), b.strip()) for a, b in pairs if a.strip() and b.strip()]
    if len(kept) < len(pairs):
        log(f"{what}: dropped {len(pairs) - len(kept)} pair(s) with an empty side")
    return kept


def read_hrlr_parquet(path, src, tgt):
    """Pairs from neulab/ted_hrlr parquet: a struct column translation{src, tgt}."""
    table = read_parquet(path)
    if "translation" not in table.column_names:
        raise DataError(f"{path}: no 'translation' column: not the neulab/ted_hrlr schema")
    rows = table.column("translation").to_pylist()
    if rows and not (src in rows[0] and tgt in rows[0]):
        raise DataError(f"{path}: translation has fields {sorted(rows[0])}, not {src} and {tgt}")
    return drop_empty([(r[src] or "", r[tgt] or "") for r in rows], path)


def _open_tar(path):
    try:
        tar = tarfile.open(path, "r:gz")
        members = {m.name.lstrip("./"): m for m in tar.getmembers()}
        return tar, members
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: truncated or corrupt .tar.gz ({e}); delete it and retry") from None


def _member_text(tar, members, name, path):
    if name not in members:
        raise DataError(f"{path} has no {name} (members: {', '.join(sorted(members)[:8])}...)")
    try:
        data = tar.extractfile(members[name]).read()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataError(f"{path}: truncated or corrupt .tar.gz while reading {name} ({e})") from None
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline="").read()


def read_ted_tar(path, src, tgt):
    tar, members = _open_tar(path)
    with tar:
        return {s: read_ted_tsv(_member_text(tar, members, f"all_talks_{s}.tsv", path), src, tgt) for s in SPLITS}


def read_hrlr_tar(path, src, tgt):
    tar, members = _open_tar(path)
    out = {}
    with tar:
        for s in SPLITS:
            a = split_lines(_member_text(tar, members, f"datasets/{src}_to_{tgt}/{src}.{s}", path))
            b = split_lines(_member_text(tar, members, f"datasets/{src}_to_{tgt}/{tgt}.{s}", path))
            check_aligned(len(a), len(b), f"{path}:{s}")
            out[s] = drop_empty(list(zip(a, b)), f"{path}:{s}")
    return out


def check_aligned(n_src, n_tgt, what):
    if n_src != n_tgt:
        raise DataError(f"{what}: misaligned source/target line counts ({n_src} vs {n_tgt}); the two "
                        "sides must hold one sentence per line, in the same order")
