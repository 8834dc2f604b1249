"""Every download path of qknorm_pipeline.data / scripts/download.sh, offline, against fixtures
that mimic the real layouts (TED .tar.gz with all_talks_*.tsv, the qi18naacl archive with gl->en's
real line counts, Hugging Face parquet conversions with their trailing empty pair, Stanford's
IWSLT'15 text files), served from file:// and from an HTTP server on 127.0.0.1; including the
failure cases, checksum mismatches, and interrupted transfers resumed over HTTP Range."""
import functools
import hashlib
import http.server
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from qknorm_pipeline import recipes
from qknorm_pipeline.cli import UsageError
from qknorm_pipeline.data import fetch, sources
from qknorm_pipeline.data.common import SPLITS, DataError
from qknorm_pipeline.data.download import download
from qknorm_pipeline.data.sources import HF_SPLITS

from helpers import REPO

HTML = b"<!DOCTYPE html>\n<html><head><title>Domain parked</title></head><body>gone</body></html>\n"
LANGS = ["en", "gl", "sk", "he"]
# inside sentences: every character str.splitlines() breaks at besides "\n" and "\r"
ODD = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def talk_rows(split):
    """Rows of a fake all_talks_<split>.tsv: {lang: text}; some translations missing, one with
    NULL inside a sentence (the original reader drops it, the HF loader does not)."""
    rows = []
    for i in range(12 if split == "train" else 5):
        row = {lang: f"{split} sentence {i} in {lang} ,{ODD[i % len(ODD)]}with &apos; escapes ." for lang in LANGS}
        if i % 4 == 1:
            row["sk"] = "__NULL__"
        if i % 4 == 2:
            row["gl"] = "_ _ NULL _ _"
        if i % 5 == 3:
            row["sk"] = ""
        if i == 4:
            row["en"] = "a NULL pointer ."
        rows.append(row)
    return rows


def expected_pairs(split, src, tgt):
    """Independent statement of the original TED reader's rule on talk_rows: both sides
    non-empty and without NULL anywhere."""
    return [(r[src], r[tgt]) for r in talk_rows(split) if r[src] and r[tgt] and "NULL" not in r[src] + r[tgt]]


def add_bytes(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_ted_tar(path):
    with tarfile.open(path, "w:gz") as tar:
        for split in SPLITS:
            lines = ["\t".join(["talk_name"] + LANGS)]
            lines += ["\t".join([f"talk{i // 3}"] + [r[lang] for lang in LANGS]) for i, r in enumerate(talk_rows(split))]
            add_bytes(tar, f"all_talks_{split}.tsv", ("\n".join(lines) + "\n").encode())


# gl->en with the real line counts of the Qi et al. files (the papers' split: configs/gl-en.yaml)
HRLR = {s: [(f"gl {s} {i}{ODD[i % len(ODD)]}frase .", f"en {s} {i}{ODD[i % len(ODD)]}sentence .") for i in range(n)]
        for s, n in (("train", 10017), ("dev", 682), ("test", 1007))}
# rows per split in datasets/ted_hrlr/dataset_infos.json (gl_to_en) of huggingface/datasets
HF_HRLR_ROWS = {"train": 10018, "dev": 683, "test": 1008}


def write_hrlr_tar(path):
    """The papers' files: one sentence per line, each line ended by "\n"."""
    with tarfile.open(path, "w:gz") as tar:
        for split, pairs in HRLR.items():
            add_bytes(tar, f"datasets/gl_to_en/gl.{split}", "".join(p[0] + "\n" for p in pairs).encode())
            add_bytes(tar, f"datasets/gl_to_en/en.{split}", "".join(p[1] + "\n" for p in pairs).encode())


def write_hrlr_parquet(root):
    """The HF conversion: its loader cut the files at "\n" and kept the empty string after the last
    newline, so every split ends with one empty pair."""
    for split, pairs in HRLR.items():
        folder = root / "neulab/ted_hrlr/resolve/refs/convert/parquet/gl_to_en" / HF_SPLITS[split]
        folder.mkdir(parents=True)
        rows = [{"gl": a, "en": b} for a, b in pairs] + [{"gl": "", "en": ""}]
        assert len(rows) == HF_HRLR_ROWS[split]
        col = pa.array(rows, type=pa.struct([("gl", pa.string()), ("en", pa.string())]))
        pq.write_table(pa.table({"translation": col}), folder / "0000.parquet")


def write_ted_multi_parquet(root):
    """The HF schema: talk_name + translations{language[], translation[]}, incomplete translations
    already left out (as the HF loader did); train is split over two shards."""
    typ = pa.struct([("language", pa.list_(pa.string())), ("translation", pa.list_(pa.string()))])
    for split in SPLITS:
        folder = root / "neulab/ted_multi/resolve/refs/convert/parquet/plain_text" / HF_SPLITS[split]
        folder.mkdir(parents=True)
        rows = talk_rows(split)
        recs = []
        for r in rows:
            langs = [lang for lang in LANGS if r[lang] not in ("", "__NULL__", "_ _ NULL _ _")]
            recs.append({"language": langs, "translation": [r[lang] for lang in langs]})
        shards = [recs[:5], recs[5:]] if split == "train" else [recs]
        for k, shard in enumerate(shards):
            table = pa.table({"talk_name": pa.array([f"talk{i}" for i in range(len(shard))]),
                              "translations": pa.array(shard, type=typ)})
            pq.write_table(table, folder / f"{k:04d}.parquet")


IWSLT = {name: [f"{name} line {i} ." for i in range(n)] for name, n in (("train", 9), ("tst2012", 3), ("tst2013", 4))}


def write_iwslt(folder, misaligned=False):
    folder.mkdir(parents=True)
    for name, lines in IWSLT.items():
        (folder / f"{name}.en").write_text("".join(f"en {x}\n" for x in lines))
        vi = lines[:-1] if misaligned and name == "train" else lines
        (folder / f"{name}.vi").write_text("".join(f"vi {x}\n" for x in vi))


def published_for(*paths):
    return {p.name: sources.Published(p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest(),
                                      hashlib.md5(p.read_bytes()).hexdigest()) for p in paths}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Fixture mirrors: dead/ (HTML pages with the real file names), ok/ (valid archives),
    trunc/ (truncated archive/parquet), hf/ (parquet conversions), iwslt/, iwslt-bad/."""
    root = tmp_path_factory.mktemp("site")
    for name in ("ted_talks.tar.gz", "qi18naacl-dataset.tar.gz"):
        (root / "dead").mkdir(exist_ok=True)
        (root / "dead" / name).write_bytes(HTML)
    (root / "ok").mkdir()
    write_ted_tar(root / "ok/ted_talks.tar.gz")
    write_hrlr_tar(root / "ok/qi18naacl-dataset.tar.gz")
    (root / "trunc").mkdir()
    for name in ("ted_talks.tar.gz", "qi18naacl-dataset.tar.gz"):
        data = (root / "ok" / name).read_bytes()
        (root / "trunc" / name).write_bytes(data[: len(data) // 2])
    write_hrlr_parquet(root / "hf")
    write_ted_multi_parquet(root / "hf")
    shutil.copytree(root / "hf", root / "hf-trunc")
    p = root / "hf-trunc/neulab/ted_hrlr/resolve/refs/convert/parquet/gl_to_en/validation/0000.parquet"
    p.write_bytes(p.read_bytes()[:-20])
    write_iwslt(root / "iwslt")
    write_iwslt(root / "iwslt-bad", misaligned=True)
    return root


class Handler(http.server.SimpleHTTPRequestHandler):
    """Static files, plus /short/ (announces more bytes than it sends, every time), /flaky/PATH and
    /norange/PATH: the first request gets half of PATH and a dropped connection; later ones get
    the rest over HTTP Range (flaky) or the whole file again (norange)."""
    requests = []  # (path, Range header) of every /flaky/ and /norange/ request

    def log_message(self, *args):
        pass

    def do_GET(self):
        for prefix in ("/flaky/", "/norange/"):
            if self.path.startswith(prefix):
                return self.interrupted(prefix)
        if self.path.startswith("/short/"):  # announces more bytes than it sends
            data = HTML.replace(b"<", b"x") * 10
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data) + 500))
            self.end_headers()
            self.wfile.write(data)
            return
        super().do_GET()

    def interrupted(self, prefix):
        data = open(os.path.join(self.directory, self.path[len(prefix):]), "rb").read()
        rng = self.headers.get("Range")
        first = not any(p == self.path for p, _ in Handler.requests)
        Handler.requests.append((self.path, rng))
        start = int(rng[len("bytes="):].rstrip("-")) if rng and prefix == "/flaky/" and not first else 0
        self.send_response(206 if start else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        self.wfile.write(data[start:] if not first else data[: len(data) // 2])
        self.close_connection = True


@pytest.fixture(scope="module")
def http_url(site):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(fetch, "BACKOFF_S", 0.01)


@pytest.fixture()
def published(monkeypatch, site):
    """The fixture files' sizes and digests in place of the real published ones."""
    table = published_for(site / "ok/ted_talks.tar.gz", site / "ok/qi18naacl-dataset.tar.gz", *(site / "iwslt").iterdir())
    monkeypatch.setattr(sources, "PUBLISHED", table)
    return table


@pytest.fixture()
def configs(tmp_path, monkeypatch, site, published):
    """configs/ copied, with data: sections fitted to the fixtures (gl-en keeps its real counts)."""
    folder = tmp_path / "configs"
    shutil.copytree(os.path.join(REPO, "configs"), folder)

    def set_data(pair, **data):
        cfg = yaml.safe_load((folder / f"{pair}.yaml").read_text())
        cfg["data"].update(data)
        (folder / f"{pair}.yaml").write_text(yaml.safe_dump(cfg))

    set_data("sk-en", expected_lines={s: 999 for s in SPLITS}, exact_sources=[])
    set_data("en-vi", expected_lines={"train": 9, "dev": 3, "test": 4})
    monkeypatch.setattr(recipes, "CONFIG_DIR", str(folder))
    monkeypatch.setenv("QKNORM_CONFIG_DIR", str(folder))
    return set_data


def point(monkeypatch, base_url, phontron="dead", wayback="ok", hf="hf", iwslt="iwslt"):
    monkeypatch.setenv("QKNORM_PHONTRON_BASE", f"{base_url}/{phontron}")
    monkeypatch.setenv("QKNORM_WAYBACK_BASE", f"{base_url}/{wayback}")
    monkeypatch.setenv("QKNORM_HF_BASE", f"{base_url}/{hf}")
    monkeypatch.setenv("QKNORM_IWSLT15_BASE", f"{base_url}/{iwslt}")


def read_out(out, src, tgt):
    def lines(path):
        return path.read_bytes().decode().split("\n")[:-1]

    return {s: list(zip(lines(out / f"{s}.{src}"), lines(out / f"{s}.{tgt}"))) for s in SPLITS}


def no_partials(*folders):
    for folder in folders:
        if os.path.exists(folder):
            for dirpath, dirs, files in os.walk(folder):
                assert not [f for f in files + dirs if f.endswith(".part") or ".tmp." in f], dirpath


@pytest.fixture(params=["file", "http"])
def base_url(request, site, http_url):
    return site.as_uri() if request.param == "file" else http_url


def test_gl_en_dead_original_falls_back_to_hf_parquet(tmp_path, monkeypatch, configs, base_url, capfd):
    """The HF rows (10,018 / 683 / 1,008, trailing empty pair) pass the papers' strict counts."""
    point(monkeypatch, base_url)
    meta = download("gl-en", str(tmp_path / "raw"), str(tmp_path / "cache"))
    assert meta["source"] == "hf-ted_hrlr" and meta["exact_split"]
    assert read_out(tmp_path / "raw", "gl", "en") == HRLR
    assert json.loads((tmp_path / "raw/SOURCE.json").read_text())["lines"] == {"train": 10017, "dev": 682, "test": 1007}
    err = capfd.readouterr().err
    assert "phontron-qi18naacl failed" in err and "HTML page instead of data" in err
    assert err.count("dropped 1 pair(s) with an empty side") == 3
    assert f"/resolve/{sources.HF_REVISION}/gl_to_en/" in meta["urls"]["train"]
    no_partials(tmp_path)


def test_gl_en_from_wayback_archive(tmp_path, monkeypatch, configs, base_url):
    point(monkeypatch, base_url)
    meta = download("gl-en", str(tmp_path / "raw"), str(tmp_path / "cache"), source="wayback-qi18naacl")
    assert meta["source"] == "wayback-qi18naacl"
    assert read_out(tmp_path / "raw", "gl", "en") == HRLR


@pytest.mark.parametrize("pair", ["sk-en", "en-he"])
def test_ted_talks_archive_reader_semantics(tmp_path, monkeypatch, configs, base_url, pair, capfd):
    point(monkeypatch, base_url, phontron="ok")
    src, tgt = pair.split("-")
    meta = download(pair, str(tmp_path / "raw"), str(tmp_path / "cache"))
    assert meta["source"] == "phontron-ted_talks"
    got = read_out(tmp_path / "raw", src, tgt)
    assert got == {s: expected_pairs(s, src, tgt) for s in SPLITS}
    assert all(not a.startswith("__") for pairs in got.values() for a, _ in pairs)  # no language tag
    # sk-en: counts differ from the (fixture) paper counts, a non-exact source: reported, not fatal
    if pair == "sk-en":
        assert "differ from the papers' split" in capfd.readouterr().err


def test_ted_multi_parquet_shards_match_the_tsv_reader(tmp_path, monkeypatch, configs, base_url):
    point(monkeypatch, base_url)
    meta = download("sk-en", str(tmp_path / "raw"), str(tmp_path / "cache"))
    assert meta["source"] == "hf-ted_multi"  # original dead, parquet next
    assert read_out(tmp_path / "raw", "sk", "en") == {s: expected_pairs(s, "sk", "en") for s in SPLITS}
    assert len(os.listdir(tmp_path / "cache")) == 4  # train's two shards + validation + test


def test_iwslt15_with_md5(tmp_path, monkeypatch, configs, base_url):
    point(monkeypatch, base_url)
    download("en-vi", str(tmp_path / "raw"), str(tmp_path / "cache"))
    got = read_out(tmp_path / "raw", "en", "vi")
    for split, name in (("train", "train"), ("dev", "tst2012"), ("test", "tst2013")):
        assert got[split] == [(f"en {x}", f"vi {x}") for x in IWSLT[name]]


def test_everything_dead_fails_with_every_reason_and_no_output(tmp_path, monkeypatch, configs, base_url):
    point(monkeypatch, base_url, wayback="dead", hf="nowhere")
    with pytest.raises(DataError) as e:
        download("gl-en", str(tmp_path / "raw"), str(tmp_path / "cache"))
    msg = str(e.value)
    assert "every source failed: " in msg and msg.count("HTML page instead of data") == 2 and "not found" in msg
    assert "\n" not in msg  # one line, each source's reason after "; "
    assert not (tmp_path / "raw").exists()
    assert not os.listdir(tmp_path / "cache")  # nothing half-written or unverified kept
    no_partials(tmp_path)


def test_truncated_archive_and_parquet(tmp_path, monkeypatch, configs, base_url):
    point(monkeypatch, base_url, phontron="trunc", wayback="trunc", hf="hf-trunc")
    with pytest.raises(DataError) as e:
        download("gl-en", str(tmp_path / "raw"), str(tmp_path / "cache"))
    msg = str(e.value)
    # the archives have a published size; the parquet shards have none and fail as parquet
    assert msg.count("qi18naacl-dataset.tar.gz: size mismatch") == 2 and "not a complete parquet file" in msg
    assert not (tmp_path / "raw").exists()
    assert len(os.listdir(tmp_path / "cache")) == 1  # only the intact train shard; bad files discarded


def test_truncated_archive_without_published_size(tmp_path, monkeypatch, configs, base_url):
    point(monkeypatch, base_url, phontron="trunc", wayback="trunc")
    monkeypatch.setattr(sources, "PUBLISHED", {})
    with pytest.raises(DataError, match="truncated or corrupt .tar.gz"):
        download("gl-en", str(tmp_path / "raw"), str(tmp_path / "cache"), source="wayback-qi18naacl")
    assert not os.listdir(tmp_path / "cache")


def test_truncated_http_transfer_is_retried_then_kept_for_resuming(tmp_path, http_url, capfd):
    with pytest.raises(DataError, match=r"interrupted after \d+ of \d+ bytes; gave up after 6 attempts; run the "
                                        r"command again to resume from .*file.bin.part \(\d+ bytes kept\)"):
        fetch.fetch(f"{http_url}/short/file.bin", str(tmp_path / "file.bin"))
    assert os.listdir(tmp_path) == ["file.bin.part"]  # never file.bin: it would mean "verified"
    assert capfd.readouterr().err.count("retry") == 5


def test_a_transfer_that_never_started_does_not_promise_a_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "RETRIES", 0)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DataError) as e:
        fetch.fetch(f"http://127.0.0.1:{port}/file.bin", str(tmp_path / "file.bin"))
    assert str(e.value).endswith("gave up after 1 attempts; check the network (or the URL) and run the command again")
    assert "cannot connect" in str(e.value) and not os.listdir(tmp_path)


@pytest.mark.parametrize("what, wrong", [("size", 5), ("sha256", "0" * 64), ("md5", "0" * 32)])
def test_checksum_mismatch_names_file_expected_and_actual_and_keeps_nothing(tmp_path, monkeypatch, configs, base_url,
                                                                           published, what, wrong):
    point(monkeypatch, base_url)
    good = published["train.en"]
    actual = getattr(good, what)
    setattr(good, what, wrong)
    with pytest.raises(DataError) as e:
        download("en-vi", str(tmp_path / "raw"), str(tmp_path / "cache"))
    line = str(e.value).splitlines()[-1]
    assert f"train.en: {what} mismatch: expected {wrong}, got {actual} (from " in line
    assert not (tmp_path / "raw").exists()
    assert "train.en" not in " ".join(os.listdir(tmp_path / "cache"))
    no_partials(tmp_path)


@pytest.mark.parametrize("server", ["flaky", "norange"])
def test_interrupted_transfer_resumes_and_is_verified(tmp_path, http_url, site, server, capfd):
    Handler.requests.clear()
    name = "ok/qi18naacl-dataset.tar.gz"
    expect = published_for(site / name)["qi18naacl-dataset.tar.gz"]
    dest = tmp_path / "archive.tar.gz"
    fetch.fetch(f"{http_url}/{server}/{name}", str(dest), expect)
    assert dest.read_bytes() == (site / name).read_bytes() and not (tmp_path / "archive.tar.gz.part").exists()
    half = expect.size // 2
    # the retry asked for the rest; a server without Range support sent everything again
    assert [r for _, r in Handler.requests] == [None, f"bytes={half}-"]
    err = capfd.readouterr().err
    assert f"resuming {http_url}/{server}/{name} at byte {half}" in err
    assert ("does not resume" in err) == (server == "norange")


def test_interrupted_run_resumes_in_the_next_run(tmp_path, http_url, site, monkeypatch, capfd):
    """A run that gives up keeps the .part; the next run asks only for the missing bytes."""
    Handler.requests.clear()
    name = "ok/ted_talks.tar.gz"
    expect = published_for(site / name)["ted_talks.tar.gz"]
    dest, url = tmp_path / "ted.tar.gz", f"{http_url}/flaky/{name}"
    monkeypatch.setattr(fetch, "RETRIES", 0)
    with pytest.raises(DataError, match="gave up after 1 attempts"):
        fetch.fetch(url, str(dest), expect)
    assert (tmp_path / "ted.tar.gz.part").stat().st_size == expect.size // 2 and not dest.exists()
    fetch.fetch(url, str(dest), expect)
    assert dest.read_bytes() == (site / name).read_bytes()
    assert Handler.requests[-1] == (f"/flaky/{name}", f"bytes={expect.size // 2}-")


def test_progress_lines_when_not_a_terminal(tmp_path, http_url, site, monkeypatch, capfd):
    monkeypatch.setattr(fetch, "REPORT_S", 0.0)
    monkeypatch.setattr(fetch, "BLOCK", 1024)
    size = (site / "ok/ted_talks.tar.gz").stat().st_size
    fetch.fetch(f"{http_url}/ok/ted_talks.tar.gz", str(tmp_path / "t.tar.gz"))
    lines = [x for x in capfd.readouterr().err.splitlines() if re.match(r"\[download [\d:]+\] ted_talks\.tar\.gz: ", x)]
    assert len(lines) >= size // 1024
    assert "(100%)" in lines[-1] and "MiB/s, ETA 0:00" in lines[-1] and f"of {size / (1 << 20):.1f} MiB" in lines[-1]


def test_misaligned_sides(tmp_path, monkeypatch, configs, base_url):
    point(monkeypatch, base_url, iwslt="iwslt-bad")
    monkeypatch.setattr(sources, "PUBLISHED", {})
    with pytest.raises(DataError, match=r"misaligned source/target line counts \(9 vs 8\)"):
        download("en-vi", str(tmp_path / "raw"), str(tmp_path / "cache"))
    assert not (tmp_path / "raw").exists()


def test_expected_counts_are_enforced_for_exact_sources(tmp_path, monkeypatch, configs, base_url):
    point(monkeypatch, base_url)
    configs("gl-en", expected_lines={"train": 10018, "dev": 682, "test": 1007}, exact_sources=["hf-ted_hrlr"])
    with pytest.raises(DataError, match="train: 10017 lines, expected 10018"):
        download("gl-en", str(tmp_path / "raw"), str(tmp_path / "cache"), source="hf-ted_hrlr")
    assert not (tmp_path / "raw").exists()


def test_unknown_pair_and_source(tmp_path, configs):
    with pytest.raises(UsageError, match=r"unknown pair 'xx-yy'.*prepare.sh --pair xx-yy --src-dir"):
        download("xx-yy", str(tmp_path / "raw"), str(tmp_path / "cache"))
    with pytest.raises(UsageError, match="unknown source 'nope' for gl-en"):
        download("gl-en", str(tmp_path / "raw"), str(tmp_path / "cache"), source="nope")
    assert not (tmp_path / "raw").exists()


def script_env(tmp_path, **extra):
    env = dict(os.environ, DATA_DIR=str(tmp_path / "data"), DATA_BIN=str(tmp_path / "data-bin"),
               VIRTUAL_ENV=os.path.dirname(os.path.dirname(sys.executable)),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"], **extra)
    return env


def test_download_sh_over_http_is_idempotent(tmp_path, site, http_url, configs):
    env = script_env(tmp_path, QKNORM_CONFIG_DIR=os.environ["QKNORM_CONFIG_DIR"],
                     QKNORM_PHONTRON_BASE=f"{http_url}/dead", QKNORM_HF_BASE=f"{http_url}/hf",
                     QKNORM_WAYBACK_BASE=f"{http_url}/ok")
    cmd = ["bash", os.path.join(REPO, "scripts/download.sh"), "--pair", "gl-en"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    raw = tmp_path / "data/gl-en/raw"
    assert read_out(raw, "gl", "en") == HRLR and (raw / ".done").exists()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert p.returncode == 0 and "already downloaded" in p.stderr
    # --force from a source that fails: the finished download stays, finished
    before = {f.name: f.read_bytes() for f in raw.iterdir()}
    p = subprocess.run(cmd + ["--force", "--source", "phontron-qi18naacl"], env=env, capture_output=True, text=True)
    assert p.returncode == 1 and "source phontron-qi18naacl failed" in p.stderr
    assert {f.name: f.read_bytes() for f in raw.iterdir()} == before and (raw / ".done").exists()
    p = subprocess.run(cmd + ["--source", "nope"], env=env, capture_output=True, text=True)
    assert p.returncode == 2 and "unknown source 'nope' for gl-en: choose one of phontron-qi18naacl" in p.stderr
    p = subprocess.run(["bash", os.path.join(REPO, "scripts/download.sh"), "--pair", "xx-yy"],
                       env=env, capture_output=True, text=True)
    assert p.returncode != 0 and "unknown pair 'xx-yy'" in p.stderr
    assert not (tmp_path / "data/xx-yy").exists()


def test_progress_bar_on_a_terminal(tmp_path, site, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    fetch.fetch((site / "ok/ted_talks.tar.gz").as_uri(), str(tmp_path / "t.tar.gz"))
    bar = screen.getvalue().split("\r")[-1]
    assert bar.startswith("ted_talks.tar.gz: 100%") and "B/s]" in bar  # tqdm: size, rate, ETA


def test_hf_revision_is_one_setting(monkeypatch):
    monkeypatch.setenv("QKNORM_HF_REVISION", "0123abcd" * 5)
    (_, _, urls), = [c for c in sources.sources_for("ted_hrlr", "gl", "en") if c[0] == "hf-ted_hrlr"]
    (_, _, folders), = [c for c in sources.sources_for("ted_multi", "sk", "en") if c[0] == "hf-ted_multi"]
    assert all(f"/resolve/{'0123abcd' * 5}/" in u for u in [*urls.values(), *folders.values()])


def test_concurrent_fetches_of_one_file_do_not_interleave(tmp_path, http_url, site):
    import concurrent.futures

    name = "ok/ted_talks.tar.gz"
    expect = published_for(site / name)["ted_talks.tar.gz"]
    dest = str(tmp_path / "t.tar.gz")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: fetch.fetch(f"{http_url}/{name}", dest, expect), range(2)))
    assert open(dest, "rb").read() == (site / name).read_bytes()
    assert os.listdir(tmp_path) == ["t.tar.gz"]


def test_a_study_downloads_its_corpus_once_with_strict_counts_and_checks_its_bytes(tmp_path, monkeypatch, configs,
                                                                                 base_url):
    from qknorm_pipeline.paths import Folders
    from qknorm_pipeline.study import config, corpus
    from qknorm_pipeline.study.config import StudyError

    point(monkeypatch, base_url)  # the TED archive dead: the ted_multi parquet shards serve it
    want = {s: expected_pairs(s, "gl", "en") for s in SPLITS}
    text = {f"{s}.{lang}": "".join(p[i] + "\n" for p in want[s]).encode() for s in SPLITS for i, lang in enumerate(("gl", "en"))}

    def study(**corpus_cfg):
        cfg = yaml.safe_load(open(os.path.join(REPO, "configs", "studies", "gl-en-norm.yaml")))
        cfg["corpus"] = {"source": "ted_multi", **corpus_cfg}
        (tmp_path / "study.yaml").write_text(yaml.safe_dump(cfg))
        return config.load(str(tmp_path / "study.yaml"))

    where = Folders(*(str(tmp_path / d) for d in ("data", "data-bin", "ckpt", "logs", "results"))).under("study-x")
    # a count the source does not give: every source fails strictly, nothing is written
    with pytest.raises(DataError, match="line counts differ from the expected split"):
        corpus.ensure(study(expected_lines={"train": 99}), where)
    assert not os.path.exists(os.path.join(where.data, "gl-en", "raw"))
    cfg = study(expected_lines={s: len(want[s]) for s in SPLITS},
                sha256={n: hashlib.sha256(t).hexdigest() for n, t in text.items()})
    raw = corpus.ensure(cfg, where)
    assert raw == str(tmp_path / "data" / "study-x" / "gl-en" / "raw")
    assert {n: open(os.path.join(raw, n), "rb").read() for n in text} == text
    assert json.loads(open(os.path.join(raw, "SOURCE.json")).read())["source"] == "hf-ted_multi"
    point(monkeypatch, base_url, wayback="dead", hf="nowhere")  # done once: no source is asked again
    assert corpus.ensure(cfg, where) == raw
    bad = study(sha256={"test.en": "0" * 64})
    with pytest.raises(StudyError, match="test.en is not the corpus of the study's records"):
        corpus.ensure(bad, where)
