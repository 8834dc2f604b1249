"""Paired significance tests on per-sentence BLEU statistics.

* ``paired_bootstrap`` (Koehn 2004): draw ``n_samples`` test sets of the same size with
  replacement (the same draws for both systems), score both on each; the p-value is the
  share of samples in which the system is NOT better than the baseline, with the usual +1
  correction, ``(count + 1) / (n_samples + 1)``. One-sided: H1 = "system beats baseline".
  Identical systems therefore get p = 1 and a clearly better one p = 1/(n+1).
* ``approximate_randomization`` (Riezler & Maxwell 2005): swap the two systems' outputs per
  sentence at random; p = share of swaps whose |score difference| reaches the observed one.
* ``seed_bootstrap``: the paired bootstrap over test sentences and training seeds together, for
  systems trained with several seeds (one seed each: it is ``paired_bootstrap``).

Why not sacrebleu's ``_paired_bs_test``/``_paired_ar_test`` directly: they count only
resamples whose centred difference is strictly greater than the observed one, so two
identical systems get p = 1/(n+1) ("significant"). We keep Koehn's definition and reuse
sacrebleu where it fits: its public sentence statistics and score-from-statistics for the
SacreBLEU metric, and ``estimate_ci`` for the 95% confidence interval.
"""
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


def paired_bootstrap(sys_stats, base_stats, n_samples=1000, seed=12345, score_fn=None):
    """Koehn (2004) paired bootstrap. ``score_fn`` maps summed statistics to BLEU
    (default: multi-bleu.perl's). Returns dict(p_value, delta, mean, ci)."""
    _check(sys_stats, base_stats)
    n = len(sys_stats)
    weights = resample_weights(np.random.default_rng(seed), n, n_samples)
    s_sys = _scores(sys_stats, weights, score_fn)
    s_base = _scores(base_stats, weights, score_fn)
    not_better = int(np.sum(s_sys <= s_base))
    mean, ci = estimate_ci(s_sys)
    full = np.ones((1, n))
    delta = float(_scores(sys_stats, full, score_fn)[0] - _scores(base_stats, full, score_fn)[0])
    return {"p_value": (not_better + 1) / (n_samples + 1), "delta": delta,
            "mean": float(mean), "ci": float(ci), "n_samples": n_samples, "seed": seed,
            "test": "paired_bootstrap"}


def approximate_randomization(sys_stats, base_stats, n_samples=10000, seed=12345, score_fn=None):
    """Two-sided approximate randomisation test. Returns dict(p_value, delta)."""
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
    return {"p_value": (reach + 1) / (n_samples + 1), "delta": observed,
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

    Returns the delta of the seed means on the full test set, the one-sided p of "system better"
    ((samples with delta <= 0) + 1) / (n_samples + 1), the two-sided p (twice the smaller tail,
    for a direction chosen from the same data, e.g. neighbours in a ranking), the 95% interval of
    the resampled delta, and ``floor``: the smallest one-sided p these samples can give.
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
    low, high = (int(np.sum(d <= 0)) + 1), (int(np.sum(d >= 0)) + 1)
    lo, hi = np.percentile(d, [2.5, 97.5])
    return {"p_value": low / (n_samples + 1), "p_two_sided": min(1.0, 2 * min(low, high) / (n_samples + 1)),
            "delta": delta, "ci95": [float(lo), float(hi)], "floor": 1 / (n_samples + 1),
            "n_samples": n_samples, "seed": seed, "test": "seed_bootstrap", "seeds": [len(sys_runs), len(base_runs)]}


def format_p(p, floor, two_sided=False):
    """A p-value as text; at the floor of its resamples, the bound: '< 0.001' for 1,000 samples."""
    bound = floor * (2 if two_sided else 1)
    if p <= bound * (1 + 1e-9):
        return f"< {float(f'{bound * (1 + 1e-9):.1g}'):g}"
    return f"{p:.3f}"
