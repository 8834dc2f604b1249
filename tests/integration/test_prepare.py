"""scripts/prepare.sh end to end: the demo corpus to data-bin with stats checked, a user's own
corpus (raw text, SentencePiece), the error paths, and the real TED gl-en corpus (QKNORM_TEST_DATA)."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from qknorm_fairseq import data_stats

from helpers import REPO, shared

pytestmark = pytest.mark.integration  # prepare.sh on data, each test


def env_for(root):
    return dict(os.environ, DATA_DIR=str(root / "data"), DATA_BIN=str(root / "data-bin"),
                VIRTUAL_ENV=os.path.dirname(os.path.dirname(sys.executable)), PYTHONWARNINGS="ignore",
                PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


def sh(root, script, *args, ok=True):
    p = subprocess.run(["bash", os.path.join(REPO, "scripts", script), *args], env=env_for(root),
                       capture_output=True, text=True)
    if ok:
        assert p.returncode == 0, f"{script} {args} failed:\n{p.stderr[-4000:]}"
    return p


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def check_data_bin(root, pair, src, tgt, bpe_marker):
    """Checks data-bin/<pair> and stats.json against independent computations from the text files."""
    tok, bpe, out = root / "data" / pair / "tok", root / "data" / pair / "bpe", root / "data-bin" / pair
    stats = json.loads((out / "stats.json").read_text())
    lengths = []
    for split in ("train", "valid", "test"):
        for lang in (src, tgt):
            sizes = data_stats.read_sizes(str(out / f"{split}.{src}-{tgt}.{lang}"))
            bpe_lines = lines(bpe / f"{split}.{lang}")
            # binarized lengths = BPE tokens + EOS, line by line
            assert list(sizes) == [len(x.split()) + 1 for x in bpe_lines]
            assert stats["tokens"][split][lang]["subwords"] == sum(len(x.split()) for x in bpe_lines)
            assert stats["tokens"][split][lang]["words"] == sum(len(x.split()) for x in lines(tok / f"{split}.{lang}"))
            if split == "train":
                lengths += list(sizes)
        assert stats["lines"][split]["kept"] == len(lines(tok / f"{split}.{src}"))
    assert stats["length_p97.5"] == pytest.approx(np.percentile(lengths, 97.5))
    # target vocabulary: decode the binarized target side through the joined dictionary
    symbols = [x.split()[0] for x in lines(out / f"dict.{tgt}.txt")]
    assert symbols == [x.split()[0] for x in lines(out / f"dict.{src}.txt")]  # joined
    specials = 4  # <s> <pad> </s> <unk> precede the file's entries
    from fairseq.data import data_utils
    ds = data_utils.load_indexed_dataset(str(out / f"train.{src}-{tgt}.{tgt}"), None)
    seen = {int(i) for k in range(len(ds)) for i in ds[k]}
    del ds
    decoded = {symbols[i - specials] for i in seen if i >= specials}
    assert stats["target_vocab_size"] == len(decoded)
    assert any(bpe_marker in s for s in decoded)  # subwords really were made
    return stats


def test_demo_end_to_end_and_resume(tmp_path):
    sh(tmp_path, "download.sh", "--pair", "demo")
    p = sh(tmp_path, "prepare.sh", "--pair", "demo")
    assert "binarizing" in p.stderr
    stats = check_data_bin(tmp_path, "demo", "src", "tgt", "@@")
    assert {s: stats["lines"][s]["kept"] for s in stats["lines"]} == {"train": 4000, "valid": 300, "test": 300}
    assert stats["bpe"] == "fastbpe" and stats["remove_bpe"] == "@@ " and stats["raw_input"] is True
    out = tmp_path / "data-bin/demo"
    assert (out / "codes").exists() and (out / "vocab").exists()
    # scoring references: tokenized, without BPE, one per test sentence
    ref = lines(tmp_path / "data/demo/tok/test.tgt")
    assert len(ref) == 300 and not any("@@" in x for x in ref)
    assert lines(tmp_path / "data/demo/raw/test.tgt") == ref  # the target side is generated tokenized
    # a second run changes nothing; after an interruption only the unfinished stage is redone
    mtime = (out / "stats.json").stat().st_mtime_ns
    p = sh(tmp_path, "prepare.sh", "--pair", "demo")
    assert "binarized data up to date" in p.stderr and (out / "stats.json").stat().st_mtime_ns == mtime
    (out / ".done").unlink()
    p = sh(tmp_path, "prepare.sh", "--pair", "demo")
    assert "tokenized text up to date" in p.stderr and "BPE up to date" in p.stderr and "binarizing" in p.stderr
    assert json.loads((out / "stats.json").read_text())["lines"] == stats["lines"]
    assert not [f for f in os.listdir(tmp_path / "data-bin") if ".tmp." in f]
    # a stats.json cut short: one line with the fix, and the fix works, redoing the last stage only
    (out / "stats.json").write_text('{"lines": ')
    p = subprocess.run([sys.executable, "-m", "qknorm_pipeline.recipes", "train-args", "demo", "qknorm"],
                       env=env_for(tmp_path), capture_output=True, text=True, cwd=REPO)
    assert p.returncode != 0 and p.stderr.strip().endswith(
        "and prepare it again (bash scripts/prepare.sh --pair demo)"), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and f"delete {out} " in p.stderr
    shutil.rmtree(out)
    p = sh(tmp_path, "prepare.sh", "--pair", "demo")
    assert "tokenized text up to date" in p.stderr and "BPE up to date" in p.stderr and "binarizing" in p.stderr
    assert json.loads((out / "stats.json").read_text())["lines"] == stats["lines"]


def test_a_second_prepare_of_a_pair_waits_for_the_first(tmp_path):
    """While another process prepares the pair (holding its folder's lock), prepare.sh says it waits, then
    prepares once the lock is free."""
    import fcntl
    import time

    sh(tmp_path, "download.sh", "--pair", "demo")
    work = tmp_path / "data" / "demo"
    fd = os.open(work, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    with open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(["bash", os.path.join(REPO, "scripts", "prepare.sh"), "--pair", "demo"],
                                env=env_for(tmp_path), stdout=subprocess.DEVNULL, stderr=err, text=True)
        try:
            for _ in range(300):
                if "waiting for another prepare of demo" in (tmp_path / "err").read_text() or proc.poll() is not None:
                    break
                time.sleep(0.1)
            assert proc.poll() is None and not (work / "tok").exists(), (tmp_path / "err").read_text()
        finally:
            os.close(fd)  # releases the lock
        assert proc.wait(timeout=600) == 0, (tmp_path / "err").read_text()[-3000:]
    assert f"waiting for another prepare of demo ({work}) to finish" in (tmp_path / "err").read_text()
    assert (tmp_path / "data-bin" / "demo" / "stats.json").exists()


def test_own_raw_corpus_with_sentencepiece(tmp_path):
    from qknorm_pipeline.data import demo as demo_corpus

    src_dir = tmp_path / "mine"
    data = demo_corpus.generate(4, (("train", 400), ("dev", 40), ("test", 40)))
    src_dir.mkdir()
    # characters SentencePiece's default normalisation (NFKC) would rewrite; an editor's byte-order mark
    special = " \uff12\uff10 \u2026 \ufb01 \uff1f"
    for split, pairs in data.items():
        bom = "\ufeff" if split in ("train", "test") else ""
        (src_dir / f"{split}.xx").write_text(bom + "".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (src_dir / f"{split}.yy").write_text(bom + "".join(t + (special if i % 3 == 0 else "") + "\n"
                                                           for i, (_, t) in enumerate(pairs)), encoding="utf-8")
    p = sh(tmp_path, "prepare.sh", "--pair", "xx-yy", "--src-dir", str(src_dir), ok=False)
    assert p.returncode != 0 and "--tokenized" in p.stderr and "--raw" in p.stderr
    p = sh(tmp_path, "prepare.sh", "--pair", "xx-yy", "--src-dir", str(src_dir), "--raw", "--bpe", "sentencepiece",
           "--merges", "120")
    stats = check_data_bin(tmp_path, "xx-yy", "xx", "yy", "\u2581")
    # the pieces decode to the references exactly, the special characters as they were
    from fairseq.data.data_utils import post_process

    tok, bpe = tmp_path / "data/xx-yy/tok", tmp_path / "data/xx-yy/bpe"
    for split in ("train", "valid", "test"):
        assert [post_process(x, "sentencepiece") for x in lines(bpe / f"{split}.yy")] == lines(tok / f"{split}.yy")
    assert lines(tok / "test.yy")[0].endswith(special)
    assert p.stderr.count("a byte-order mark (U+FEFF) before the first line, left out") == 4
    assert not any(lines(tok / f"{split}.{lang}")[0].startswith("\ufeff") for split in ("train", "test")
                   for lang in ("xx", "yy"))
    assert stats["bpe"] == "sentencepiece" and stats["remove_bpe"] == "sentencepiece"
    assert (tmp_path / "data-bin/xx-yy/spm.model").exists()
    assert lines(tmp_path / "data/xx-yy/tok/test.xx")[0].endswith(" .")  # sacremoses split the period


def test_errors_leave_no_output(tmp_path):
    p = sh(tmp_path, "prepare.sh", "--pair", "gl-en", ok=False)
    assert p.returncode != 0 and "run bash scripts/download.sh --pair gl-en first" in p.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    for split in ("train", "dev", "test"):
        (bad / f"{split}.xx").write_text("a b\nc d\n")
        (bad / f"{split}.yy").write_text("a b\n" if split == "train" else "a b\nc d\n")
    p = sh(tmp_path, "prepare.sh", "--pair", "xx-yy", "--src-dir", str(bad), "--tokenized", ok=False)
    assert p.returncode != 0 and "misaligned source/target line counts (2 vs 1)" in p.stderr
    assert not (tmp_path / "data-bin/xx-yy").exists() and not (tmp_path / "data/xx-yy/tok").exists()
    p = sh(tmp_path, "prepare.sh", "--pair", "xx-yy", "--src-dir", str(bad), "--tokenized", "--bpe", "wordpiece", ok=False)
    assert p.returncode != 0 and "--bpe must be fastbpe or sentencepiece" in p.stderr
    p = sh(tmp_path, "prepare.sh", "--pair", "xx-yy", "--src-dir", str(tmp_path / "nowhere"), "--tokenized", ok=False)
    assert p.returncode == 2 and f"--src-dir {tmp_path / 'nowhere'} is not a folder" in p.stderr
    # old Mac OS line endings (a bare \r): the file would be one line
    for split in ("train", "dev", "test"):
        for lang in ("xx", "yy"):
            (bad / f"{split}.{lang}").write_text("a b\rc d\r", newline="")
    p = sh(tmp_path, "prepare.sh", "--pair", "xx-yy", "--src-dir", str(bad), "--tokenized", ok=False)
    assert p.returncode == 1 and f"{bad}/train.xx ends its lines with a bare carriage return" in p.stderr
    assert "tr '\\r' '\\n' < FILE > FILE.unix" in p.stderr
    # a comma in the data folder, which fairseq-preprocess would split into two file names
    p = subprocess.run(["bash", os.path.join(REPO, "scripts", "prepare.sh"), "--pair", "demo"], capture_output=True,
                       text=True, env=dict(env_for(tmp_path), DATA_DIR=str(tmp_path / "a,b")))
    assert p.returncode == 2 and f"the data folder {tmp_path / 'a,b'}/demo holds a comma" in p.stderr


def test_a_bad_new_input_leaves_a_prepared_pair_as_it_was(tmp_path):
    from qknorm_pipeline.data import demo as demo_corpus

    good, bad = tmp_path / "good", tmp_path / "bad"
    data = demo_corpus.generate(4, (("train", 300), ("dev", 30), ("test", 30)))
    for folder in (good, bad):
        folder.mkdir()
        for split, pairs in data.items():
            (folder / f"{split}.xx").write_text("".join(s + "\n" for s, _ in pairs))
            (folder / f"{split}.yy").write_text("".join(t + "\n" for _, t in pairs))
    sh(tmp_path, "prepare.sh", "--pair", "xx-yy", "--src-dir", str(good), "--tokenized", "--merges", "100")
    made = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.glob("data*/xx-yy/**/*") if p.is_file()}
    assert any("data-bin" in str(k) for k in made) and any("bpe" in str(k) for k in made)
    # another folder (a new input, so every stage would be redone) that fails its checks
    (bad / "test.yy").write_text((bad / "test.yy").read_text() + "one more line\n")
    p = sh(tmp_path, "prepare.sh", "--pair", "xx-yy", "--src-dir", str(bad), "--tokenized", "--merges", "100", ok=False)
    assert p.returncode == 1 and "misaligned source/target line counts (30 vs 31)" in p.stderr
    assert {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.glob("data*/xx-yy/**/*") if p.is_file()} == made
    (bad / "test.yy").write_bytes(b"caf\xe9\n" * 30)
    p = sh(tmp_path, "prepare.sh", "--pair", "xx-yy", "--src-dir", str(bad), "--tokenized", "--force", ok=False)
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1] == (
        f"[prepare] error: {bad}/test.yy is not UTF-8 text (byte 3: b'\\xe9'): convert it, e.g. iconv -f LATIN1 -t "
        "UTF-8 FILE > FILE.utf8"), p.stderr
    assert {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.glob("data*/xx-yy/**/*") if p.is_file()} == made
    # the same folder with a file replaced in place: prepared again, not "up to date"
    (good / "train.xx").write_text("".join(s + "\n" for s, _ in data["train"][:200]))
    (good / "train.yy").write_text("".join(t + "\n" for _, t in data["train"][:200]))
    p = sh(tmp_path, "prepare.sh", "--pair", "xx-yy", "--src-dir", str(good), "--tokenized", "--merges", "100")
    assert "up to date" not in p.stderr and "lines: train 200/200" in p.stderr, p.stderr
    assert json.loads((tmp_path / "data-bin/xx-yy/stats.json").read_text())["lines"]["train"]["input"] == 200


def test_real_ted_gl_en(tmp_path):
    src_dir = shared("ted-gl-en")
    sh(tmp_path, "prepare.sh", "--pair", "gl-en", "--src-dir", src_dir)
    stats = check_data_bin(tmp_path, "gl-en", "gl", "en", "@@")
    # independent count of the length filter: train pairs with 1..250 tokens on both sides
    gl, en = lines(os.path.join(src_dir, "train.gl")), lines(os.path.join(src_dir, "train.en"))
    kept = sum(1 for a, b in zip(gl, en) if 0 < len(a.split()) <= 250 and 0 < len(b.split()) <= 250)
    assert stats["lines"]["train"] == {"input": len(gl), "kept": kept}
    assert stats["lines"]["valid"]["kept"] == len(lines(os.path.join(src_dir, "dev.gl")))
    assert stats["lines"]["test"]["kept"] == len(lines(os.path.join(src_dir, "test.gl")))
    assert len(data_stats.read_sizes(str(tmp_path / "data-bin/gl-en/test.gl-en.en"))) == stats["lines"]["test"]["kept"]
    assert stats["bpe_size"] == 3000 and len(lines(tmp_path / "data-bin/gl-en/codes")) <= 3000
    # tokenized references unchanged (already Moses-tokenized input)
    assert lines(tmp_path / "data/gl-en/tok/test.en") == [" ".join(x.split()) for x in lines(os.path.join(src_dir, "test.en"))]
    print(f"gl-en: {stats['lines']}, L97.5 = {stats['length_p97.5']}, target vocab {stats['target_vocab_size']}")
