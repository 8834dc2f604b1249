"""Significance tests: over test sentences (per-sentence BLEU statistics) and over training seeds.

Every test here gives a two-sided p (``p_two_sided``), and both tables use it: compare.sh's (the
demo's) and the study's report. Two-sided, because no direction was fixed before the data were seen:
compare.sh tests every system against the baseline whichever way each falls, and the report tests
neighbours in a ranking drawn from the same data; it is also what a reviewer assumes. (Where a paper
did predict the direction, a one-sided p would be about half of it.)

* ``paired_bootstrap`` (Koehn 2004): draw ``n_samples`` test sets of the same size with
  replacement (the same draws for both systems), score both on each; each tail is the share of
  samples in which the system is not better (not worse) than the baseline, with the usual +1
  correction, ``(count + 1) / (n_samples + 1)``, and p is twice the smaller tail, at most 1
  (``bootstrap_p``). Identical systems therefore get p = 1 and a clearly different one
  p = 2/(n+1).
* ``approximate_randomization`` (Riezler & Maxwell 2005): swap the two systems' outputs per
  sentence at random; p = share of swaps whose |score difference| reaches the observed one.
* ``seed_bootstrap``: the paired bootstrap over test sentences and training seeds together (one
  seed each: it is ``paired_bootstrap``). Not used for seeds any more: with 2-3 seeds a system has
  only k^k seed draws and the resampled delta has no heavier tails than a normal, so its interval
  is too narrow (fairseq_transformer vs postnorm in the gl-en study: p at the floor of 10,000
  samples, against p = 0.012 by Welch's t on the same four seed scores).

Why not sacrebleu's ``_paired_bs_test``/``_paired_ar_test`` directly: they count only
resamples whose centred difference is strictly greater than the observed one, so two
identical systems get p = 1/(n+1) ("significant"). We keep Koehn's definition and reuse
sacrebleu where it fits: its public sentence statistics and score-from-statistics for the
SacreBLEU metric, and ``estimate_ci`` for the 95% confidence interval.

Systems trained with a few seeds (the study's report; compare.sh with seeds):

* ``seed_t_test``: Welch's t test of the difference of two systems' seed means. Chosen over a
  widened seed bootstrap because the t distribution with k - 1 degrees of freedom is exactly the
  allowance for a spread estimated from k seeds (t at 0.975: 12.7 with 1 degree of freedom, 4.3
  with 2, against the normal's 1.96), Welch's form needs no equal variances, and it is the textbook
  test a reviewer can recompute from the per-seed scores (scipy.stats.ttest_ind checks it). A system
  with one seed has no spread of its own: it gets ``pooled_variance``, the seed variance pooled
  over the other systems, with their degrees of freedom. ``sentence_variance`` (a paired bootstrap
  over test sentences with the seeds fixed) adds the test set's own sampling to the variance but
  no degrees of freedom: they stay Welch-Satterthwaite's of the seed terms, so the interval is never
  narrower than Welch's on the seed scores alone (what a reviewer recomputes) nor than the sentence
  bootstrap's. (Satterthwaite's formula would count the bootstrap term as known and raise the
  degrees of freedom: for that pair 4.3 instead of 2.0, p 0.001 instead of 0.018.)
* ``holm``: Holm-Bonferroni adjusted p-values over a named family of tests.

A bootstrap p has a floor, ``bootstrap_floor``: 2 / (n_samples + 1); a p at the floor is a bound,
and ``format_p`` prints it as "≤ FLOOR (resampling floor)". A t test's p has no floor.
scipy (the t distribution) is a dependency of the package (pyproject.toml).
"""
import math

import numpy as np
from sacrebleu.significance import estimate_ci

from .bleu import bleu_from_stats


def _scores(stats, weights, score_fn):
    """Scores of resampled corpora: weights (n_samples, n_sent) @ stats (n_sent, k)."""
    sums = weights @ np.asarray(stats, dtype=np.float64)
    if score_fn is None:
        return bleu_from_stats(sums)
    return np.array([score_fn(row) for row in sums])


def _check(sys_stats, base_stats):
    if len(sys_stats) != len(base_stats):
        raise ValueError(f"paired test needs the same sentences: system has {len(sys_stats)}, "
                         f"baseline {len(base_stats)}")
    if len(sys_stats) == 0:
        raise ValueError("paired test on an empty test set")


def bootstrap_floor(n_samples):
    """The smallest p a bootstrap of N_SAMPLES resamples can give (two-sided)."""
    return 2 / (n_samples + 1)


def bootstrap_p(d):
    """The two-sided p of the resampled deltas D (system minus baseline): twice the smaller tail,
    each with the +1 correction, at most 1."""
    low, high = int(np.sum(d <= 0)) + 1, int(np.sum(d >= 0)) + 1
    return min(1.0, bootstrap_floor(len(d)) * min(low, high))


def paired_bootstrap(sys_stats, base_stats, n_samples=1000, seed=12345, score_fn=None):
    """Koehn (2004) paired bootstrap. ``score_fn`` maps summed statistics to BLEU
    (default: multi-bleu.perl's). Returns dict(p_two_sided, delta, mean, ci)."""
    _check(sys_stats, base_stats)
    n = len(sys_stats)
    weights = resample_weights(np.random.default_rng(seed), n, n_samples)
    s_sys = _scores(sys_stats, weights, score_fn)
    s_base = _scores(base_stats, weights, score_fn)
    mean, ci = estimate_ci(s_sys)
    full = np.ones((1, n))
    delta = float(_scores(sys_stats, full, score_fn)[0] - _scores(base_stats, full, score_fn)[0])
    return {"p_two_sided": bootstrap_p(s_sys - s_base), "delta": delta,
            "mean": float(mean), "ci": float(ci), "n_samples": n_samples, "seed": seed,
            "test": "paired_bootstrap"}


def approximate_randomization(sys_stats, base_stats, n_samples=10000, seed=12345, score_fn=None):
    """Approximate randomisation test. Returns dict(p_two_sided, delta)."""
    _check(sys_stats, base_stats)
    a = np.asarray(sys_stats, dtype=np.float64)
    b = np.asarray(base_stats, dtype=np.float64)
    rng = np.random.default_rng(seed)
    swap = rng.integers(0, 2, size=(n_samples, len(a))).astype(np.float64)
    full = np.ones((1, len(a)))
    observed = float(_scores(a, full, score_fn)[0] - _scores(b, full, score_fn)[0])
    diff_ab = a - b
    # pseudo-systems: A' = A + swap*(B-A), B' = B + swap*(A-B), summed over sentences
    shuf_a = _scores_offset(a, -diff_ab, swap, score_fn)
    shuf_b = _scores_offset(b, diff_ab, swap, score_fn)
    reach = int(np.sum(np.abs(shuf_a - shuf_b) >= abs(observed) - 1e-9))
    return {"p_two_sided": (reach + 1) / (n_samples + 1), "delta": observed,
            "n_samples": n_samples, "seed": seed, "test": "approximate_randomization"}


def _scores_offset(base, offset, swap, score_fn):
    sums = base.sum(0)[None, :] + swap @ offset
    if score_fn is None:
        return bleu_from_stats(sums)
    return np.array([score_fn(row) for row in sums])


def resample_weights(rng, n_sentences, n_samples):
    """(n_samples, n_sentences) counts of each sentence in each resampled test set, so that one
    matrix product scores every resample."""
    idx = rng.integers(0, n_sentences, size=(n_samples, n_sentences))
    weights = np.zeros((n_samples, n_sentences))
    np.add.at(weights, (np.arange(n_samples)[:, None], idx), 1)
    return weights


def seed_means(scores, rng):
    """One bootstrap mean over seeds per column of SCORES (seeds, samples): the seeds are drawn with
    replacement after spreading each column's scores around their mean by sqrt(k / (k - 1)), so that
    the drawn mean of k seeds has the variance s^2 / k of a mean of k new seeds (s^2: the sample
    variance over seeds), where plain drawing gives (k - 1) / k of it (s^2 / 4 for two seeds)."""
    k, n = scores.shape
    if k > 1:
        centre = scores.mean(0)
        scores = centre + np.sqrt(k / (k - 1)) * (scores - centre)
    drawn = rng.integers(0, k, size=(k, n))
    return scores[drawn, np.arange(n)].mean(0)


def seed_bootstrap(sys_runs, base_runs, n_samples=1000, seed=12345, score_fn=None):
    """Significance over training seeds and test sentences together (a two-level bootstrap).

    ``sys_runs`` and ``base_runs`` hold one entry per seed: that run's per-sentence statistics.
    Each of ``n_samples`` samples draws one test set of sentences with replacement (the same for
    every run), scores every run on it, and for each system draws as many seeds as it has, with
    replacement, after the variance correction of ``seed_means``; a system's value is the mean of
    its drawn seeds. So the spread between seeds enters the test as the spread between sentences
    does, and a difference that one lucky seed produced is not significant (the motivation of
    MultEval, Clark et al. 2011). With one seed per system no seed variance can be estimated, and
    the test is Koehn's paired bootstrap over sentences only (``seeds`` in the result says so).

    Returns the delta of the seed means on the full test set, the two-sided p (``bootstrap_p``),
    the 95% interval of the resampled delta, and ``floor``: the smallest p these samples can give.
    Random draws, in order: the sentences, then the system's seeds, then the baseline's.
    """
    runs = [np.asarray(r, dtype=np.float64) for r in list(sys_runs) + list(base_runs)]
    if not sys_runs or not base_runs:
        raise ValueError("the seed bootstrap needs at least one run per system")
    for r in runs[1:]:
        _check(r, runs[0])
    n = len(runs[0])
    rng = np.random.default_rng(seed)
    weights = resample_weights(rng, n, n_samples)

    def draws(stats_list):
        return seed_means(np.stack([_scores(s, weights, score_fn) for s in stats_list]), rng)

    d = draws(runs[:len(sys_runs)]) - draws(runs[len(sys_runs):])
    full = np.ones((1, n))
    delta = float(np.mean([_scores(r, full, score_fn)[0] for r in runs[:len(sys_runs)]])
                  - np.mean([_scores(r, full, score_fn)[0] for r in runs[len(sys_runs):]]))
    lo, hi = np.percentile(d, [2.5, 97.5])
    return {"p_two_sided": bootstrap_p(d), "delta": delta, "ci95": [float(lo), float(hi)],
            "floor": bootstrap_floor(n_samples),
            "n_samples": n_samples, "seed": seed, "test": "seed_bootstrap", "seeds": [len(sys_runs), len(base_runs)]}


def sentence_variance(sys_runs, base_runs, n_samples=1000, seed=12345, score_fn=None):
    """Variance of the delta of two systems' seed means over resampled test sets: each of
    ``n_samples`` samples draws the sentences with replacement (the same for every run) and scores
    every run on them; the seeds are kept. The test set's share of the uncertainty of the delta."""
    runs = [np.asarray(r, dtype=np.float64) for r in list(sys_runs) + list(base_runs)]
    if not sys_runs or not base_runs:
        raise ValueError("the sentence variance needs at least one run per system")
    for r in runs[1:]:
        _check(r, runs[0])
    weights = resample_weights(np.random.default_rng(seed), len(runs[0]), n_samples)
    scores = np.stack([_scores(r, weights, score_fn) for r in runs])
    d = scores[:len(sys_runs)].mean(0) - scores[len(sys_runs):].mean(0)
    return float(np.var(d, ddof=1))


def pooled_variance(groups):
    """(variance, degrees of freedom) pooled over the per-seed scores of several systems:
    sum (k - 1) s^2 / sum (k - 1) over the systems with two or more seeds; None if there are none."""
    groups = [list(g) for g in groups if len(g) > 1]
    df = sum(len(g) - 1 for g in groups)
    if not df:
        return None
    return sum((len(g) - 1) * float(np.var(g, ddof=1)) for g in groups) / df, df


def _seed_term(scores, pooled):
    """(variance of the seed mean, its degrees of freedom, the source of the variance) of one system."""
    k = len(scores)
    if k > 1:
        return float(np.var(scores, ddof=1)) / k, k - 1, "own"
    if pooled is not None:
        return pooled[0], pooled[1], "pooled"
    return 0.0, math.inf, "unknown"


def seed_t_test(sys_scores, base_scores, sentence_var=0.0, pooled=None):
    """Welch's t test of the difference of two systems' seed means (see the module docstring).

    ``sys_scores`` and ``base_scores``: each seed's score. ``pooled``: (variance, degrees of freedom)
    for a system with one seed (``pooled_variance`` of the others); without it that system's seed
    term is unknown and left out (``seed_terms`` says so). ``sentence_var``: a variance added to the
    seed terms v_i (``sentence_variance``), not to their degrees of freedom, Welch-Satterthwaite's
    (sum v_i)^2 / sum (v_i^2 / df_i); the pooled estimate's when both terms are it (one estimate,
    counted once); the fewest of the terms' when no seed varied (0/0); infinite (a normal) only when
    neither system's seed spread is known (``seed_spread_known`` false: the p is then the test set's
    alone, which the study report does not count as resolving a pair).
    Returns the delta of the means, its standard error, the degrees of freedom, t, the two-sided p
    and the 95% interval delta +- t(0.975, df) * se."""
    from scipy import stats as scipy_stats  # here: 0.5 s to import, which --help need not wait for

    if not len(sys_scores) or not len(base_scores):
        raise ValueError("the t test needs at least one seed per system")
    terms = [_seed_term(sys_scores, pooled), _seed_term(base_scores, pooled)]
    delta = float(np.mean(sys_scores) - np.mean(base_scores))
    seeds = terms[0][0] + terms[1][0]
    denominator = sum(v * v / df for v, df, _ in terms)
    if [src for _, _, src in terms] == ["pooled", "pooled"]:
        df = pooled[1]  # one estimate serves both terms: its degrees of freedom count once
    elif denominator:
        df = seeds * seeds / denominator
    else:  # no seed varied: Welch-Satterthwaite is 0/0; the fewest degrees of freedom, never a normal's
        df = min(df for _, df, _ in terms)  # inf only when neither spread is known
    se = math.sqrt(seeds + sentence_var)
    t = t_statistic(delta, se)
    half = float(scipy_stats.t.ppf(0.975, df)) * se
    return {"delta": delta, "se": se, "df": df, "t": t, "p_two_sided": two_sided_p(delta, se, df),
            "ci95": [delta - half, delta + half],
            "seeds": [len(sys_scores), len(base_scores)], "seed_terms": [terms[0][2], terms[1][2]],
            "seed_spread_known": "unknown" not in (terms[0][2], terms[1][2]),
            "sentence_var": sentence_var, "test": "seed_t_test"}


def t_statistic(delta, se):
    """DELTA / SE; with no spread at all (SE 0) 0 for no difference and infinite for any other."""
    if se == 0:
        return 0.0 if delta == 0 else math.copysign(math.inf, delta)
    return delta / se


def two_sided_p(delta, se, df):
    """The two-sided p of a difference DELTA with standard error SE under Student's t with DF degrees
    of freedom (infinite: a normal), as seed_t_test gives it."""
    from scipy import stats as scipy_stats

    return float(2 * scipy_stats.t.sf(abs(t_statistic(delta, se)), df))


def holm(p_values):
    """Holm-Bonferroni adjusted p-values, in the order given: the i-th smallest of m p-values times
    (m - i + 1), raised to the largest adjusted value before it, at most 1. A test of the family is
    significant at level a when its adjusted p is below a; the family-wise error is then at most a."""
    if any(math.isnan(p) for p in p_values):
        raise ValueError(f"holm: a p-value is NaN ({list(p_values)}): a test of the family failed; fix it or leave it out")
    m = len(p_values)
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: p_values[j])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _round_up(x):
    """X rounded up to one significant digit (a bound stays a bound): 0.00019998 -> 0.0002."""
    e = math.floor(math.log10(x))
    return math.ceil(x / 10**e - 1e-9) * 10**e


def format_p(p, floor=None, alpha=None):
    """A p-value as text. FLOOR: the smallest p its resamples can give (``bootstrap_floor``); a p at
    it is a bound, '≤ 0.002 (resampling floor)' for 1,000 samples. Otherwise three
    decimals, or two significant digits below 0.001 (a t test's p has no floor). ALPHA: the level
    the p is judged against; a p on one side of it keeps the digits that show which (0.04999,
    not 0.050)."""
    if floor is not None and p <= floor * (1 + 1e-9):
        return f"≤ {_round_up(floor):g} (resampling floor)"
    if p == 0:  # below the smallest double: a bound, not a zero
        return "< 1e-300"
    if p < 0.001:
        return f"{p:.1e}"
    digits = 3
    while alpha is not None and digits < 12 and (float(f"{p:.{digits}f}") < alpha) != (p < alpha):
        digits += 1
    return f"{p:.{digits}f}"
