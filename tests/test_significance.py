"""Paired bootstrap (Koehn 2004) and approximate randomisation on per-sentence BLEU stats."""
import random

import numpy as np
import pytest

from qknorm_fairseq.scoring import bleu
from qknorm_fairseq.scoring.significance import approximate_randomization, paired_bootstrap


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
    fn = lambda row: metric._compute_score_from_stats(list(row)).score  # noqa: E731
    r = paired_bootstrap(st_a, st_b, n_samples=100, seed=7, score_fn=fn)
    assert 0 < r["p_value"] <= 1
    assert r == paired_bootstrap(st_a, st_b, n_samples=100, seed=7, score_fn=fn)


def test_mismatched_lengths_rejected():
    with pytest.raises(ValueError, match="same sentences"):
        paired_bootstrap(np.zeros((3, 10)), np.zeros((4, 10)))
