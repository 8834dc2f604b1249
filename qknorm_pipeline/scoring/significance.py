"""Paired significance tests on per-sentence BLEU statistics.

* ``paired_bootstrap`` (Koehn 2004): draw ``n_samples`` test sets of the same size with
  replacement (the same draws for both systems), score both on each; the p-value is the
  share of samples in which the system is NOT better than the baseline, with the usual +1
  correction, ``(count + 1) / (n_samples + 1)``. One-sided: H1 = "system beats baseline".
  Identical systems therefore get p = 1 and a clearly better one p = 1/(n+1).
* ``approximate_randomization`` (Riezler & Maxwell 2005): swap the two systems' outputs per
  sentence at random; p = share of swaps whose |score difference| reaches the observed one.

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
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_samples, n))
    # counts of each sentence in each resample, so one matrix product scores all samples
    weights = np.zeros((n_samples, n))
    np.add.at(weights, (np.arange(n_samples)[:, None], idx), 1)
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


def replicate_bootstrap(sys_runs, base_runs, n_samples=1000, seed=12345, score_fn=None):
    """Significance over training seeds (replicates) and sentences together.

    ``sys_runs`` and ``base_runs`` are lists with one entry per seed: that run's per-sentence
    statistics. Each sample draws one test set of sentences with replacement (the same for every
    run) and, independently for each system, as many seeds as it has, with replacement; a
    system's score on the sample is the mean BLEU of its drawn seeds on the drawn sentences. So
    the spread between seeds enters the test as the spread between sentences does: a difference
    that one lucky seed produced is not significant (MultEval's motivation, Clark et al. 2011,
    here as a two-level bootstrap instead of their stratified randomisation). One-sided like
    ``paired_bootstrap``: p = (samples where the system's mean is not above the baseline's + 1)
    / (n_samples + 1); with one seed per system it is Koehn's paired bootstrap.
    """
    runs = [np.asarray(r, dtype=np.float64) for r in list(sys_runs) + list(base_runs)]
    if not sys_runs or not base_runs:
        raise ValueError("replicate bootstrap needs at least one run per system")
    for r in runs[1:]:
        _check(r, runs[0])
    n = len(runs[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_samples, n))
    weights = np.zeros((n_samples, n))
    np.add.at(weights, (np.arange(n_samples)[:, None], idx), 1)

    def mean_of_drawn_seeds(stats_list):
        scores = np.stack([_scores(s, weights, score_fn) for s in stats_list])  # (seeds, samples)
        drawn = rng.integers(0, len(stats_list), size=(len(stats_list), n_samples))
        return scores[drawn, np.arange(n_samples)].mean(0)

    s_sys = mean_of_drawn_seeds(runs[:len(sys_runs)])
    s_base = mean_of_drawn_seeds(runs[len(sys_runs):])
    full = np.ones((1, n))
    delta = float(np.mean([_scores(r, full, score_fn)[0] for r in runs[:len(sys_runs)]])
                  - np.mean([_scores(r, full, score_fn)[0] for r in runs[len(sys_runs):]]))
    return {"p_value": (int(np.sum(s_sys <= s_base)) + 1) / (n_samples + 1), "delta": delta,
            "n_samples": n_samples, "seed": seed, "test": "replicate_bootstrap",
            "seeds": [len(sys_runs), len(base_runs)]}
