"""Readers (TED reader rules, "\n"-only lines), verification, tokenization/length filter, the
shell view of a recipe, and the demo corpus generator."""
import collections
import hashlib
import json
import os

import pytest

from qknorm_pipeline import files, recipes
from qknorm_pipeline.data import common, download, fetch, readers, sources, tokenize
from qknorm_pipeline.data import demo as demo_corpus
from qknorm_pipeline.data.common import DataError

from helpers import shared

# every character str.splitlines() breaks at besides "\n" and "\r"
ODD = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def test_html_detection():
    assert fetch.looks_like_html(b"\n  <!DOCTYPE html><html>")
    assert fetch.looks_like_html(b"<HTML><body>")
    assert fetch.looks_like_html(b"<?xml version='1.0'?>\n<html xmlns='x'>")
    assert not fetch.looks_like_html(b"\x1f\x8b\x08\x00gzip")
    assert not fetch.looks_like_html(b"PAR1....")
    assert not fetch.looks_like_html(b"Hello , world .\nthe <unk> token\n")


def test_lines_are_cut_at_newline_only():
    text = "".join(f"a{c}b\n" for c in ODD) + "crlf\r\nlone\rcr\nlast"
    assert files.split_lines(text) == [f"a{c}b" for c in ODD] + ["crlf", "lone\rcr", "last"]
    assert files.split_lines("x\n\ny\n") == ["x", "", "y"]  # an empty line inside is kept
    assert files.split_lines("") == []
    assert len(text.splitlines()) == 2 * len(ODD) + 4  # what str.splitlines() would have made of it


def test_complete_follows_the_ted_reader():
    assert readers.complete("a sentence .")
    # the original reader (ted_reader.py) drops a sentence that contains NULL anywhere
    for bad in (None, "", "   ", "__NULL__", "_ _ NULL _ _", "x __NULL__ y", "a NULL pointer"):
        assert not readers.complete(bad)


def test_read_ted_tsv_keeps_rows_with_both_sides_and_adds_no_tag():
    tsv = (
        "talk_name\ten\tgl\tpt\n"
        "t1\tHello .\tOla .\tOlá .\n"
        "t1\tBye .\t__NULL__\tTchau .\n"
        "t2\t_ _ NULL _ _\tAdeus .\tAdeus .\n"
        "t2\t\"quoted\" text .\tTexto \" .\t__NULL__\n"
        "t3\t  spaced .  \tespazo .\t\n"
        "t3\tshort row\n"
        + "".join(f"t4\ten {i}{c} .\tgl {i}{c} .\tpt\n" for i, c in enumerate(ODD))
    )
    assert readers.read_ted_tsv(tsv, "gl", "en") == [
        ("Ola .", "Hello ."), ("Texto \" .", "\"quoted\" text ."), ("espazo .", "spaced .")
    ] + [(f"gl {i}{c} .", f"en {i}{c} .") for i, c in enumerate(ODD)]
    with pytest.raises(DataError, match="no column for sk"):
        readers.read_ted_tsv(tsv, "sk", "en")


def test_fetch_verifies_and_reuses(tmp_path):
    good = tmp_path / "good.txt"
    data = b"one\ntwo\n"
    good.write_bytes(data)
    expect = sources.Published(len(data), hashlib.sha256(data).hexdigest(), hashlib.md5(data).hexdigest())
    dest = tmp_path / "cache" / "good.txt"
    fetch.fetch(good.as_uri(), str(dest), expect)
    assert dest.read_bytes() == data
    good.write_text("changed\n")  # a finished file is reused, not fetched again
    fetch.fetch(good.as_uri(), str(dest), expect)
    assert dest.read_bytes() == data
    with pytest.raises(DataError, match="at least 100"):
        fetch.fetch(good.as_uri(), str(tmp_path / "small"), min_size=100)
    with pytest.raises(common.NotFound):
        fetch.fetch((tmp_path / "missing").as_uri(), str(tmp_path / "x"))
    assert sorted(os.listdir(tmp_path)) == ["cache", "good.txt"]


def test_published_checksums_match_the_real_iwslt_test_files():
    """The four IWSLT'15 dev/test files of the real corpora (QKNORM_TEST_DATA) are byte-identical to
    Stanford's: their sizes and digests must be the published ones (the train files are not there)."""
    folder = shared("iwslt15-en-vi")
    for name in ("tst2012.en", "tst2012.vi", "tst2013.en", "tst2013.vi"):
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        pub = sources.PUBLISHED[name]
        assert (len(data), hashlib.sha256(data).hexdigest(), hashlib.md5(data).hexdigest()) == (pub.size, pub.sha256, pub.md5)


def write_split_dir(folder, src, tgt, data):
    folder.mkdir(parents=True, exist_ok=True)
    for split, pairs in data.items():
        (folder / f"{split}.{src}").write_text("".join(a + "\n" for a, _ in pairs))
        (folder / f"{split}.{tgt}").write_text("".join(b + "\n" for _, b in pairs))


def test_tokenize_filters_train_by_length_only(tmp_path):
    long = " ".join(["w"] * 6)
    data = {"train": [("a b", "c d"), (long, "x"), ("y", long), ("", "z"), ("e  f", "g")],
            "dev": [(long, "x"), ("a", "b")], "test": [("a", long)]}
    write_split_dir(tmp_path / "in", "xx", "yy", data)
    counts = tokenize.tokenize_dir(str(tmp_path / "in"), str(tmp_path / "tok"), "xx", "yy", raw=False, max_len=5)
    assert counts == {"train": {"input": 5, "kept": 2}, "valid": {"input": 2, "kept": 2}, "test": {"input": 1, "kept": 1}}
    assert (tmp_path / "tok/train.xx").read_text() == "a b\ne f\n"
    assert (tmp_path / "tok/train.yy").read_text() == "c d\ng\n"
    assert (tmp_path / "tok/valid.xx").read_text() == f"{long}\na\n"  # references stay complete
    assert json.loads((tmp_path / "tok/counts.json").read_text())["lines"] == counts


@pytest.mark.parametrize("raw", [False, True])
def test_tokenize_keeps_sentences_with_odd_separators_whole(tmp_path, raw):
    data = {s: [(f"word{c}{s} {i} .", f"mot{c}{s} {i} .") for i, c in enumerate(ODD)] for s in ("train", "dev", "test")}
    write_split_dir(tmp_path / "in", "en", "fr", data)
    counts = tokenize.tokenize_dir(str(tmp_path / "in"), str(tmp_path / "tok"), "en", "fr", raw=raw, max_len=250)
    assert counts["test"] == {"input": len(ODD), "kept": len(ODD)}
    for lang, word in (("en", "word"), ("fr", "mot")):
        out = (tmp_path / f"tok/test.{lang}").read_bytes().decode()
        # one line per sentence, in order, the separator now a plain space
        assert out == "".join(f"{word} test {i} .\n" for i in range(len(ODD)))


def test_tokenize_raw_uses_moses_without_escaping(tmp_path):
    data = {s: [("Don't stop, \"now\".", "L'homme (vieux) & co.")] for s in ("train", "dev", "test")}
    write_split_dir(tmp_path / "in", "en", "fr", data)
    tokenize.tokenize_dir(str(tmp_path / "in"), str(tmp_path / "tok"), "en", "fr", raw=True, max_len=250)
    assert (tmp_path / "tok/test.en").read_text() == "Don 't stop , \" now \" .\n"
    assert (tmp_path / "tok/test.fr").read_text() == "L' homme ( vieux ) & co .\n"


def test_tokenize_rejects_misaligned_and_missing(tmp_path):
    data = {s: [("a", "b"), ("c", "d")] for s in ("train", "dev", "test")}
    write_split_dir(tmp_path / "in", "xx", "yy", data)
    (tmp_path / "in/dev.yy").write_text("b\n")
    with pytest.raises(DataError, match=r"misaligned source/target line counts \(2 vs 1\)"):
        tokenize.tokenize_dir(str(tmp_path / "in"), str(tmp_path / "tok"), "xx", "yy", raw=False, max_len=9)
    (tmp_path / "in/dev.yy").unlink()
    with pytest.raises(DataError, match=r"missing .*dev\.yy"):
        tokenize.tokenize_dir(str(tmp_path / "in"), str(tmp_path / "tok"), "xx", "yy", raw=False, max_len=9)
    assert sorted(os.listdir(tmp_path)) == ["in"]  # nothing half-written


def test_check_counts_strict_and_reported(capsys):
    data = {"train": [1, 2], "dev": [1], "test": [1]}
    assert download.check_counts(data, {"train": 2, "dev": None, "test": 1}, True, "x") == {"train": 2, "dev": 1, "test": 1}
    with pytest.raises(DataError, match="train: 2 lines, expected 3"):
        download.check_counts(data, {"train": 3}, True, "x")
    download.check_counts(data, {"train": 3}, False, "x")
    assert "train: 2 lines, expected 3" in capsys.readouterr().err


def test_data_settings_of_a_pair_and_of_the_base_recipe():
    """What download.sh and prepare.sh read: a known pair's data section, or the base recipe's."""
    cfg = recipes.load("gl-en")
    assert (cfg.src, cfg.tgt, cfg.data.source, cfg.data.tokenized) == ("gl", "en", "ted_hrlr", True)
    assert cfg.data.bpe_merges == 3000 and cfg.data.expected_lines["train"] == 10017
    base = recipes.base().data  # a pair without a config (prepare.sh then asks for --tokenized/--raw)
    assert (base.source, base.max_len, base.bpe.value, base.bpe_merges) == (None, 250, "fastbpe", 8000)


# ---------------------------------------------------------------- demo corpus


def test_demo_is_deterministic_and_splits_are_disjoint():
    a = demo_corpus.generate(7, (("train", 500), ("dev", 50), ("test", 50)))
    assert a == demo_corpus.generate(7, (("train", 500), ("dev", 50), ("test", 50)))
    assert a != demo_corpus.generate(8, (("train", 500), ("dev", 50), ("test", 50)))
    srcs = [s for split in a.values() for s, _ in split]
    assert len(srcs) == len(set(srcs)) == 600
    assert [len(a[s]) for s in ("train", "dev", "test")] == [500, 50, 50]


def parse_target(tgt):
    """Splits a target sentence into its verb and noun phrases, independently of the generator's
    code: determiners are the closed class below, 'ka' ends the object, prepositions start a PP."""
    dets = {"il", "la", "ili", "le", "un", "una", "kelki", "kelke", "du", "dua", "tri", "tria"}
    words = tgt.split()
    assert words[-1] == "."
    verb = words[-2]
    phrases, cur = [], None
    for w in words[:-2]:
        if w in dets:
            cur = [w]
            phrases.append(cur)
        elif w not in ("ka", "apud", "post", "sub", "kun"):
            cur.append(w)
    return verb, phrases


def test_demo_agreement_and_word_order():
    data = demo_corpus.generate(3, (("train", 2000),))["train"]
    plural_dets = {"ili", "le", "kelki", "kelke", "du", "dua", "tri", "tria"}
    masc_dets = {"il", "ili", "un", "kelki", "du", "tri"}
    for src, tgt in data:
        verb, phrases = parse_target(tgt)
        assert src[0].isupper() and src.endswith(".")
        assert " ka " in f" {tgt} "
        subj_plural = phrases[0][0] in plural_dets
        # the verb ends with the subject's number: -ant/-ibon/-eron plural, -at/-ib/-ero singular
        assert verb.endswith(("ant", "ibon", "eron")) == subj_plural, (src, tgt)
        for det, noun, *adjs in phrases:
            plural, masc = det in plural_dets, det in masc_dets
            ending = {(True, False): "o", (False, False): "a", (True, True): "oj", (False, True): "aj"}[(masc, plural)]
            assert noun.endswith(ending), (src, tgt)
            adj_end = {(True, False): "e", (False, False): "a", (True, True): "ej", (False, True): "aj"}[(masc, plural)]
            assert all(a.endswith(adj_end) for a in adjs), (src, tgt)


def test_demo_task_is_not_monotone_copying():
    """Reordering: the source verb is near the middle, the target verb always last; adjectives
    move after the noun. A word-by-word monotone translation would get the order wrong."""
    data = demo_corpus.generate(5, (("train", 1000),))["train"]
    verbs = set(demo_corpus.VERBS) | {"will"}
    verbs |= {form for _, sg, past in demo_corpus.VERBS.values() for form in (sg, past)}
    moved = 0
    for src, _ in data:
        words = src.rstrip(".").lower().split()
        first_verb = next(i for i, w in enumerate(words) if w in verbs)
        moved += first_verb < len(words) - 1
    assert moved == len(data)
    # the invented gender is hidden from the source: "the" maps to il/la/ili/le depending on the noun
    the_maps = collections.Counter(t.split()[0] for s, t in data if s.startswith("The "))
    assert set(the_maps) == {"il", "la", "ili", "le"}


def test_demo_command_line_writes_files(tmp_path):
    demo_corpus.main(["--out", str(tmp_path / "d"), "--train", "20", "--dev", "5", "--test", "5", "--seed", "2"])
    for split, n in (("train", 20), ("dev", 5), ("test", 5)):
        assert len((tmp_path / f"d/{split}.src").read_text().splitlines()) == n
        assert len((tmp_path / f"d/{split}.tgt").read_text().splitlines()) == n
    assert not [f for f in os.listdir(tmp_path / "d") if f.endswith(".tmp")]
