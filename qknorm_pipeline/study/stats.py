"""The study's statistics, from its runs' records (records.collect):

- each system's test BLEU over its seeds at the rate it is compared at (main_rows), and every
  system at every rate of seed 1 (lr_rows, lr_conclusions), for the best-dev and last checkpoints;
- the tests of the ranking's neighbours and of the config's claims: Welch's t over the seeds' scores
  plus the test set's sampling variance (scoring/significance.py says why), Holm over each family;
  a pair is resolved when its adjusted p is below ALPHA and a seed spread is known;
- the smallest |delta| each test would resolve (resolvable), and how its verdict rests on the seed sd
  pooled for one-seed systems (pooled_sensitivity);
- where each run's dev BLEU levelled off: a running median over WINDOW validations (plateau_rows).
"""
import math
import statistics

from ..scoring.compare import mean_sd
from ..scoring.significance import format_p, holm, pooled_variance, seed_t_test, sentence_variance, two_sided_p
from . import config

METRIC = "multi_bleu_detok"
N_SAMPLES = 10000          # test-set resamples of the sentence term
ALPHA = 0.05               # a pair is resolved when its Holm-adjusted p is below this
WINDOW = 5                 # validations per running median of a dev curve
POOLED_SCALES = (0.5, 2)   # the pooled seed sd halved and doubled: what the verdicts rest on


def main_rates(cfg, found):
    """{system: the rate its seeds are compared at}: 1x the peak LR, or in an lr_grid study its best
    rate of the grid by best dev BLEU (config.best_rate) among the seed-1 runs found."""
    if not cfg.lr_grid:
        return {v["run"].system: 1.0 for v in found.values()}
    dev = {}
    for v in found.values():
        if v["run"].seed == 1:
            dev.setdefault(v["run"].system, {})[v["run"].rate] = best_dev(v)
    return {system: config.best_rate(by_rate) for system, by_rate in dev.items()}


def best_dev(v):
    return max(p["bleu"] for p in v["log"]["curve"])


def seeds_of(found, system):
    return {v["run"].seed: v for v in found.values() if v["run"].system == system and v["main"]}


def main_rows(cfg, found):
    """Per system with runs at its compared rate: each seed's scores (best-dev and last checkpoint),
    their mean and sample sd, best dev BLEU, wall time and updates."""
    rows = []
    for system in config.all_systems(cfg):
        by_seed = dict(sorted(seeds_of(found, system).items()))
        if not by_seed:
            continue
        row = {"system": system, "seeds": list(by_seed)}
        for m in ("multi_bleu", METRIC):
            values = [v["test"][m] for v in by_seed.values()]
            row[m] = mean_sd(values)
            row[m + "_per_seed"] = values
        lasts = [v["last"] for v in by_seed.values()]
        row["last"] = mean_sd(lasts) if None not in lasts else None
        row["last_per_seed"] = lasts
        row["best_dev"] = mean_sd([best_dev(v) for v in by_seed.values()])
        row["wall_min"] = mean_sd([v["log"]["wall_s"] / 60 for v in by_seed.values()])
        row["wall_per_seed"] = [v["log"]["wall_s"] / 60 for v in by_seed.values()]
        row["updates"] = [v["log"]["updates"] for v in by_seed.values()]
        rows.append(row)
    return rows


def pair_test(hi, lo, found, pooled):
    """Row HI minus row LO: Welch's t over their seeds' scores plus the test set's sampling variance."""
    a = [v["stats"] for v in seeds_of(found, hi["system"]).values()]
    b = [v["stats"] for v in seeds_of(found, lo["system"]).values()]
    res = seed_t_test(hi[METRIC + "_per_seed"], lo[METRIC + "_per_seed"], pooled=pooled,
                      sentence_var=sentence_variance(a, b, n_samples=N_SAMPLES, seed=12345))
    return {"pair": [hi["system"], lo["system"]], **{k: res[k] for k in (
        "seeds", "seed_terms", "seed_spread_known", "delta", "se", "ci95", "p_two_sided", "sentence_var")},
        "df": None if math.isinf(res["df"]) else res["df"], "p_text": format_p(res["p_two_sided"], alpha=ALPHA)}  # None: a normal


def unresolved(test):
    return "not resolved" if test["seed_spread_known"] else "not resolved (no seed spread known)"


def holm_family(tests):
    """TESTS with their Holm-adjusted p over this family, and whether each is resolved."""
    for t, adjusted in zip(tests, holm([t["p_two_sided"] for t in tests])):
        # without any seed spread the test knows only the test set's sampling: it cannot resolve a pair
        t.update(p_holm=adjusted, p_holm_text=format_p(adjusted, alpha=ALPHA), resolved=adjusted < ALPHA and t["seed_spread_known"])
    return tests


def neighbours(rows, found):
    """Ranking by mean METRIC, the pooled seed variance, and the test of each pair of neighbours in it
    (the family), with its Holm-adjusted p and the smallest |delta| it would resolve."""
    ranked = sorted(rows, key=lambda r: -r[METRIC][0])
    pooled = pooled_variance([r[METRIC + "_per_seed"] for r in rows])
    tests = holm_family([pair_test(hi, lo, found, pooled) for hi, lo in zip(ranked, ranked[1:])])
    for t, d in zip(tests, resolvable(tests)):
        t["resolvable_delta"] = d
    return ranked, tests, pooled


def claim_tests(cfg, rows, found, pooled):
    """Each ordering of the config's claims whose two systems have rows: the claimed better minus the
    claimed worse, tested as the neighbours are, Holm-adjusted over the claims (a family of its own)."""
    by = {r["system"]: r for r in rows}
    tests = holm_family([{**pair_test(by[c.better], by[c.worse], found, pooled), "paper": c.paper}
                         for c in cfg.claims if c.better in by and c.worse in by])
    for t in tests:
        t["verdict"] = ("supported" if t["delta"] > 0 else "contradicted") if t["resolved"] else unresolved(t)
    return tests


def resolvable(tests, alpha=ALPHA):
    """Per test of a family: the smallest |delta| at which its Holm-adjusted p would fall below ALPHA,
    with its standard error and degrees of freedom as tested and the other tests' p as observed
    (bisection: a larger |delta| only lowers the p, and Holm's adjusted p never falls as a p rises);
    None for a test without a known seed spread, which resolves nothing."""
    out = []
    for i, t in enumerate(tests):
        if not t["seed_spread_known"]:
            out.append(None)
            continue
        df = float("inf") if t["df"] is None else t["df"]

        def resolved(delta, i=i, t=t, df=df):
            p = [u["p_two_sided"] for u in tests]
            p[i] = two_sided_p(delta, t["se"], df)
            return holm(p)[i] < alpha

        lo, hi = 0.0, max(t["se"], 1e-9)
        while not resolved(hi):
            lo, hi = hi, 2 * hi
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if resolved(mid) else (mid, hi)
        out.append(hi)
    return out


def pooled_sensitivity(tests, rows, pooled, scales=POOLED_SCALES):
    """How a family's verdicts rest on the pooled seed sd of its one-seed systems: per test that uses
    it, its Holm-adjusted p (over the family, retested alike) and whether it is resolved with the
    pooled sd times each of SCALES, its degrees of freedom and every test's sentence variance as
    tested. [] when no test uses it."""
    if pooled is None or not any("pooled" in t["seed_terms"] for t in tests):
        return []
    by = {r["system"]: r[METRIC + "_per_seed"] for r in rows}
    out = {i: {"pair": t["pair"], "as_tested": {"p_holm": t["p_holm"], "resolved": t["resolved"]}}
           for i, t in enumerate(tests) if "pooled" in t["seed_terms"]}
    for scale in scales:
        p = [seed_t_test(by[t["pair"][0]], by[t["pair"][1]], sentence_var=t["sentence_var"],
                         pooled=(pooled[0] * scale ** 2, pooled[1]))["p_two_sided"] for t in tests]
        for i, adjusted in enumerate(holm(p)):
            if i in out:
                out[i][f"sd_x{scale:g}"] = {"p_holm": adjusted, "resolved": adjusted < ALPHA and tests[i]["seed_spread_known"]}
    return list(out.values())


def running_median(values, window=WINDOW):
    """The median of each WINDOW consecutive VALUES, the first window ending at values[window - 1]."""
    return [statistics.median(values[j - window + 1:j + 1]) for j in range(window - 1, len(values))]


def plateau_rows(found, window=WINDOW):
    """Per run: its best dev BLEU, the update of its first validation at that score, its last
    validation's update (the single-point rule: best before the last validation), and the running
    median of its dev BLEU over WINDOW validations: the last window's, the highest of the windows that
    end before the last one starts (the update that ends it), the last one's rise over the window
    just before it, and whether the run levelled off: its last window's median is no higher than
    that highest one (None with fewer than 2 x WINDOW validations)."""
    rows = []
    for name, v in found.items():
        curve = v["log"]["curve"]
        bleu = [p["bleu"] for p in curve]
        best = max(bleu)
        at = next(p["updates"] for p in curve if p["bleu"] == best)
        row = {"run": name, "best_dev": best, "at": at, "last": curve[-1]["updates"], "before_last": at < curve[-1]["updates"],
               "median_last": None, "median_before": None, "median_before_at": None, "median_rise": None,
               "levelled_off": None}
        medians = running_median(bleu, window)
        if len(medians) > window:
            earlier = medians[:-window]  # the windows that do not overlap the last one
            top = max(range(len(earlier)), key=lambda j: (earlier[j], -j))  # the first of the highest
            row.update(median_last=medians[-1], median_before=earlier[top], median_before_at=curve[top + window - 1]["updates"],
                       median_rise=medians[-1] - medians[-1 - window], levelled_off=medians[-1] <= earlier[top])
        rows.append(row)
    return rows


def lr_rows(cfg, found):
    """Each system at seed 1 at every rate: each LR multiplier (1 included), or each LR of the grid;
    test METRIC of the best-dev and the last checkpoint (None: not decoded)."""
    rows = []
    for system in config.all_systems(cfg):
        runs = {v["run"].rate: v for v in found.values() if v["run"].system == system and v["run"].seed == 1}
        if len(runs) > 1:
            rows.append({"system": system, "by_lr": {m: {"test": v["test"][METRIC], "multi_bleu": v["test"]["multi_bleu"],
                                                         "last": v["last"], "best_dev": best_dev(v), "run": v["run"].name}
                                                     for m, v in sorted(runs.items())}})
    return rows


def lr_conclusions(rows, key="test"):
    """The rankings at each rate by KEY ('test': the best-dev checkpoint, 'last': the last one; a run
    without that score is left out) and the pairwise orderings that hold at every rate both systems
    have runs at (none for a pair with a score missing at one of them)."""
    def score(r, m):
        return r["by_lr"][m][key] if m in r["by_lr"] else None

    multipliers = sorted({m for r in rows for m in r["by_lr"]})
    rankings = {m: [r["system"] for r in sorted((r for r in rows if score(r, m) is not None), key=lambda r: -score(r, m))]
                for m in multipliers}
    hold = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            shared = [m for m in multipliers if m in a["by_lr"] and m in b["by_lr"]]
            if any(None in (score(a, m), score(b, m)) for m in shared):
                continue
            diffs = [score(a, m) - score(b, m) for m in shared]
            if diffs and all(d > 0 for d in diffs):
                hold.append((a["system"], b["system"]))
            elif diffs and all(d < 0 for d in diffs):
                hold.append((b["system"], a["system"]))
    return rankings, hold


def checkpoint_gaps(found):
    """[(run, best-dev checkpoint's test METRIC, last checkpoint's)] of the runs whose last checkpoint
    differs from their best, the largest |difference| first."""
    gaps = [(name, v["test"][METRIC], v["last"]) for name, v in found.items()
            if v["last"] is not None and v["last_source"] == "decoded"]
    return sorted(gaps, key=lambda g: -abs(g[2] - g[1]))


def dev_noise(found):
    """(median, upper quartile) of the |change| of dev BLEU between consecutive validations over each
    run's second half, where the curves are flattest; None without two such validations."""
    steps = []
    for v in found.values():
        curve = v["log"]["curve"][len(v["log"]["curve"]) // 2:]
        steps += [abs(b["bleu"] - a["bleu"]) for a, b in zip(curve, curve[1:])]
    if len(steps) < 2:
        return None
    return statistics.median(steps), statistics.quantiles(steps, n=4)[2]
