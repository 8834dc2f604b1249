"""Paired bootstrap (Koehn 2004), approximate randomisation and the seed bootstrap on per-sentence
BLEU statistics, against textbook BLEU written independently of the package."""
import itertools
import random

import numpy as np
import pytest
import sacrebleu
from scipy import stats as scipy_stats

from qknorm_pipeline.scoring import bleu
from qknorm_pipeline.scoring.significance import (
    approximate_randomization,
    bootstrap_floor,
    bootstrap_p,
    format_p,
    holm,
    paired_bootstrap,
    pooled_variance,
    seed_bootstrap,
    seed_means,
    seed_t_test,
    sentence_variance,
)

from helpers import bleu_from_stats, sentence_stats


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
    assert paired_bootstrap(st, st, n_samples=300)["p_two_sided"] == pytest.approx(1.0)
    assert approximate_randomization(st, st, n_samples=300)["p_two_sided"] == pytest.approx(1.0)


def test_clearly_better_system_is_significant():
    refs, noisy = _corpus()
    good = bleu.multi_bleu(noisy(0.1), [refs])
    bad = bleu.multi_bleu(noisy(0.5), [refs])
    res = paired_bootstrap(good.stats, bad.stats, n_samples=1000)
    assert res["p_two_sided"] == bootstrap_floor(1000)
    assert res["delta"] == pytest.approx(good.score - bad.score)
    # two-sided: a clearly worse system is as significant, with the opposite delta
    worse = paired_bootstrap(bad.stats, good.stats, n_samples=1000)
    assert worse["p_two_sided"] == bootstrap_floor(1000) and worse["delta"] == pytest.approx(-res["delta"])
    assert approximate_randomization(good.stats, bad.stats, n_samples=500)["p_two_sided"] < 0.01


def test_bootstrap_p_is_twice_the_smaller_tail():
    # tails with the +1 correction: d <= 0 in 1 + 1 of 5, d >= 0 in 4 + 1; p = 2 * 2 / 6
    assert bootstrap_p(np.array([-1.0, 2.0, 3.0, 4.0, 5.0])) == pytest.approx(4 / 6)
    assert bootstrap_p(np.array([-1.0, -2.0, -3.0, -4.0, 5.0])) == pytest.approx(4 / 6)
    assert bootstrap_p(np.array([1.0, 2.0, 3.0])) == bootstrap_floor(3) == 2 / 4
    assert bootstrap_p(np.array([0.0, 1.0, -1.0])) == 1.0  # at most 1


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
    p1 = paired_bootstrap(sa, sb, n_samples=200, seed=7)["p_two_sided"]
    assert p1 == paired_bootstrap(sa, sb, n_samples=200, seed=7)["p_two_sided"]
    _, _, st_a, metric = bleu.sacrebleu_score(a, [refs])
    _, _, st_b, _ = bleu.sacrebleu_score(b, [refs])
    fn = lambda row: bleu.sacrebleu_from_stats(metric, row)  # noqa: E731
    r = paired_bootstrap(st_a, st_b, n_samples=100, seed=7, score_fn=fn)
    # the same resamples scored from scratch by sacrebleu.corpus_bleu
    idx = np.random.default_rng(7).integers(0, len(refs), size=(100, len(refs)))
    score = lambda hyps, i: sacrebleu.corpus_bleu([hyps[j] for j in i], [[refs[j] for j in i]]).score  # noqa: E731
    not_better = sum(score(a, i) <= score(b, i) for i in idx)
    not_worse = sum(score(a, i) >= score(b, i) for i in idx)
    assert r["p_two_sided"] == pytest.approx(min(1, 2 * (min(not_better, not_worse) + 1) / 101))
    assert r == paired_bootstrap(st_a, st_b, n_samples=100, seed=7, score_fn=fn)


def test_mismatched_lengths_rejected():
    with pytest.raises(ValueError, match="same sentences"):
        paired_bootstrap(np.zeros((3, 10)), np.zeros((4, 10)))
    with pytest.raises(ValueError, match="same sentences"):
        seed_bootstrap([np.zeros((3, 10))], [np.zeros((3, 10)), np.zeros((4, 10))])


def _textbook(refs, hyps_per_seed):
    return [[sentence_stats(h, r) for h, r in zip(hyps, refs)] for hyps in hyps_per_seed]


def _package_layout(runs):
    """textbook stats (matches/totals interleaved, then lengths) in the package's column order:
    lengths, then matches, then totals."""
    return [[[st[8], st[9], *st[0:8:2], *st[1:8:2]] for st in run] for run in runs]


def _corpus_bleu(run, idx):
    return bleu_from_stats([sum(col) for col in zip(*(run[i] for i in idx))])


def test_seed_bootstrap_equals_the_procedure_written_out():
    # the same random draws (sentences, then the system's seeds, then the baseline's), every resample
    # scored from scratch with textbook BLEU, the seeds' spread widened by sqrt(k / (k - 1)) by hand
    refs, noisy = _corpus(seed=3, n=25)
    sys_runs = _textbook(refs, [noisy(0.25), noisy(0.3), noisy(0.2)])
    base_runs = _textbook(refs, [noisy(0.3), noisy(0.35)])
    n_samples, n = 150, len(refs)
    rng = np.random.default_rng(11)
    idx = rng.integers(0, n, size=(n_samples, n))

    def drawn_means(runs):
        k = len(runs)
        scores = np.array([[_corpus_bleu(run, sample) for sample in idx] for run in runs])
        centre = scores.mean(0)
        widened = centre + np.sqrt(k / (k - 1)) * (scores - centre)
        picks = rng.integers(0, k, size=(k, n_samples))
        return np.array([widened[picks[:, j], j].mean() for j in range(n_samples)])

    d = drawn_means(sys_runs) - drawn_means(base_runs)
    res = seed_bootstrap(_package_layout(sys_runs), _package_layout(base_runs), n_samples=n_samples, seed=11)
    assert res["p_two_sided"] == pytest.approx(min(1, 2 * (min(np.sum(d <= 0), np.sum(d >= 0)) + 1) / (n_samples + 1)))
    assert res["ci95"] == pytest.approx(list(np.percentile(d, [2.5, 97.5])))
    full = range(n)
    assert res["delta"] == pytest.approx(np.mean([_corpus_bleu(r, full) for r in sys_runs])
                                         - np.mean([_corpus_bleu(r, full) for r in base_runs]))


def test_seed_bootstrap_matches_exhaustive_enumeration_on_a_tiny_case():
    # 3 sentences, 2 seeds per system: every equally likely outcome (27 sentence resamples x 4 seed
    # draws per system) enumerated, with each system's two scores spread by sqrt(2) around their mean
    refs = ["a b c d e f g h", "i j k l m n o p", "q r s t u v w x"]
    sys_runs = _textbook(refs, [["a b c d e f g z", "i j k l m n z z", "q r s t u v w x"],
                                ["a b c z e f g h", "i j k l m n o p", "q r z t u v z x"]])
    base_runs = _textbook(refs, [["a b c d e f g h", "i j z l m n o z", "q r s z u v w z"],
                                 ["a b z d e f g h", "i j k l m n o p", "q z s t u v w x"]])

    def widened(runs, idx):
        s = [_corpus_bleu(run, idx) for run in runs]
        c = sum(s) / 2
        return [c + 2 ** 0.5 * (x - c) for x in s]

    not_better = not_worse = total = 0
    for idx in itertools.product(range(3), repeat=3):
        ws, wb = widened(sys_runs, idx), widened(base_runs, idx)
        for ds in itertools.product(range(2), repeat=2):
            for db in itertools.product(range(2), repeat=2):
                d = sum(ws[d] for d in ds) / 2 - sum(wb[d] for d in db) / 2
                not_better += d <= 1e-9
                not_worse += d >= -1e-9
                total += 1
    exact = 2 * min(not_better, not_worse) / total
    assert 0.2 < exact < 0.95, "the case must not be trivial"
    res = seed_bootstrap(_package_layout(sys_runs), _package_layout(base_runs), n_samples=40000, seed=3)
    assert res["p_two_sided"] == pytest.approx(exact, abs=0.02)  # 4 standard errors


def test_seed_means_have_the_variance_of_a_mean_of_new_seeds():
    # two seeds 2 apart: sample variance s^2 = 2, so a mean of two new seeds varies by s^2 / 2 = 1;
    # drawing the two scores with replacement without the widening would give 0.5
    scores = np.tile([[10.0], [12.0]], (1, 200000))
    drawn = seed_means(scores, np.random.default_rng(0))
    assert drawn.mean() == pytest.approx(11.0, abs=0.01)
    assert drawn.var() == pytest.approx(1.0, rel=0.02)


def test_seed_bootstrap_with_one_seed_is_the_paired_bootstrap():
    refs, noisy = _corpus(seed=5)
    a, b = bleu.multi_bleu(noisy(0.3), [refs]).stats, bleu.multi_bleu(noisy(0.35), [refs]).stats
    res = seed_bootstrap([a], [b], n_samples=500, seed=9)
    assert res["p_two_sided"] == paired_bootstrap(a, b, n_samples=500, seed=9)["p_two_sided"]
    assert res["seeds"] == [1, 1]


def test_one_lucky_seed_is_not_significant():
    # seed 1 of the system is far better than the baseline, seed 2 far worse: the paired
    # bootstrap of seed 1 alone says significant, the test over seeds must not
    refs, noisy = _corpus(seed=2, n=300)
    good, bad = bleu.multi_bleu(noisy(0.1), [refs]).stats, bleu.multi_bleu(noisy(0.6), [refs]).stats
    base = [bleu.multi_bleu(noisy(0.35), [refs]).stats for _ in range(2)]
    assert paired_bootstrap(good, base[0], n_samples=500)["p_two_sided"] < 0.01
    assert seed_bootstrap([good, bad], base, n_samples=2000)["p_two_sided"] > 0.05
    assert seed_bootstrap([good, good], base, n_samples=2000)["p_two_sided"] < 0.01


def test_format_p_shows_the_floor_as_a_bound():
    # the floor rounded up, so the bound stays true: 1/1001 < 0.001, 2/10001 < 0.0002
    assert format_p(1 / 1001, 1 / 1001) == "≤ 0.001 (resampling floor)"
    assert format_p(2 / 10001, 2 / 10001) == "≤ 0.0002 (resampling floor)"
    assert format_p(1 / 10001, 1 / 10001) == "≤ 0.0001 (resampling floor)"
    assert format_p(1 / 3, 1 / 3) == "≤ 0.4 (resampling floor)"
    assert format_p(0.0123, 1 / 1001) == "0.012"
    # no floor (a t test): small values with two significant digits, never 0 and never a bound
    assert format_p(0.0123) == "0.012" and format_p(3.21e-5) == "3.2e-05" and format_p(1e-300) == "1.0e-300"
    assert format_p(0.0) == "< 1e-300"  # below the smallest double: a bound
    # judged against a level: a p just below it keeps the digits that show it, one at or above prints as before
    assert format_p(0.04999) == "0.050" and format_p(0.04999, alpha=0.05) == "0.04999"
    assert format_p(0.0499996, alpha=0.05) == "0.0499996" and format_p(0.00996, alpha=0.01) == "0.00996"
    assert format_p(0.05, alpha=0.05) == "0.050" and format_p(0.05004, alpha=0.05) == "0.050"
    assert format_p(0.0123, alpha=0.05) == "0.012" and format_p(4e-4, alpha=0.05) == "4.0e-04"


def test_holm_against_a_hand_computation():
    # m = 4. Sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04, raised to 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1, and the running maximum keeps the order of the raw p-values
    assert holm([0.3, 0.5, 0.2]) == pytest.approx([0.6, 0.6, 0.6])
    assert holm([0.6, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([0.02]) == [0.02] and holm([]) == []


def test_seed_t_test_is_welchs_test():
    a, b = [6.29, 6.68, 6.09], [5.66, 6.34, 6.09]
    res = seed_t_test(a, b)
    ref = scipy_stats.ttest_ind(a, b, equal_var=False)
    assert res["t"] == pytest.approx(ref.statistic) and res["df"] == pytest.approx(ref.df)
    assert res["p_two_sided"] == pytest.approx(ref.pvalue)
    assert res["ci95"] == pytest.approx(list(ref.confidence_interval(0.95)))
    assert seed_t_test(b, a)["p_two_sided"] == pytest.approx(res["p_two_sided"])  # either direction
    assert res["delta"] == pytest.approx(np.mean(a) - np.mean(b)) and res["seed_terms"] == ["own", "own"]
    # two seeds each: the study's fairseq_transformer against postnorm, one degree of freedom short of 3
    two = seed_t_test([3.28, 2.99], [1.12, 1.43])
    assert two["p_two_sided"] == pytest.approx(scipy_stats.ttest_ind([3.28, 2.99], [1.12, 1.43], equal_var=False).pvalue)
    assert 0.01 < two["p_two_sided"] < 0.02


def test_pooled_variance_and_a_one_seed_system_by_hand():
    # variances 1 (1, 2, 3: 2 df) and 2 (4, 6: 1 df); one seed: no df. Pooled (2 * 1 + 1 * 2) / 3 = 4/3
    assert pooled_variance([[1, 2, 3], [4, 6], [9]]) == pytest.approx((4 / 3, 3))
    assert pooled_variance([[9], [5]]) is None
    # 9 (one seed, pooled 4/3 with 3 df) against 4, 6 (variance 2, mean 5): terms 4/3 and 2/2 = 1
    res = seed_t_test([9], [4, 6], pooled=(4 / 3, 3))
    var = 4 / 3 + 1
    df = var ** 2 / ((4 / 3) ** 2 / 3 + 1 ** 2 / 1)
    assert res["df"] == pytest.approx(df) and res["se"] == pytest.approx(var ** 0.5)
    assert res["t"] == pytest.approx(4 / var ** 0.5)
    assert res["p_two_sided"] == pytest.approx(2 * scipy_stats.t.sf(4 / var ** 0.5, df))
    assert res["seed_terms"] == ["pooled", "own"]
    # no pooled variance: the one-seed system's term is unknown and left out, and said so
    assert seed_t_test([9], [4, 6])["seed_terms"] == ["unknown", "own"]
    assert seed_t_test([9], [4, 6])["seed_spread_known"] is False and res["seed_spread_known"] is True


def test_two_one_seed_systems_count_the_pooled_degrees_of_freedom_once():
    # pooled over [14.1, 13.5, 14.6] and [12.0, 12.9]: one estimate with 3 df serves both terms, so the
    # difference's variance is 2 s_p^2 with 3 df (Welch-Satterthwaite on two copies would give 6)
    sp2, df = pooled_variance([[14.1, 13.5, 14.6], [12.0, 12.9]])
    assert df == 3
    res = seed_t_test([15.0], [13.0], pooled=(sp2, df))
    assert res["seed_terms"] == ["pooled", "pooled"] and res["df"] == 3
    t = 2.0 / (2 * sp2) ** 0.5
    assert res["p_two_sided"] == pytest.approx(2 * scipy_stats.t.sf(t, 3))
    assert res["ci95"][1] - 2.0 == pytest.approx(scipy_stats.t.ppf(0.975, 3) * (2 * sp2) ** 0.5)


def test_seeds_that_did_not_vary_keep_their_degrees_of_freedom():
    # every seed the same: Welch-Satterthwaite is 0/0; the test keeps the fewest df (1), never a normal's
    res = seed_t_test([20.0, 20.0], [19.0, 19.0, 19.0], sentence_var=0.04)
    assert res["df"] == 1
    assert res["p_two_sided"] == pytest.approx(2 * scipy_stats.t.sf(1.0 / 0.2, 1))
    # one of them varied: Welch-Satterthwaite's df of the other's alone
    assert seed_t_test([20.0, 20.0], [19.0, 19.5, 18.5])["df"] == pytest.approx(2)


def test_holm_refuses_a_nan():
    with pytest.raises(ValueError, match=r"holm: a p-value is NaN \(\[nan, 0.01, 0.02\]\)"):
        holm([float("nan"), 0.01, 0.02])


def test_the_sentence_variance_widens_without_adding_degrees_of_freedom():
    # the seed terms' Welch-Satterthwaite df, (v1 + v2)^2 / (v1^2 / df1 + v2^2 / df2), the sentence
    # variance s only in the standard error: never narrower than Welch's test on the seed scores
    a, b, s = [1.0, 2.0, 3.0], [0.0, 0.5], 0.25
    v1, v2 = 1 / 3, 0.125 / 2
    res = seed_t_test(a, b, sentence_var=s)
    assert res["se"] == pytest.approx((v1 + v2 + s) ** 0.5)
    assert res["df"] == pytest.approx((v1 + v2) ** 2 / (v1 ** 2 / 2 + v2 ** 2 / 1))
    assert res["df"] == pytest.approx(scipy_stats.ttest_ind(a, b, equal_var=False).df)
    half = scipy_stats.t.ppf(0.975, res["df"]) * (v1 + v2 + s) ** 0.5
    assert res["ci95"] == pytest.approx([1.75 - half, 1.75 + half])
    assert res["p_two_sided"] > scipy_stats.ttest_ind(a, b, equal_var=False).pvalue
    # seeds that agree exactly: only the test set's variance, but two seeds' degrees of freedom, not a normal's
    only = seed_t_test([2.0, 2.0], [1.0, 1.0], sentence_var=0.25)
    assert only["df"] == 1 and only["ci95"] == pytest.approx([1 - 12.706205 * 0.5, 1 + 12.706205 * 0.5])


def test_the_t_interval_covers_with_two_seeds_where_a_normal_one_does_not():
    # 4,000 simulated studies, two seeds per system, no true difference: Welch's 95% interval covers
    # 0 at least 95% of the time; the same standard error with the normal's 1.96 does far less often
    rng = np.random.default_rng(0)
    covered = normal = 0
    for _ in range(4000):
        a, b = rng.normal(0, 1, 2), rng.normal(0, 1, 2)
        res = seed_t_test(a, b)
        covered += res["ci95"][0] <= 0 <= res["ci95"][1]
        normal += abs(res["delta"]) <= 1.96 * res["se"]
    assert covered / 4000 >= 0.945
    assert normal / 4000 < 0.88


def test_sentence_variance_equals_the_procedure_written_out():
    # the same draws of sentences, every resample scored from scratch with textbook BLEU, the
    # systems' seed means differenced, the variance over samples
    refs, noisy = _corpus(seed=4, n=25)
    sys_runs = _textbook(refs, [noisy(0.25), noisy(0.3)])
    base_runs = _textbook(refs, [noisy(0.3), noisy(0.35), noisy(0.2)])
    n_samples, n = 120, len(refs)
    idx = np.random.default_rng(13).integers(0, n, size=(n_samples, n))
    d = [np.mean([_corpus_bleu(r, sample) for r in sys_runs]) - np.mean([_corpus_bleu(r, sample) for r in base_runs])
         for sample in idx]
    got = sentence_variance(_package_layout(sys_runs), _package_layout(base_runs), n_samples=n_samples, seed=13)
    assert got == pytest.approx(np.var(d, ddof=1))
    assert got > 0
