"""Corpus download, verification, extraction and preparation helpers for the bash pipelines.

Command lines (called by scripts/download.sh and scripts/prepare.sh):
    python -m qknorm_fairseq.corpora download --pair PAIR --out DIR [--cache DIR] [--source NAME]
    python -m qknorm_fairseq.corpora tokenize --in-dir D --out-dir O --src S --tgt T
                                              (--tokenized | --raw) [--max-len 250]
    python -m qknorm_fairseq.corpora spm --bpe-dir B --tok-dir T --src S --tgt T --vocab-size N
    python -m qknorm_fairseq.corpora stats --data-bin D --tok-dir T --bpe-dir B --src S --tgt T ...

Every file is written under a temporary name and renamed only once it is complete and verified,
so a later stage never mistakes a half-written file for a finished one.

Where the data comes from (base URLs overridable by environment variables, for mirrors and
for the tests' fixtures):
    QKNORM_PHONTRON_BASE  http://phontron.com/data                        (original archives)
    QKNORM_HF_BASE        https://huggingface.co/datasets                  (parquet conversions)
    QKNORM_WAYBACK_BASE   https://web.archive.org/web/2020id_/http://phontron.com/data
    QKNORM_IWSLT15_BASE   https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi
"""
import argparse
import csv
import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request

from . import data_stats, recipes
from .cli import Parser

SPLITS = ("train", "dev", "test")
HF_SPLITS = {"train": "train", "dev": "validation", "test": "test"}
NULL_MARKERS = ("__NULL__", "_ _ NULL _ _")

DEFAULT_BASES = {
    "QKNORM_PHONTRON_BASE": "http://phontron.com/data",
    "QKNORM_HF_BASE": "https://huggingface.co/datasets",
    "QKNORM_WAYBACK_BASE": "https://web.archive.org/web/2020id_/http://phontron.com/data",
    "QKNORM_IWSLT15_BASE": "https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi",
}


class DataError(Exception):
    """Bad or unusable data: the message names the problem and the fix."""


def base(var):
    return os.environ.get(var, DEFAULT_BASES[var]).rstrip("/")


def log(msg):
    print(f"[corpora] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- sources


def sources_for(dataset, src, tgt):
    """Ordered list of (name, kind, urls) to try for a dataset. kind: ted_tsv_tar, hrlr_tar,
    hrlr_parquet, ted_multi_parquet, iwslt_text."""
    if dataset == "ted_hrlr":
        name = f"{src}_to_{tgt}"
        hf = f"{base('QKNORM_HF_BASE')}/neulab/ted_hrlr/resolve/refs%2Fconvert%2Fparquet/{name}"
        return [
            ("phontron-qi18naacl", "hrlr_tar", [f"{base('QKNORM_PHONTRON_BASE')}/qi18naacl-dataset.tar.gz"]),
            ("hf-ted_hrlr", "hrlr_parquet", {s: f"{hf}/{HF_SPLITS[s]}/0000.parquet" for s in SPLITS}),
            ("wayback-qi18naacl", "hrlr_tar", [f"{base('QKNORM_WAYBACK_BASE')}/qi18naacl-dataset.tar.gz"]),
        ]
    if dataset == "ted_multi":
        hf = f"{base('QKNORM_HF_BASE')}/neulab/ted_multi/resolve/refs%2Fconvert%2Fparquet/plain_text"
        return [
            ("phontron-ted_talks", "ted_tsv_tar", [f"{base('QKNORM_PHONTRON_BASE')}/ted_talks.tar.gz"]),
            ("hf-ted_multi", "ted_multi_parquet", {s: f"{hf}/{HF_SPLITS[s]}" for s in SPLITS}),
            ("wayback-ted_talks", "ted_tsv_tar", [f"{base('QKNORM_WAYBACK_BASE')}/ted_talks.tar.gz"]),
        ]
    if dataset == "iwslt15":
        b = base("QKNORM_IWSLT15_BASE")
        files = {"train": "train", "dev": "tst2012", "test": "tst2013"}
        return [("stanford-iwslt15", "iwslt_text",
                 {(s, lang): f"{b}/{files[s]}.{lang}" for s in SPLITS for lang in (src, tgt)})]
    raise DataError(f"unknown data source {dataset!r}: known sources are ted_hrlr, ted_multi, iwslt15 "
                    "(set data.source in the pair's config)")


# ---------------------------------------------------------------- fetching and verification


def looks_like_html(head):
    h = head[:1024].lstrip().lower()
    return h.startswith(b"<!doctype html") or h.startswith(b"<html") or b"<html" in h[:200]


def md5sum(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class NotFound(DataError):
    pass


def fetch(url, dest, md5=None, min_size=1):
    """Download URL to DEST (reused when DEST exists: it is only ever created complete and
    verified). Checks: status, HTML instead of data, announced size, min size, md5."""
    if os.path.exists(dest):
        log(f"reusing {dest}")
        return dest
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    part = f"{dest}.part.{os.getpid()}"
    log(f"fetching {url}")
    try:
        try:
            resp = urllib.request.urlopen(url, timeout=60)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise NotFound(f"{url}: not found (HTTP 404)") from None
            raise DataError(f"{url}: HTTP {e.code} {e.reason}") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, FileNotFoundError) or "No such file" in str(e.reason):
                raise NotFound(f"{url}: not found") from None
            raise DataError(f"{url}: cannot connect ({e.reason}); check the network or set a mirror "
                            "with the QKNORM_*_BASE variables") from None
        ctype = resp.headers.get("Content-Type", "") or ""
        announced = resp.headers.get("Content-Length")
        got, next_report = 0, 50 << 20
        with resp, open(part, "wb") as f:
            try:
                for block in iter(lambda: resp.read(1 << 20), b""):
                    f.write(block)
                    got += len(block)
                    if got >= next_report:
                        log(f"  {got >> 20} MiB")
                        next_report += 50 << 20
            except Exception as e:  # http.client.IncompleteRead, connection reset
                raise DataError(f"{url}: download interrupted after {got} bytes ({e}); run the "
                                "command again") from None
        if announced is not None and int(announced) != got:
            raise DataError(f"{url}: truncated download ({got} of {announced} bytes); run the command again")
        with open(part, "rb") as f:
            head = f.read(1024)
        if "text/html" in ctype.lower() or looks_like_html(head):
            raise DataError(f"{url}: received an HTML page instead of data (the URL is dead or "
                            "moved); another source is needed")
        if got < min_size:
            raise DataError(f"{url}: received {got} bytes, expected at least {min_size}")
        if md5 and md5sum(part) != md5:
            raise DataError(f"{url}: md5 mismatch (got {md5sum(part)}, expected {md5}): the file is "
                            "corrupt or changed upstream; delete it and retry, or check the source")
        os.replace(part, dest)
        return dest
    finally:
        if os.path.exists(part):
            os.remove(part)


def _cache_name(url):
    tail = url.rstrip("/").split("/")
    return hashlib.md5(url.encode()).hexdigest()[:10] + "-" + tail[-1]


# ---------------------------------------------------------------- readers (TED reader semantics)


def complete(text):
    """The TED reader's test for a usable translation: present, non-empty, no NULL marker."""
    return bool(text) and bool(text.strip()) and not any(m in text for m in NULL_MARKERS)


def read_ted_tsv(lines, src, tgt):
    """Pairs from one all_talks_<split>.tsv (header: talk_name and language codes). Keeps rows
    where both sides are complete; adds no language tag."""
    reader = csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    missing = [lang for lang in (src, tgt) if lang not in (reader.fieldnames or [])]
    if missing:
        raise DataError(f"TED tsv has no column for {', '.join(missing)} (columns: "
                        f"{', '.join((reader.fieldnames or [])[:10])}...): check the pair name")
    return [(r[src].strip(), r[tgt].strip()) for r in reader if complete(r.get(src)) and complete(r.get(tgt))]


def _read_parquet(path):
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
    """Pairs from neulab/ted_multi parquet rows: translations{language[], translation[]} per talk
    sentence. Incomplete translations are dropped as the TED reader did."""
    pairs = []
    for path in paths:
        table = _read_parquet(path)
        if "translations" not in table.column_names:
            raise DataError(f"{path}: no 'translations' column (columns {table.column_names}): "
                            "not the neulab/ted_multi schema")
        for row in table.column("translations").to_pylist():
            d = dict(zip(row["language"], row["translation"]))
            if complete(d.get(src)) and complete(d.get(tgt)):
                pairs.append((d[src].strip(), d[tgt].strip()))
    return pairs


def read_hrlr_parquet(path, src, tgt):
    """Pairs from neulab/ted_hrlr parquet: a struct column translation{src, tgt}; every row kept
    (these are the papers' files, already cleaned)."""
    table = _read_parquet(path)
    if "translation" not in table.column_names:
        raise DataError(f"{path}: no 'translation' column: not the neulab/ted_hrlr schema")
    rows = table.column("translation").to_pylist()
    if rows and not (src in rows[0] and tgt in rows[0]):
        raise DataError(f"{path}: translation has fields {sorted(rows[0])}, not {src} and {tgt}")
    return [(r[src].strip(), r[tgt].strip()) for r in rows]


def _open_tar(path):
    try:
        tar = tarfile.open(path, "r:gz")
        members = {m.name.lstrip("./"): m for m in tar.getmembers()}
        return tar, members
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: truncated or corrupt .tar.gz ({e}); delete it and retry") from None


def _member_lines(tar, members, name, path):
    if name not in members:
        raise DataError(f"{path} has no {name} (members: {', '.join(sorted(members)[:8])}...)")
    try:
        data = tar.extractfile(members[name]).read()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataError(f"{path}: truncated or corrupt .tar.gz while reading {name} ({e})") from None
    return io.StringIO(data.decode("utf-8")).read().splitlines()


def read_ted_tar(path, src, tgt):
    tar, members = _open_tar(path)
    with tar:
        return {s: read_ted_tsv(_member_lines(tar, members, f"all_talks_{s}.tsv", path), src, tgt) for s in SPLITS}


def read_hrlr_tar(path, src, tgt):
    tar, members = _open_tar(path)
    out = {}
    with tar:
        for s in SPLITS:
            a = _member_lines(tar, members, f"datasets/{src}_to_{tgt}/{src}.{s}", path)
            b = _member_lines(tar, members, f"datasets/{src}_to_{tgt}/{tgt}.{s}", path)
            check_aligned(len(a), len(b), f"{path}:{s}")
            out[s] = list(zip(a, b))
    return out


def check_aligned(n_src, n_tgt, what):
    if n_src != n_tgt:
        raise DataError(f"{what}: misaligned source/target line counts ({n_src} vs {n_tgt}); the two "
                        "sides must hold one sentence per line, in the same order")


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


# ---------------------------------------------------------------- download


def _discard_on_error(read, path, *args):
    """read(path, ...); a file that fails to read is deleted so that the next run fetches it anew."""
    try:
        return read(path, *args)
    except DataError:
        paths = path if isinstance(path, list) else [path]
        for p in paths:
            if os.path.exists(p):
                os.remove(p)
        raise


def _fetch_source(kind, urls, cache, md5s, src, tgt):
    if kind in ("ted_tsv_tar", "hrlr_tar"):
        path = fetch(urls[0], os.path.join(cache, _cache_name(urls[0])))
        return _discard_on_error(read_ted_tar if kind == "ted_tsv_tar" else read_hrlr_tar, path, src, tgt)
    if kind == "hrlr_parquet":
        return {s: _discard_on_error(read_hrlr_parquet, fetch(u, os.path.join(cache, _cache_name(u))), src, tgt)
                for s, u in urls.items()}
    if kind == "ted_multi_parquet":
        out = {}
        for s, folder in urls.items():
            # HuggingFace's parquet conversion names shards 0000.parquet, 0001.parquet, ...
            paths = []
            while True:
                u = f"{folder}/{len(paths):04d}.parquet"
                try:
                    paths.append(fetch(u, os.path.join(cache, _cache_name(u))))
                except NotFound:
                    if not paths:
                        raise
                    break
            out[s] = _discard_on_error(read_ted_multi_parquet, paths, src, tgt)
        return out
    if kind == "iwslt_text":
        out = {}
        for s in SPLITS:
            sides = []
            for lang in (src, tgt):
                u = urls[(s, lang)]
                name = u.rsplit("/", 1)[-1]
                path = fetch(u, os.path.join(cache, _cache_name(u)), md5=md5s.get(name))
                with open(path, encoding="utf-8") as f:
                    sides.append(f.read().splitlines())
            check_aligned(len(sides[0]), len(sides[1]), f"{urls[(s, src)]} / {urls[(s, tgt)]}")
            out[s] = list(zip(*sides))
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
    """Writes OUT/{train,dev,test}.{src,tgt} + SOURCE.json atomically (temp folder, rename)."""
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out) + ".tmp.", dir=parent)
    try:
        for s in SPLITS:
            for i, lang in enumerate((src, tgt)):
                with open(os.path.join(tmp, f"{s}.{lang}"), "w", encoding="utf-8") as f:
                    for pair in data[s]:
                        f.write(pair[i].replace("\n", " ") + "\n")
        with open(os.path.join(tmp, "SOURCE.json"), "w") as f:
            json.dump(meta, f, indent=2)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)


def download(pair, out, cache, source=None):
    known = [p for p in recipes.available_pairs() if p != "demo"]
    if pair not in recipes.available_pairs():
        raise DataError(f"unknown pair {pair!r}: downloadable pairs are {', '.join(known)}; for your own "
                        f"corpus run: bash scripts/prepare.sh --pair {pair} --src-dir DIR")
    cfg = recipes.load(pair)
    data_cfg = cfg.get("data") or {}
    dataset = data_cfg.get("source")
    src, tgt = cfg["src"], cfg["tgt"]
    candidates = sources_for(dataset, src, tgt)
    if source:
        names = [c[0] for c in candidates]
        if source not in names:
            raise DataError(f"unknown source {source!r} for {pair}: choose one of {', '.join(names)}")
        candidates = [c for c in candidates if c[0] == source]
    exact = set(data_cfg.get("exact_sources") or [])
    failures = []
    for name, kind, urls in candidates:
        log(f"{pair}: trying source {name}")
        try:
            data = _fetch_source(kind, urls, cache, data_cfg.get("md5") or {}, src, tgt)
            for s in SPLITS:
                if not data[s]:
                    raise DataError(f"{name}: the {s} split is empty for {src}-{tgt}")
            counts = check_counts(data, data_cfg.get("expected_lines"), name in exact, f"{pair} from {name}")
        except DataError as e:
            log(f"source {name} failed: {e}")
            failures.append(f"{name}: {e}")
            continue
        meta = {"pair": pair, "source": name, "urls": urls if isinstance(urls, list) else
                {str(k if isinstance(k, str) else ".".join(k)): v for k, v in urls.items()},
                "lines": counts, "exact_split": name in exact}
        write_split_files(data, out, src, tgt, meta)
        log(f"{pair}: wrote {out} from {name}: " + " / ".join(f"{counts[s]} {s}" for s in SPLITS))
        return meta
    raise DataError(f"could not obtain {pair}; every source failed:\n  " + "\n  ".join(failures))


# ---------------------------------------------------------------- tokenization and length filter


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def tokenize_dir(in_dir, out_dir, src, tgt, raw, max_len, in_names=None):
    """IN_DIR/{train,dev,test}.{src,tgt} -> OUT_DIR/{train,valid,test}.{src,tgt}: alignment check,
    Moses tokenization of raw text (sacremoses, escape=False), length filter on train only."""
    in_names = in_names or {"train": "train", "valid": "dev", "test": "test"}
    texts = {}
    for split, name in in_names.items():
        sides = []
        for lang in (src, tgt):
            path = os.path.join(in_dir, f"{name}.{lang}")
            if not os.path.exists(path):
                raise DataError(f"missing {path}: --src-dir needs train, dev and test files for both "
                                f"languages ({name}.{src}, {name}.{tgt})")
            sides.append(read_lines(path))
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
                log(f"tokenizing {split}.{lang} ({len(texts[split][i])} lines)")
                texts[split][i] = [tok.tokenize(line, escape=False, return_str=True) for line in texts[split][i]]
    else:
        for split in texts:
            texts[split] = [[" ".join(line.split()) for line in side] for side in texts[split]]
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
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out_dir) + ".tmp.", dir=parent)
    try:
        for split, sides in texts.items():
            for lang, lines in zip((src, tgt), sides):
                with open(os.path.join(tmp, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                    f.writelines(line + "\n" for line in lines)
        with open(os.path.join(tmp, "counts.json"), "w") as f:
            json.dump({"max_len": max_len, "raw_input": raw, "lines": counts}, f, indent=2)
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
    return counts


# ---------------------------------------------------------------- SentencePiece alternative


def spm_encode_dir(tok_dir, bpe_dir, src, tgt, vocab_size):
    """Joint SentencePiece BPE model on train (both sides) -> BPE_DIR/{split}.{lang} as pieces
    and BPE_DIR/spm.model / spm.vocab. Writes into BPE_DIR, which the caller makes atomic."""
    import sentencepiece as spm

    os.makedirs(bpe_dir, exist_ok=True)
    train_files = [os.path.join(tok_dir, f"train.{lang}") for lang in (src, tgt)]
    prefix = os.path.join(bpe_dir, "spm")
    spm.SentencePieceTrainer.train(
        input=",".join(train_files), model_prefix=prefix, vocab_size=vocab_size, model_type="bpe",
        character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
        bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    for split in ("train", "valid", "test"):
        for lang in (src, tgt):
            lines = read_lines(os.path.join(tok_dir, f"{split}.{lang}"))
            with open(os.path.join(bpe_dir, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(" ".join(sp.encode(line, out_type=str)) + "\n" for line in lines)


# ---------------------------------------------------------------- stats


def _tokens(path):
    n = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            n += len(line.split())
    return n


def write_stats(data_bin, tok_dir, bpe_dir, src, tgt, pair, bpe, bpe_size, percentile=97.5):
    with open(os.path.join(tok_dir, "counts.json")) as f:
        tok_counts = json.load(f)
    lines, tokens = {}, {}
    for split in ("train", "valid", "test"):
        binarized = {lang: len(data_stats.read_sizes(data_stats.split_prefix(data_bin, split, src, tgt, lang)))
                     for lang in (src, tgt)}
        tok_lines = count_lines(os.path.join(tok_dir, f"{split}.{src}"))
        if set(binarized.values()) != {tok_lines}:
            raise DataError(f"{data_bin}: binarized {split} has {binarized} lines, tokenized text "
                            f"{tok_lines}: rerun scripts/prepare.sh with --force")
        lines[split] = {"input": tok_counts["lines"][split]["input"], "kept": tok_lines}
        tokens[split] = {lang: {"words": _tokens(os.path.join(tok_dir, f"{split}.{lang}")),
                                "subwords": _tokens(os.path.join(bpe_dir, f"{split}.{lang}"))}
                         for lang in (src, tgt)}
    tgt_types = set()
    with open(os.path.join(bpe_dir, f"train.{tgt}"), encoding="utf-8") as f:
        for line in f:
            tgt_types.update(line.split())
    with open(os.path.join(data_bin, f"dict.{src}.txt"), encoding="utf-8") as f:
        dict_size = sum(1 for _ in f)
    length = data_stats.length_percentile(data_bin, src, tgt, percentile, "train")
    stats = {
        "pair": pair, "src": src, "tgt": tgt, "bpe": bpe, "bpe_size": bpe_size,
        "remove_bpe": "sentencepiece" if bpe == "sentencepiece" else "@@ ",
        "max_len": tok_counts["max_len"], "raw_input": tok_counts["raw_input"],
        "lines": lines, "tokens": tokens,
        # counted in BPE tokens + EOS, over source and target sides of the binarized train split
        f"length_p{percentile:g}": length,
        "qknorm_g0": data_stats.g0_from_length(length) if length > 1 else None,
        "dict_size": dict_size,  # fairseq's dictionary: 4 specials + types (+ padding to a multiple of 8)
        "target_vocab_size": len(tgt_types),
        "target_vocab": sorted(tgt_types),  # types seen on the target side of train (logit masking)
    }
    tmp = os.path.join(data_bin, f"stats.json.tmp.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=1, ensure_ascii=False)
    os.replace(tmp, os.path.join(data_bin, "stats.json"))
    return stats


# ---------------------------------------------------------------- command line


def shell_config(pair):
    """src, tgt and the data: settings of configs/PAIR.yaml as `name=value` shell lines, or
    `known=0` for a pair without a config (a user's own corpus)."""
    import shlex

    if pair not in recipes.available_pairs():
        return "known=0"
    cfg = recipes.load(pair)
    d = cfg.get("data") or {}
    vals = {"known": 1, "src": cfg["src"], "tgt": cfg["tgt"], "source": d.get("source"),
            "tokenized": str(bool(d.get("tokenized"))).lower(), "max_len": d.get("max_len", 250),
            "bpe": d.get("bpe", "fastbpe"), "bpe_merges": d.get("bpe_merges", 8000)}
    exp = d.get("expected_lines") or {}
    for s in SPLITS:
        vals[f"expected_{s}"] = exp.get(s) or ""
    return "\n".join(f"{k}={shlex.quote(str(v))}" for k, v in vals.items())


def main(argv=None):
    p = Parser(prog="python -m qknorm_fairseq.corpora", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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
            download(a.pair, a.out, a.cache, a.source)
        elif a.cmd == "tokenize":
            c = tokenize_dir(a.in_dir, a.out_dir, a.src, a.tgt, a.raw, a.max_len)
            log("lines: " + ", ".join(f"{k} {v['kept']}/{v['input']}" for k, v in c.items()))
        elif a.cmd == "spm":
            spm_encode_dir(a.tok_dir, a.bpe_dir, a.src, a.tgt, a.vocab_size)
        elif a.cmd == "stats":
            st = write_stats(a.data_bin, a.tok_dir, a.bpe_dir, a.src, a.tgt, a.pair, a.bpe, a.bpe_size)
            log(f"stats: L(97.5%) = {st['length_p97.5']}, target vocab {st['target_vocab_size']} types")
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
