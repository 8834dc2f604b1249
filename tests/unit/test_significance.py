"""Paired bootstrap (Koehn 2004) and approximate randomisation on per-sentence BLEU stats."""
import random

import numpy as np
import pytest
import sacrebleu

from qknorm_pipeline.scoring import bleu
import itertools

from helpers import bleu_from_stats, sentence_stats
from qknorm_pipeline.scoring.significance import (approximate_randomization, paired_bootstrap,
                                                  replicate_bootstrap)


def _corpus(seed=0, n=150):
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(40)]
    refs = [" ".join(rng.choice(vocab) for _ in range(rng.randint(6, 15))) for _ in range(n)]

    def noisy(p):
        return [" ".join(w if rng.random() > p else rng.choice(vocab) for w in r.split()) for r in refs]
    return refs, noisy


def test_identical_systems_p_near_one():
    refs, noisy = _corpus()
    hyp = noisy(0.3)
    st = bleu.multi_bleu(hyp, [refs]).stats
    assert paired_bootstrap(st, st, n_samples=300)["p_value"] == pytest.approx(1.0)
    assert approximate_randomization(st, st, n_samples=300)["p_value"] == pytest.approx(1.0)


def test_clearly_better_system_is_significant():
    refs, noisy = _corpus()
    good = bleu.multi_bleu(noisy(0.1), [refs])
    bad = bleu.multi_bleu(noisy(0.5), [refs])
    res = paired_bootstrap(good.stats, bad.stats, n_samples=1000)
    assert res["p_value"] < 0.01
    assert res["delta"] == pytest.approx(good.score - bad.score)
    # one-sided: the worse system is not better than the baseline
    assert paired_bootstrap(bad.stats, good.stats, n_samples=200)["p_value"] > 0.99
    assert approximate_randomization(good.stats, bad.stats, n_samples=500)["p_value"] < 0.01


def test_resampled_scores_match_direct_scoring():
    # the vectorised resample scorer equals scoring the resampled corpus from scratch
    refs, noisy = _corpus(1, 40)
    hyp = noisy(0.3)
    st = bleu.multi_bleu(hyp, [refs]).stats
    idx = np.random.default_rng(5).integers(0, len(hyp), len(hyp))
    direct = bleu.multi_bleu([hyp[i] for i in idx], [[refs[i] for i in idx]]).score
    assert bleu.bleu_from_stats(st[idx].sum(0)) == pytest.approx(direct)


def test_seed_reproducible_and_sacrebleu_metric():
    refs, noisy = _corpus(2)
    a, b = noisy(0.25), noisy(0.3)
    sa, sb = bleu.multi_bleu(a, [refs]).stats, bleu.multi_bleu(b, [refs]).stats
    p1 = paired_bootstrap(sa, sb, n_samples=200, seed=7)["p_value"]
    assert p1 == paired_bootstrap(sa, sb, n_samples=200, seed=7)["p_value"]
    _, _, st_a, metric = bleu.sacrebleu_score(a, [refs])
    _, _, st_b, _ = bleu.sacrebleu_score(b, [refs])
    fn = lambda row: bleu.sacrebleu_from_stats(metric, row)  # noqa: E731
    r = paired_bootstrap(st_a, st_b, n_samples=100, seed=7, score_fn=fn)
    # the same resamples scored from scratch by sacrebleu.corpus_bleu
    idx = np.random.default_rng(7).integers(0, len(refs), size=(100, len(refs)))
    score = lambda hyps, i: sacrebleu.corpus_bleu([hyps[j] for j in i], [[refs[j] for j in i]]).score  # noqa: E731
    not_better = sum(score(a, i) <= score(b, i) for i in idx)
    assert r["p_value"] == pytest.approx((not_better + 1) / 101)
    assert r == paired_bootstrap(st_a, st_b, n_samples=100, seed=7, score_fn=fn)


def test_mismatched_lengths_rejected():
    with pytest.raises(ValueError, match="same sentences"):
        paired_bootstrap(np.zeros((3, 10)), np.zeros((4, 10)))


def _runs(refs, hyps_per_seed):
    return [[sentence_stats(h, r) for h, r in zip(hyps, refs)] for hyps in hyps_per_seed]


def test_replicate_bootstrap_matches_exhaustive_enumeration_on_a_tiny_case():
    # 3 sentences, 2 seeds per system: every equally likely outcome (27 sentence resamples x 4 seed
    # draws per system) enumerated with a BLEU written independently of the package
    refs = ["a b c d e f g h", "i j k l m n o p", "q r s t u v w x"]
    sys_runs = _runs(refs, [["a b c d e f g z", "i j k l m n z z", "q r s t u v w x"],
                            ["a b c z e f g h", "i j k l m n o p", "q r z t u v z x"]])
    base_runs = _runs(refs, [["a b c d e f g h", "i j z l m n o z", "q r s z u v w z"],
                             ["a b z d e f g h", "i j k l m n o p", "q z s t u v w x"]])

    def corpus(run, idx):
        return bleu_from_stats([sum(col) for col in zip(*(run[i] for i in idx))])

    not_better = total = 0
    for idx in itertools.product(range(3), repeat=3):
        for ds in itertools.product(range(2), repeat=2):
            for db in itertools.product(range(2), repeat=2):
                m_sys = sum(corpus(sys_runs[d], idx) for d in ds) / 2
                m_base = sum(corpus(base_runs[d], idx) for d in db) / 2
                not_better += m_sys <= m_base + 1e-9
                total += 1
    exact = not_better / total
    assert 0.2 < exact < 0.8, "the case must not be trivial"
    def layout(runs):  # the package's order: lengths, then matches, then totals
        return [[[st[8], st[9], *st[0:8:2], *st[1:8:2]] for st in run] for run in runs]
    res = replicate_bootstrap(layout(sys_runs), layout(base_runs), n_samples=40000, seed=3)
    assert res["p_value"] == pytest.approx(exact, abs=0.012)  # 4 standard errors
    mean = lambda runs: sum(corpus(r, range(3)) for r in runs) / 2  # noqa: E731
    assert res["delta"] == pytest.approx(mean(sys_runs) - mean(base_runs), abs=1e-6)


def test_replicate_bootstrap_with_one_seed_is_the_paired_bootstrap():
    refs, noisy = _corpus(seed=5)
    a, b = bleu.multi_bleu(noisy(0.3), [refs]).stats, bleu.multi_bleu(noisy(0.35), [refs]).stats
    assert (replicate_bootstrap([a], [b], n_samples=500, seed=9)["p_value"]
            == paired_bootstrap(a, b, n_samples=500, seed=9)["p_value"])


def test_one_lucky_seed_is_not_significant():
    # seed 1 of the system is far better than the baseline, seed 2 far worse: the paired
    # bootstrap of seed 1 alone says significant, the test over seeds must not
    refs, noisy = _corpus(seed=2, n=300)
    good, bad = bleu.multi_bleu(noisy(0.1), [refs]).stats, bleu.multi_bleu(noisy(0.6), [refs]).stats
    base = [bleu.multi_bleu(noisy(0.35), [refs]).stats for _ in range(2)]
    assert paired_bootstrap(good, base[0], n_samples=500)["p_value"] < 0.01
    assert replicate_bootstrap([good, bad], base, n_samples=2000)["p_value"] > 0.05
    assert replicate_bootstrap([good, good], base, n_samples=2000)["p_value"] < 0.01
