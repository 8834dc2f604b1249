"""The comparison table on fixture results (tests/system runs evaluate.sh and compare.sh on a
trained model)."""
import csv
import hashlib
import json
import os
import re

import pytest
import sacrebleu

from qknorm_pipeline.cli import UserError
from qknorm_pipeline.scoring import compare

from helpers import REPO, naive_bleu, write_result


def _fixture_results(tmp_path):
    ref = tmp_path / "ref.vi"
    ref.write_text("".join(f"câu số {i} rất dài và hay lắm nhé\n" for i in range(60)), encoding="utf-8")
    outs = {"postnorm": lambda i: f"câu số {i} rất dài và dở lắm",
            "scalenorm": lambda i: f"câu số {i} rất dài và hay lắm nhé",
            "qknorm": lambda i: f"câu số {i} rất dài và hay lắm"}
    for name, f in outs.items():
        write_result(tmp_path / "results" / "en-vi" / name, [f(i) for i in range(60)],
                     {"reference": [str(ref)], "metric": "multi_bleu", "detok": "none", "systems": {}})
    return tmp_path / "results"


def test_compare_table_with_published(tmp_path):
    res = _fixture_results(tmp_path)
    table = compare.build("en-vi", str(res), n_samples=200)
    base = compare.write(table, str(res))
    assert table["baseline"] == "postnorm"
    rows = {r["system"]: r for r in table["rows"]}
    assert rows["scalenorm"]["multi_bleu"] == pytest.approx(100.0)
    assert rows["scalenorm"]["p_value"] < 0.01 and rows["scalenorm"]["delta"] > 0
    assert rows["postnorm"]["p_value"] is None
    # published numbers of the matching system and metric (TwT T3 and QKNorm T2 for en-vi)
    pub = {(p["source"], p["metric"]): p["bleu"] for p in rows["scalenorm"]["published"]}
    assert pub[("TwT T3", "multi_bleu")] == 32.79 and pub[("QKNorm T2", "multi_bleu")] == 32.79
    assert pub[("QKNorm T3", "sacrebleu_treebank")] == 32.41
    assert {p["bleu"] for p in rows["qknorm"]["published"]} == {33.24, 33.18}
    with open(base + ".csv") as f:
        got = list(csv.reader(f))
    assert got[0][0] == "system" and len(got) == 4
    md = open(base + ".md").read()
    assert "| scalenorm | 100.00 |" in md and "32.79" in md
    assert json.load(open(base + ".json"))["pair"] == "en-vi"


def test_a_table_of_one_system_says_it_tests_nothing(tmp_path):
    res = _fixture_results(tmp_path)
    md = compare.to_markdown(compare.build("en-vi", str(res), n_samples=20, runs=["qknorm"]))
    assert "No test: the table has no system besides the baseline." in md and "family" not in md
    md = compare.to_markdown(compare.build("en-vi", str(res), n_samples=20, runs=["postnorm", "qknorm"]))
    assert "The family of tests: qknorm, each against postnorm (1); p (Holm)" in md


def test_each_published_number_sits_beside_ours_in_its_metric(tmp_path):
    ref = tmp_path / "ref.en"
    ref.write_text("".join(f"it &apos;s talk number {i} , isn &apos;t it ?\n" for i in range(40)))
    write_result(tmp_path / "results" / "gl-en" / "scalenorm", [f"it &apos;s the talk {i} , isn &apos;t it" for i in range(40)],
                 {"reference": [str(ref)], "metric": "multi_bleu_detok", "detok": "moses", "systems": {}})
    table = compare.build("gl-en", str(tmp_path / "results"), n_samples=50)
    row = table["rows"][0]
    assert row["multi_bleu"] != row["multi_bleu_detok"] != row["sacrebleu_treebank"]
    header, cells = compare.to_rows(table)
    for source, metric, published in (("TwT T3", "multi_bleu", 20.91), ("QKNorm T2", "multi_bleu_detok", 22.01),
                                      ("QKNorm T3", "sacrebleu_treebank", 22.01)):
        i = header.index(f"{source} published ({metric})")
        assert header[i + 1] == f"ours ({metric})"
        assert cells[i] == f"{published:.2f}" and cells[i + 1] == f"{row[metric]:.2f}"


def test_published_metrics_are_the_papers():
    rows = list(csv.DictReader(open(os.path.join(REPO, "results", "published.csv"))))
    for r in rows:
        if (r["paper"], r["table"]) == ("TwT", "3"):
            assert r["metric"] == "multi_bleu"  # tokenized BLEU for every pair, TED included
        elif (r["paper"], r["table"]) == ("QKNorm", "2"):
            assert r["metric"] == ("multi_bleu" if r["pair"] == "en-vi" else "multi_bleu_detok")
        elif (r["paper"], r["table"]) == ("QKNorm", "3"):
            assert r["metric"] == "sacrebleu_treebank"


def test_compare_errors(tmp_path):
    with pytest.raises(compare.ScoringError, match="run scripts/evaluate.sh"):
        compare.build("en-vi", str(tmp_path))
    res = _fixture_results(tmp_path)
    with pytest.raises(compare.ScoringError, match="baseline 'nope'"):
        compare.build("en-vi", str(res), baseline="nope")
    (res / "en-vi" / "qknorm" / "scores.json").write_text('{"reference": [')
    with pytest.raises(UserError, match=r"qknorm/scores.json: not valid JSON \(.*\): evaluate it again "
                                        r"\(bash scripts/evaluate.sh en-vi qknorm\)$"):
        compare.build("en-vi", str(res))


@pytest.mark.parametrize("flags, message", [
    (["--n-samples", "1"], "--n-samples must be at least 2 (the seeded test estimates a variance from the resamples), "
                           "got 1"),
    (["--seed", "-1"], "--seed must be a non-negative integer, got -1"),
])
def test_bad_resampling_flags_are_refused(tmp_path, capsys, flags, message):
    res = _fixture_results(tmp_path)
    assert compare.main(["--pair", "en-vi", "--results-dir", str(res), *flags]) == 2
    assert f"[compare] error: {message}" in capsys.readouterr().err
    assert not (res / "en-vi" / "compare.md").exists()


def test_a_result_without_its_done_is_refused_unless_left_out(tmp_path, capsys):
    """evaluate.sh removes .done before it decodes again and writes it last: scores.json + hyp.txt
    without it may be an earlier decoding's (the new one failed or was stopped)."""
    res = _fixture_results(tmp_path)
    (res / "en-vi" / "qknorm" / ".done").unlink()
    assert compare.main(["--pair", "en-vi", "--results-dir", str(res), "--n-samples", "20"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"[compare] error: unfinished evaluation of qknorm in '{res}/en-vi' (a result without the .done evaluate.sh "
        "writes last: a decoding failed or was stopped, so its files may be an earlier one's): evaluate again "
        "(bash scripts/evaluate.sh en-vi qknorm) or leave it out (--runs)"]
    assert not (res / "en-vi" / "compare.md").exists()
    table = compare.build("en-vi", str(res), n_samples=20, runs=["postnorm", "scalenorm"])
    assert [r["system"] for r in table["rows"]] == ["postnorm", "scalenorm"]
    with pytest.raises(UserError, match="unfinished evaluation of qknorm"):
        compare.build("en-vi", str(res), runs=["postnorm", "qknorm"])
    # several: each one's command is named
    (res / "en-vi" / "scalenorm" / ".done").unlink()
    with pytest.raises(UserError) as e:
        compare.build("en-vi", str(res), n_samples=20)
    assert str(e.value).startswith(f"unfinished evaluation of qknorm, scalenorm in '{res}/en-vi' ")
    assert str(e.value).endswith("evaluate again (bash scripts/evaluate.sh en-vi qknorm; bash scripts/evaluate.sh "
                                 "en-vi scalenorm) or leave them out (--runs)")
    (res / "en-vi" / "scalenorm" / ".done").write_text("key\n")
    # a folder with no result yet (the first decoding failed) is no run of the table
    (res / "en-vi" / "qknorm" / ".done").write_text("key\n")
    (res / "en-vi" / "fixnorm").mkdir()
    (res / "en-vi" / "fixnorm" / "generate.log").write_text("Traceback ...\n")
    assert [r["system"] for r in compare.build("en-vi", str(res), n_samples=20)["rows"]] == [
        "postnorm", "qknorm", "scalenorm"]


def test_scores_of_a_checkpoint_changed_since_are_refused(tmp_path):
    """scores.json names the checkpoint evaluate.sh decoded and its SHA-256: one trained again since is
    refused; one deleted (results kept without checkpoints), or a scores.json naming none, is not checked."""
    res = _fixture_results(tmp_path)
    ckpt = tmp_path / "checkpoints" / "qknorm" / "checkpoint_best.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"weights")
    scores = res / "en-vi" / "qknorm" / "scores.json"
    scores.write_text(json.dumps({**json.loads(scores.read_text()),
                                  "checkpoint": {"path": str(ckpt), "sha256": hashlib.sha256(b"weights").hexdigest()}}))
    assert len(compare.build("en-vi", str(res), n_samples=20)["rows"]) == 3
    ckpt.write_bytes(b"weights, trained again")
    with pytest.raises(UserError, match=re.escape(
            f"en-vi/qknorm: its scores are of an earlier {ckpt} (it has changed since it was evaluated: trained "
            "again?): evaluate again (bash scripts/evaluate.sh en-vi qknorm)")):
        compare.build("en-vi", str(res), n_samples=20)
    ckpt.unlink()
    assert len(compare.build("en-vi", str(res), n_samples=20)["rows"]) == 3
    # the reference prepared again since: refused alike
    ref = tmp_path / "ref.vi"
    scores.write_text(json.dumps({**json.loads(scores.read_text()), "reference_sha256": hashlib.sha256(ref.read_bytes()).hexdigest()}))
    assert len(compare.build("en-vi", str(res), n_samples=20)["rows"]) == 3
    ref.write_text("".join(reversed(ref.read_text(encoding="utf-8").splitlines(keepends=True))), encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(
            f"en-vi/qknorm: its scores are against an earlier {ref} (the test set has changed since it was evaluated: "
            "prepared again?): evaluate again (bash scripts/evaluate.sh en-vi qknorm)")):
        compare.build("en-vi", str(res), n_samples=20)


def test_runs_restricts_the_table(tmp_path):
    """--runs: only the named run folders, so a report of seed 1 leaves out seed 2's finished runs."""
    res = _fixture_results(tmp_path)
    table = compare.build("en-vi", str(res), n_samples=50, runs=["postnorm", "qknorm"])
    assert [r["system"] for r in table["rows"]] == ["postnorm", "qknorm"]
    with pytest.raises(compare.ScoringError, match=r"--runs: no evaluated run nope .*have: postnorm, qknorm, scalenorm"):
        compare.build("en-vi", str(res), runs=["postnorm", "nope"])
    assert compare.main(["--pair", "en-vi", "--results-dir", str(res), "--runs", "postnorm", "scalenorm",
                         "--n-samples", "20"]) == 0
    assert [r["system"] for r in compare.read(str(res / "en-vi" / "compare.json"))["rows"]] == ["postnorm", "scalenorm"]


def test_scores_name_the_reference_relative_to_the_repository(tmp_path, monkeypatch):
    """evaluate writes a reference inside the repository relative to it (results, such as a study's
    committed records, never name the paths of the machine that made them), and compare finds it from any directory."""
    from qknorm_pipeline import paths
    from qknorm_pipeline.scoring import score

    monkeypatch.setattr(paths, "ROOT", str(tmp_path))
    monkeypatch.setattr(compare, "ROOT", str(tmp_path))
    (tmp_path / "data").mkdir()
    refs = [f"the talk number {i} was long and good" for i in range(40)]
    (tmp_path / "data" / "test.en").write_text("".join(r + "\n" for r in refs))
    hyps = {"postnorm": [r.replace("good", "bad") for r in refs], "qknorm": refs}
    for name, lines in hyps.items():
        d = tmp_path / "results" / "gl-en" / name
        write_result(d, lines, {})
        scores = score.score_systems([str(tmp_path / "data" / "test.en")], [(name, str(d / "hyp.txt"))])
        assert scores["reference"] == [os.path.join("data", "test.en")]
        (d / "scores.json").write_text(json.dumps(scores))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    rows = {r["system"]: r for r in compare.build("gl-en", str(tmp_path / "results"), n_samples=50)["rows"]}
    for name, lines in hyps.items():
        assert rows[name]["multi_bleu"] == pytest.approx(naive_bleu(lines, refs), abs=0.01)
    # a run scored before references were named relatively names the same file absolutely
    old = tmp_path / "results" / "gl-en" / "qknorm" / "scores.json"
    old.write_text(json.dumps({**json.loads(old.read_text()), "reference": [str(tmp_path / "data" / "test.en")]}))
    assert len(compare.build("gl-en", str(tmp_path / "results"), n_samples=50)["rows"]) == 2
    (tmp_path / "data" / "other.en").write_text("".join(r + "\n" for r in refs))
    old.write_text(json.dumps({**json.loads(old.read_text()), "reference": ["data/other.en"]}))
    with pytest.raises(compare.ScoringError, match="different references"):
        compare.build("gl-en", str(tmp_path / "results"), n_samples=50)


def test_published_csv_complete():
    rows = list(csv.DictReader(open(os.path.join(REPO, "results", "published.csv"))))
    by = {}
    for r in rows:
        by.setdefault((r["paper"], r["table"]), []).append(r)
    assert len(by[("TwT", "3")]) == 25 and len(by[("QKNorm", "2")]) == 10 and len(by[("QKNorm", "3")]) == 10
    assert len(by[("QKNorm", "4")]) == 5 and len(by[("QKNorm", "5")]) == 7 and len(by[("QKNorm", "6")]) == 5
    assert all(r["metric"] in compare.ALL_METRICS for r in rows)


def _apostrophe_results(tmp_path, pair):
    """Escaped (Moses-tokenized) English, as the pipelines leave it, with an apostrophe per line."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    ref = tmp_path / "ref.en"
    ref.write_text("".join(f"it &apos;s talk {i} , isn &apos;t it ?\n" for i in range(30)))
    write_result(tmp_path / "results" / pair / "scalenorm", [f"it &apos;s the talk {i} , isn &apos;t it" for i in range(30)],
                 {"reference": [str(ref)], "metric": "multi_bleu", "detok": "moses", "systems": {}})
    return tmp_path / "results"


def test_treebank_column_keeps_escapes_only_beside_a_published_qknorm_table_3_number(tmp_path):
    """The escaped-Treebank procedure re-scores QKNorm Table 3; anywhere else the column is SacreBLEU
    on Treebank-detokenized text with the apostrophes restored, so `&apos;` adds no easy matches."""
    from nltk.tokenize.treebank import TreebankWordDetokenizer

    detok = TreebankWordDetokenizer().detokenize
    hyps = [f"it 's the talk {i} , isn 't it" for i in range(30)]  # the fixture's lines, escapes undone by hand
    refs = [f"it 's talk {i} , isn 't it ?" for i in range(30)]
    plain = sacrebleu.corpus_bleu([detok(h.split()) for h in hyps], [[detok(r.split()) for r in refs]]).score

    published = tmp_path / "published.csv"
    published.write_text("paper,table,pair,system,metric,bleu,variant\n")  # no published number for xx-en
    table = compare.build("xx-en", str(_apostrophe_results(tmp_path / "a", "xx-en")), published_path=str(published),
                          n_samples=20)
    assert table["treebank_detok"] == "treebank_unescape" and not table["warnings"]
    assert table["rows"][0]["sacrebleu_treebank"] == pytest.approx(plain, abs=0.01)

    table = compare.build("gl-en", str(_apostrophe_results(tmp_path / "b", "gl-en")), n_samples=20)  # QKNorm T3: 22.01
    assert table["treebank_detok"] == "treebank"
    assert table["rows"][0]["sacrebleu_treebank"] > plain + 1  # `& apos ;` in both: easy matches
    assert "60 Moses escapes" in table["warnings"][0]
    forced = compare.build("gl-en", str(tmp_path / "b" / "results"), n_samples=20, treebank_detok="treebank_unescape")
    assert forced["rows"][0]["sacrebleu_treebank"] == pytest.approx(plain, abs=0.01)


def test_a_table_that_cannot_be_rendered_leaves_the_old_files_whole(tmp_path, monkeypatch):
    res = _fixture_results(tmp_path)
    compare.write(compare.build("en-vi", str(res), n_samples=20), str(res))
    before = {ext: (res / "en-vi" / f"compare{ext}").read_text() for ext in (".json", ".csv", ".md")}

    def broken(table):
        raise ValueError("cannot render")

    monkeypatch.setattr(compare, "to_markdown", broken)
    table = compare.build("en-vi", str(res), n_samples=20, runs=["postnorm", "qknorm"])
    with pytest.raises(ValueError, match="cannot render"):
        compare.write(table, str(res))
    assert {ext: (res / "en-vi" / f"compare{ext}").read_text() for ext in before} == before


def test_an_adjusted_p_just_below_the_level_keeps_the_digits_that_show_it():
    rows = [{"p_value": 0.00999}, {"p_value": None}]
    compare.add_holm(rows, None)
    assert rows[0]["significant"] is True and rows[0]["p_holm_text"] == "0.00999" and rows[0]["p_text"] == "0.00999"


def test_systems_decoded_with_other_flags_are_refused(tmp_path):
    """scores.json records fairseq-generate's flags: a system decoded otherwise (here with beam 2) is
    refused, naming the difference; leaving it out works; scores without the record are not checked."""
    res = _fixture_results(tmp_path)
    flags = {"postnorm": ["--beam", "4"], "qknorm": ["--beam", "2"], "scalenorm": ["--beam", "4"]}
    for system, words in flags.items():
        scores = res / "en-vi" / system / "scores.json"
        scores.write_text(json.dumps({**json.loads(scores.read_text()), "decoding": words}))
    with pytest.raises(UserError) as e:
        compare.build("en-vi", str(res), n_samples=20)
    assert str(e.value) == ("en-vi/qknorm was decoded with other fairseq-generate flags than en-vi/postnorm (... --beam "
                            "'4' now '2'): decode every system alike (bash scripts/evaluate.sh en-vi SYSTEM [flags]), or "
                            "leave some out (--runs)")
    assert len(compare.build("en-vi", str(res), n_samples=20, runs=["postnorm", "scalenorm"])["rows"]) == 2
    scores = res / "en-vi" / "qknorm" / "scores.json"
    scores.write_text(json.dumps({k: v for k, v in json.loads(scores.read_text()).items() if k != "decoding"}))
    assert len(compare.build("en-vi", str(res), n_samples=20)["rows"]) == 3


def test_all_compares_the_pairs_with_runs_and_passes_over_folders_of_tables_alone(tmp_path):
    """compare.sh all: a pair's folder holding only its tables and plots (a fresh checkout's results/demo) is not a
    pair to compare; one with a run's result, finished or not, is (find_systems then judges it); none is an error."""
    res = _fixture_results(tmp_path)
    (res / "demo").mkdir()
    (res / "demo" / "compare.md").write_text("| system |\n")
    (res / "gl-en" / "qknorm").mkdir(parents=True)
    (res / "gl-en" / "qknorm" / "hyp.txt").write_text("a half-written decoding\n")
    assert compare.pairs_with_results(str(res), str(tmp_path / "data-bin")) == ["en-vi", "gl-en"]
    only_tables = tmp_path / "fresh"
    (only_tables / "demo").mkdir(parents=True)
    (only_tables / "demo" / "compare.md").write_text("| system |\n")
    with pytest.raises(compare.ScoringError, match="no evaluated pairs under .*: run bash scripts/evaluate.sh"):
        compare.pairs_with_results(str(only_tables), str(tmp_path / "data-bin"))
