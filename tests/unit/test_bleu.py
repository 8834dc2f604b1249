"""Our multi-bleu.perl / multi-bleu-detok.perl re-implementations and the scoring CLI."""
import json
import math
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import sacrebleu

from qknorm_pipeline.scoring import bleu
from qknorm_pipeline.scoring.score import main as cli

from helpers import brute_force_bootstrap_p, naive_bleu, shared


def test_perfect_match():
    r = bleu.multi_bleu(["a b c d e", "x y z w"], [["a b c d e", "x y z w"]])
    assert r.score == pytest.approx(100.0)
    assert r.bp == 1.0 and r.hyp_len == r.ref_len == 9


def test_no_match_is_zero():
    assert bleu.multi_bleu(["p q r s"], [["a b c d"]]).score == 0.0


def test_zero_four_gram_count_gives_zero_like_perl():
    # unigrams/bigrams/trigrams match, no 4-gram: perl's my_log(0) makes BLEU 0 (no smoothing)
    r = bleu.multi_bleu(["a b c x d e f"], [["a b c y d e f"]])
    assert r.precisions[3] == 0.0 and r.precisions[0] > 0
    assert r.score == 0.0


def test_brevity_penalty_hand_computed():
    # hyp 4 tokens all matching, ref 6 tokens: precisions 1, BP = exp(1 - 6/4)
    r = bleu.multi_bleu(["a b c d"], [["a b c d e f"]])
    assert r.bp == pytest.approx(math.exp(1 - 6 / 4))
    assert r.score == pytest.approx(100 * math.exp(-0.5))


def test_clipping_and_closest_reference():
    # "the" x4 clipped to 2 by the reference; two refs equally close -> the shorter length counts
    r = bleu.multi_bleu(["the the the the cat"], [["the cat the dog runs fast"], ["the the cat sat"]])
    assert r.precisions[0] == pytest.approx(100 * 3 / 5)
    r2 = bleu.multi_bleu(["a b c d e"], [["a b c d e f"], ["a b c d"]])
    assert r2.ref_len == 4


def test_empty_lines_and_unicode():
    hyps = ["", "xin chào thế giới này nhé", "ă â ê ô"]
    refs = ["một hai", "xin chào thế giới này nhé", "ă â ê ô"]
    r = bleu.multi_bleu(hyps, [refs])
    assert r.hyp_len == 10 and r.ref_len == 12
    assert r.score == pytest.approx(naive_bleu(hyps, refs))
    # no-break space is not a token boundary for multi-bleu.perl (it reads bytes)
    assert bleu.multi_bleu_tokens("a\u00a0b c") == ["a\u00a0b".encode(), b"c"]


def test_all_empty_hypotheses_score_zero():
    assert bleu.multi_bleu(["", ""], [["a b", "c d"]]).score == 0.0


def test_against_naive_and_sacrebleu_none_on_random_text():
    rng = random.Random(3)
    vocab = "the a cat dog sat on mat , . ' s big small".split()
    refs = [" ".join(rng.choice(vocab) for _ in range(rng.randint(5, 20))) for _ in range(200)]
    hyps = [" ".join(w if rng.random() < 0.7 else rng.choice(vocab) for w in r.split()[: rng.randint(3, 20)])
            for r in refs]
    ours = bleu.multi_bleu(hyps, [refs]).score
    assert ours == pytest.approx(naive_bleu(hyps, refs), abs=1e-9)
    sb = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", smooth_method="none", force=True).score
    assert round(ours, 2) == round(sb, 2)


def test_mteval_tokenization():
    assert bleu.mteval_13a_tokenize('He said "hi," 3.5-4 &quot;ok&quot;.') == \
        'He said " hi , " 3.5 - 4 " ok " .'


def test_detok_matches_sacrebleu_13a():
    hyps = ["It's a test, isn't it?", "3.14 is pi; (really)!", "Ça va – très bien."]
    refs = ["It's the test, isn't it?", "3.14 is pi (really)!", "Ça va – bien."]
    ours = bleu.multi_bleu_detok(hyps, [refs]).score
    sb = sacrebleu.corpus_bleu(hyps, [refs], tokenize="13a", smooth_method="none").score
    assert ours == pytest.approx(sb, abs=1e-6)


def test_detokenizers_unescape():
    line = "it &apos;s a &quot; test &quot; ."
    assert bleu.detokenize([line], "moses")[0] == 'it\'s a "test".'
    assert "&apos;" not in bleu.detokenize([line], "treebank_unescape")[0]
    # QKNorm Table 3 (the authors' outputs): Treebank detokenization of the escaped text as it is
    assert bleu.detokenize([line], "treebank")[0] == "it &apos;s a &quot; test &quot;."
    assert bleu.detokenize([line], "none")[0] == line
    with pytest.raises(bleu.ScoringError, match="unknown detokenizer"):
        bleu.detokenize([line], "spacy")


def test_sacrebleu_treebank_keeps_escapes_as_the_authors_did():
    hyp = ["it &apos;s a &quot; good &quot; idea ."]
    ref = ["it &apos;s a good idea &quot; ."]
    kept = (["it &apos;s a &quot; good &quot; idea."], ["it &apos;s a good idea &quot;."])
    unescaped = (["it's a \" good \" idea."], ["it's a good idea \"."])
    for method, (h, r) in (("treebank", kept), ("treebank_unescape", unescaped)):
        assert (bleu.detokenize(hyp, method), bleu.detokenize(ref, method)) == (h, r)
        ours = bleu.sacrebleu_score(bleu.detokenize(hyp, method), [bleu.detokenize(ref, method)])[0].score
        assert ours == pytest.approx(sacrebleu.corpus_bleu(h, [r]).score)
    assert sacrebleu.corpus_bleu(*kept[:1], [kept[1]]).score != sacrebleu.corpus_bleu(unescaped[0],
                                                                                       [unescaped[1]]).score


def _write(tmp_path, name, lines):
    p = tmp_path / name
    p.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return str(p)


def test_cli_json(tmp_path, capsys):
    ref = _write(tmp_path, "ref", ["a b c d e", "f g h i j"])
    h1 = _write(tmp_path, "h1", ["a b c d e", "f g h i j"])
    h2 = _write(tmp_path, "h2", ["a b c d x", "f g h i j"])
    assert cli(["--ref", ref, "--sys", f"base={h1}", "--sys", f"other={h2}", "--baseline", "base",
                "--json", "--n-samples", "50"]) == 0
    out = json.loads(capsys.readouterr().out)
    s = out["systems"]
    assert s["base"]["multi_bleu"] == pytest.approx(100.0) and s["base"]["p_value"] is None
    assert s["other"]["multi_bleu"] == pytest.approx(naive_bleu(["a b c d x", "f g h i j"], ["a b c d e", "f g h i j"]),
                                                     abs=1e-3)
    # two-sided: every resample either contains the first sentence, where other is worse, or only the
    # second one, where they tie; the smaller tail ("not worse") is the ties: p = 2 (ties + 1) / (50 + 1),
    # with the resamples drawn as the package draws them (seed 12345)
    ties = int(np.sum((np.random.default_rng(12345).integers(0, 2, size=(50, 2)) == 1).all(1)))
    assert 0 < ties < 25 and s["other"]["p_value"] == pytest.approx(2 * (ties + 1) / 51)
    assert s["other"]["sacrebleu_signature"].startswith("nrefs:1|")
    assert set(s["other"]) >= {"multi_bleu", "multi_bleu_detok", "sacrebleu", "sacrebleu_signature", "p_value"}


def test_cli_p_value_matches_a_brute_force_bootstrap(tmp_path, capsys):
    rng = random.Random(3)
    words = "the a cat dog sat on mat rug and ran".split()
    ref = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 12))) for _ in range(60)]
    # two noisy systems: each word kept with probability 0.66 / 0.7, otherwise replaced
    noisy = [[" ".join(w if rng.random() < keep else rng.choice(words) for w in r.split()) for r in ref]
             for keep in (0.66, 0.7)]
    files = [_write(tmp_path, name, lines) for name, lines in (("ref", ref), ("b", noisy[0]), ("s", noisy[1]))]
    assert cli(["--ref", files[0], "--sys", f"base={files[1]}", "--sys", f"sys={files[2]}", "--baseline", "base",
                "--json", "--n-samples", "1000"]) == 0
    p = json.loads(capsys.readouterr().out)["systems"]["sys"]["p_value"]
    one_sided = brute_force_bootstrap_p(ref, noisy[0], noisy[1], n_samples=1000)
    assert 0.02 < one_sided < 0.98  # a case where the test is not trivially decided
    expected = 2 * min(one_sided, 1 - one_sided)  # two-sided (no ties between resampled BLEU scores)
    # different resamples: sampling error only (sd of the difference ~0.037); the one-sided p is 0.22 away
    assert abs(p - expected) < 0.12


@pytest.mark.parametrize("case", ["count", "empty", "missing"])
def test_cli_errors_name_the_files(tmp_path, capsys, case):
    ref = _write(tmp_path, "ref.txt", ["a b", "c d"])
    if case == "count":
        hyp = _write(tmp_path, "hyp.txt", ["a b"])
    elif case == "empty":
        hyp = str(tmp_path / "hyp.txt")
        open(hyp, "w").close()
    else:
        hyp = str(tmp_path / "nope.txt")
    assert cli(["--ref", ref, "--sys", f"s={hyp}"]) == 2
    err = capsys.readouterr().err
    assert os.path.basename(hyp) in err
    assert {"count": "1 lines but reference", "empty": "is empty", "missing": "does not exist"}[case] in err


@pytest.mark.parametrize("flags, message", [
    (["--n-samples", "0"], "--n-samples must be positive, got 0"),
    (["--test", "ar", "--n-samples", "0"], "--n-samples must be positive, got 0"),
    (["--seed", "-1"], "--seed must be a non-negative integer, got -1"),
])
def test_cli_refuses_bad_resampling_flags(tmp_path, capsys, flags, message):
    ref = _write(tmp_path, "ref.txt", ["a b", "c d"])
    hyp = _write(tmp_path, "hyp.txt", ["a b", "c e"])
    with pytest.raises(SystemExit) as stop:
        cli(["--ref", ref, "--sys", f"a={hyp}", "--sys", f"b={ref}", "--baseline", "a", *flags])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_escape_mismatch_warns(tmp_path, capsys):
    ref = _write(tmp_path, "ref", ["it &apos;s fine"])
    hyp = _write(tmp_path, "hyp", ["it 's fine"])
    cli(["--ref", ref, "--sys", f"s={hyp}"])
    assert "Moses escapes" in capsys.readouterr().err


def test_real_text_self_and_perturbed(tmp_path):
    tst2013 = shared(os.path.join("iwslt15-en-vi", "tst2013.vi"))
    refs = bleu.read_lines(tst2013)
    assert bleu.multi_bleu(refs, [refs]).score == pytest.approx(100.0)
    rng = random.Random(0)
    pert = []
    for line in refs:
        t = line.split()
        if rng.random() < 0.4 and len(t) > 3:
            t = t[:-2]
        elif rng.random() < 0.3:
            rng.shuffle(t)
        pert.append(" ".join(t))
    ours = bleu.multi_bleu(pert, [refs]).score
    assert 20 < ours < 99
    sb = sacrebleu.corpus_bleu(pert, [refs], tokenize="none", smooth_method="none", force=True).score
    assert round(ours, 2) == round(sb, 2)
    perl = os.environ.get("QKNORM_MOSES_SCRIPTS")
    if perl and shutil.which("perl") and os.path.exists(os.path.join(perl, "multi-bleu.perl")):
        p = _write(tmp_path, "pert", pert)
        out = subprocess.run(["perl", os.path.join(perl, "multi-bleu.perl"), tst2013], stdin=open(p),
                             capture_output=True, text=True).stdout
        assert out.startswith(f"BLEU = {ours:.2f},")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
