"""download.sh's work: try each source of a pair in turn until one passes every check, then write
data/PAIR/raw/{train,dev,test}.{src,tgt} and SOURCE.json."""
import hashlib
import json
import os

from .. import recipes
from ..cli import UsageError
from ..files import atomic_dir, read_lines, write_lines
from ..names import PAIR
from . import readers, sources
from .common import SPLITS, DataError, NotFound, log
from .fetch import fetch


def _cache_name(url):
    return hashlib.md5(url.encode()).hexdigest()[:10] + "-" + url.rstrip("/").rsplit("/", 1)[-1]


def _get(url, cache):
    return fetch(url, os.path.join(cache, _cache_name(url)), expect=sources.published(url))


def _discard_on_error(read, path, *args):
    """read(path, ...); a file that fails to read is deleted so that the next run fetches it anew."""
    try:
        return read(path, *args)
    except DataError:
        for p in path if isinstance(path, list) else [path]:
            if os.path.exists(p):
                os.remove(p)
        raise


def _parquet_shards(folder, cache):
    """Hugging Face's parquet conversion names shards 0000.parquet, 0001.parquet, ..."""
    paths = []
    while True:
        try:
            paths.append(_get(f"{folder}/{len(paths):04d}.parquet", cache))
        except NotFound:
            if not paths:
                raise
            return paths


def fetch_source(kind, urls, cache, src, tgt):
    if kind in ("ted_tsv_tar", "hrlr_tar"):
        read = readers.read_ted_tar if kind == "ted_tsv_tar" else readers.read_hrlr_tar
        return _discard_on_error(read, _get(urls[0], cache), src, tgt)
    if kind == "hrlr_parquet":
        return {s: _discard_on_error(readers.read_hrlr_parquet, _get(u, cache), src, tgt) for s, u in urls.items()}
    if kind == "ted_multi_parquet":
        return {s: _discard_on_error(readers.read_ted_multi_parquet, _parquet_shards(folder, cache), src, tgt)
                for s, folder in urls.items()}
    if kind == "iwslt_text":  # used line for line: the files are verified byte for byte
        out = {}
        for s in SPLITS:
            a, b = (read_lines(_get(urls[(s, lang)], cache)) for lang in (src, tgt))
            readers.check_aligned(len(a), len(b), f"{urls[(s, src)]} / {urls[(s, tgt)]}")
            out[s] = list(zip(a, b))
        return out
    raise AssertionError(kind)


def check_counts(data, expected, strict, what):
    got = {s: len(data[s]) for s in SPLITS}
    known = {s: n for s, n in (expected or {}).items() if n is not None}
    bad = {s: (got[s], n) for s, n in known.items() if got[s] != n}
    if bad:
        msg = ", ".join(f"{s}: {g} lines, expected {n}" for s, (g, n) in bad.items())
        if strict:
            raise DataError(f"{what}: line counts differ from the expected split ({msg}); the "
                            "source changed or the download is incomplete: delete it and retry")
        log(f"NOTE {what}: line counts differ from the papers' split ({msg}); this source is not "
            "documented to reproduce it exactly (see data/README.md)")
    return got


def write_split_files(data, out, src, tgt, meta):
    """OUT/{train,dev,test}.{src,tgt} + SOURCE.json, all or nothing."""
    with atomic_dir(out) as tmp:
        for s in SPLITS:
            for i, lang in enumerate((src, tgt)):
                write_lines(os.path.join(tmp, f"{s}.{lang}"), [pair[i].replace("\n", " ") for pair in data[s]])
        with open(os.path.join(tmp, "SOURCE.json"), "w") as f:
            json.dump(meta, f, indent=2)


def candidates(pair, source=None, data=None):
    """PAIR's recipe and the (name, kind, urls) of each source download() tries for it (only
    SOURCE's, when given)."""
    known = [p for p in recipes.available_pairs() if p != "demo"]
    if pair not in recipes.available_pairs():
        own = pair if PAIR.fullmatch(pair) else "SRC-TGT"  # a name prepare.sh would take
        raise UsageError(f"unknown pair {pair!r}: downloadable pairs are {', '.join(known)}; for your own "
                        f"corpus run: bash scripts/prepare.sh --pair {own} --src-dir DIR")
    cfg = recipes.load(pair)
    found = sources.sources_for((data or cfg.data).source, cfg.src, cfg.tgt)
    if source:
        names = [c[0] for c in found]
        if source not in names:
            raise UsageError(f"unknown source {source!r} for {pair}: choose one of {', '.join(names)}")
        found = [c for c in found if c[0] == source]
    return cfg, found


def download(pair, out, cache, source=None, data=None):
    cfg, tried = candidates(pair, source, data)
    data_cfg = data or cfg.data
    src, tgt = cfg.src, cfg.tgt
    exact = set(data_cfg.exact_sources)
    failures = []
    for name, kind, urls in tried:
        log(f"{pair}: trying source {name}")
        try:
            data = fetch_source(kind, urls, cache, src, tgt)
            for s in SPLITS:
                if not data[s]:
                    raise DataError(f"{name}: the {s} split is empty for {src}-{tgt}")
            counts = check_counts(data, data_cfg.expected_lines, name in exact, f"{pair} from {name}")
        except DataError as e:
            log(f"source {name} failed: {e}")
            failures.append(f"{name}: {e}")
            continue
        meta = {"pair": pair, "source": name, "urls": urls if isinstance(urls, list) else
                {k if isinstance(k, str) else ".".join(k): v for k, v in urls.items()},
                "lines": counts, "exact_split": name in exact}
        write_split_files(data, out, src, tgt, meta)
        log(f"{pair}: wrote {out} from {name}: " + " / ".join(f"{counts[s]} {s}" for s in SPLITS))
        return meta
    raise DataError(f"could not obtain {pair}; every source failed: " + "; ".join(failures))
