"""The study's report from its records: study.md, study.json, test_bleu_lr.png and dev_bleu.png,
in this order:

- Each system at its peak LR and at a multiple of it, or at every LR of the grid (seed 1), the
  rankings at each, the orderings that hold at all of them, and test BLEU against the LR (plot).
- Test BLEU of every system at the recipes' learning rates (an lr_grid study: at each system's
  best rate of the grid by dev BLEU): mean ± sample sd over seeds with each seed's score, for the
  best-dev checkpoint (picked by greedy dev BLEU, decoded with beam 4) and for the last checkpoint.
- Every pair of neighbours in the ranking (the family of tests) with Welch's t over the seeds'
  scores plus the test set's sampling variance (scoring/significance.py, which says why): delta,
  its 95% interval, the two-sided p and its Holm-adjusted p over the family; a one-seed system gets
  the seed variance pooled over the others; a pair is resolved when its adjusted p is below 0.05
  and a seed spread is known (no system has two seeds: none is), else "not resolved".
- The papers' claims of the config (claims:), tested alike as a family of their own: supported,
  contradicted or not resolved.
- Where each run's best dev BLEU fell (before its last validation, or still improving).
- Training wall time per run and the machines it trained on, our runs' mean updates/s against the
  stock rows', and the dev-BLEU curves.
"""
import json
import math
import os
import shlex
from datetime import datetime

from ..files import write_atomic
from ..paths import machine, shareable
from ..scoring.compare import fmt_mean_sd, mean_sd
from ..scoring.score import score_runs
from ..scoring.significance import format_p, holm, pooled_variance, seed_t_test, sentence_variance
from . import config, corpus
from .config import StudyError
from .records import best_rates, read_run, recorded

METRIC = "multi_bleu_detok"
N_SAMPLES = 10000  # test-set resamples of the sentence term
ALPHA = 0.05       # a pair is resolved when its Holm-adjusted p is below this


def _score(ref, hyps, detok, lang):
    """{run: scores} and {run: per-sentence stats of METRIC and multi_bleu} of (run, hyp path)s."""
    if not hyps:
        return {}, {}
    scores, stats, _ = score_runs([ref], hyps, detok, lang)
    return scores, stats


def collect(cfg, chosen, records_dir, ref, rec):
    """Per run: its record's scores (best and last checkpoint), per-sentence statistics, log."""
    missing = [r.name for r in chosen if not recorded(records_dir, r.name)]
    if missing:
        raise StudyError(f"no record of {', '.join(missing)} in {shareable(records_dir)}/: finish them first "
                         "(bash scripts/study.sh), or report fewer systems or seeds (--systems, --seeds)")
    detok, lang = rec.eval.detok, rec.tgt
    best = [(r.name, os.path.join(records_dir, r.name, "hyp.txt")) for r in chosen]
    last = [(r.name, os.path.join(records_dir, r.name, "last", "hyp.txt")) for r in chosen
            if os.path.isfile(os.path.join(records_dir, r.name, "last", "hyp.txt"))]
    scores, stats = _score(ref, best, detok, lang)
    last_scores, _ = _score(ref, last, detok, lang)
    out = {}
    for r in chosen:
        log = read_run(os.path.join(records_dir, r.name, "train.log"))
        curve = log["curve"]
        # fairseq keeps a checkpoint_best.pt when a validation is >= the best so far: the last
        # checkpoint is the best one when the last validation is a (tied) maximum
        best_is_last = bool(curve) and curve[-1]["bleu"] >= max(p["bleu"] for p in curve)
        last_value = last_scores.get(r.name, {}).get(METRIC)
        out[r.name] = {"run": r, "test": scores[r.name], "stats": stats[r.name][METRIC], "log": log,
                       "last": last_value if last_value is not None else (scores[r.name][METRIC] if best_is_last
                                                                          else None),
                       "last_source": "decoded" if last_value is not None else ("best" if best_is_last else None)}
    return out


def coverage(cfg, found, records_dir, n):
    """What share of the study's runs the report holds: (the study's number of runs, the names of
    those not in the report, {system: [seeds]} of those not yet named (config.waiting), {run: its
    updates} of the runs found that stopped short of the budget of N updates)."""
    best = best_rates(cfg, records_dir)
    waiting = config.waiting(cfg, best=best)
    planned = [r.name for r in config.runs(cfg, best=best)]
    short = {name: v["log"]["updates"] for name, v in found.items() if v["log"]["updates"] < n}
    return len(planned) + sum(map(len, waiting.values())), [r for r in planned if r not in found], waiting, short


def coverage_text(total, missing, waiting, short, reported, n):
    # a record made under a smaller budget (max_update raised since, the run not yet continued)
    short_text = (f" Short of the budget of {n} updates: {', '.join(f'{r} ({u})' for r, u in short.items())}."
                  if short else "")
    if not missing and not waiting:
        return f"Runs: all {total} of the study's." + short_text
    later = {}
    for system, seeds in waiting.items():
        later.setdefault(tuple(seeds), []).append(system)
    unnamed = [f"seed{'s' if len(k) > 1 else ''} {', '.join(map(str, k))} of {', '.join(s)} at each one's best rate of "
               "the grid (named once its grid runs are recorded; until then its best rate, and what follows from it "
               "here, can change)" for k, s in later.items()]
    parts = ([", ".join(missing)] if missing else []) + unnamed
    return f"Runs: {reported} of the study's {total}; not in this report: {'; '.join(parts)}." + short_text


def main_rates(cfg, found):
    """{system: the rate its seeds are compared at}: 1x the peak LR, or in an lr_grid study its best
    rate of the grid by best dev BLEU (config.best_rate) among the seed-1 runs found."""
    if not cfg.lr_grid:
        return {v["run"].system: 1.0 for v in found.values()}
    dev = {}
    for v in found.values():
        if v["run"].seed == 1:
            dev.setdefault(v["run"].system, {})[v["run"].rate] = max(p["bleu"] for p in v["log"]["curve"])
    return {system: config.best_rate(by_rate) for system, by_rate in dev.items()}


def seeds_of(found, system):
    return {v["run"].seed: v for v in found.values() if v["run"].system == system and v["main"]}


def ranking_text(systems, score):
    """SYSTEMS in their order, '>' between neighbours, '=' where their scores print alike (2 decimals)."""
    text = systems[0]
    for a, b in zip(systems, systems[1:]):
        text += f" {'=' if f'{score(a):.2f}' == f'{score(b):.2f}' else '>'} {b}"
    return text


def rate_text(cfg, rate):
    return f"{rate:g}" if cfg.lr_grid else f"{rate:g}×"


def main_rows(cfg, found):
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
        row["best_dev"] = mean_sd([max(p["bleu"] for p in v["log"]["curve"]) for v in by_seed.values()])
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
    (the family), with its Holm-adjusted p."""
    ranked = sorted(rows, key=lambda r: -r[METRIC][0])
    pooled = pooled_variance([r[METRIC + "_per_seed"] for r in rows])
    tests = holm_family([pair_test(hi, lo, found, pooled) for hi, lo in zip(ranked, ranked[1:])])
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


def plateau_rows(found):
    """Per run: its best dev BLEU, the update of its first validation at that score, and its last
    validation's update."""
    rows = []
    for name, v in found.items():
        curve = v["log"]["curve"]
        best = max(p["bleu"] for p in curve)
        at = next(p["updates"] for p in curve if p["bleu"] == best)
        rows.append({"run": name, "best_dev": best, "at": at, "last": curve[-1]["updates"],
                     "before_last": at < curve[-1]["updates"]})
    return rows


def lr_rows(cfg, found):
    """Each system at seed 1 at every rate: each LR multiplier (1 included), or each LR of the grid."""
    rows = []
    for system in config.all_systems(cfg):
        runs = {v["run"].rate: v for v in found.values() if v["run"].system == system and v["run"].seed == 1}
        if len(runs) > 1:
            rows.append({"system": system, "by_lr": {m: {"test": v["test"][METRIC], "multi_bleu": v["test"]["multi_bleu"],
                                                         "best_dev": max(p["bleu"] for p in v["log"]["curve"]),
                                                         "run": v["run"].name} for m, v in sorted(runs.items())}})
    return rows


def lr_conclusions(rows):
    """The rankings at each multiplier and the pairwise orderings that hold at every one."""
    multipliers = sorted({m for r in rows for m in r["by_lr"]})
    rankings = {m: [r["system"] for r in sorted((r for r in rows if m in r["by_lr"]), key=lambda r: -r["by_lr"][m]["test"])]
                for m in multipliers}
    hold = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            diffs = [a["by_lr"][m]["test"] - b["by_lr"][m]["test"] for m in multipliers
                     if m in a["by_lr"] and m in b["by_lr"]]
            if diffs and all(d > 0 for d in diffs):
                hold.append((a["system"], b["system"]))
            elif diffs and all(d < 0 for d in diffs):
                hold.append((b["system"], a["system"]))
    return rankings, hold


def colour(plt, systems, system):
    """One colour per system of the study, the same in every plot."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return cycle[systems.index(system) % len(cycle)]


def plot(found, systems, out, title):
    """Every run's dev BLEU against updates and wall time, coloured by system (SYSTEMS: the study's)."""
    from ..plots import _save, plt  # matplotlib with the Agg backend

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for v in found.values():
        r, curve = v["run"], v["log"]["curve"]
        style = ["-", ":", "-.", (0, (1, 1))][(r.seed - 1) % 4] if v["main"] else "--"
        if r.lr is not None:
            label = f"{r.system} LR {r.lr:g} seed {r.seed}"
        else:
            label = f"{r.system} seed {r.seed}" if v["main"] else f"{r.system} {r.lr_multiplier:g}x LR"
        kw = {"color": colour(plt, systems, r.system), "ls": style, "marker": ".", "label": label, "lw": 1}
        axes[0].plot([p["updates"] for p in curve], [p["bleu"] for p in curve], **kw)
        axes[1].plot([p["wall_s"] / 60 for p in curve], [p["bleu"] for p in curve], **kw)
    axes[0].set_xlabel("updates")
    axes[1].set_xlabel("training wall time, minutes (validation included)")
    for ax in axes:
        ax.set_ylabel("dev BLEU (greedy)")
        ax.grid(alpha=0.3)
    # below both plots, where it hides no curve (savefig's tight box takes it in)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, fontsize=7)
    fig.suptitle(title)
    return _save(fig, out)


def lr_plot(cfg, lrs, main, out, title):
    """Test BLEU (seed 1) against the learning rate, one line per system (its colour in plot); a star at
    its chosen rate."""
    from ..plots import _save, plt  # matplotlib with the Agg backend

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rates = sorted({m for r in lrs for m in r["by_lr"]})
    for r in lrs:
        xs = sorted(r["by_lr"])
        c = colour(plt, config.all_systems(cfg), r["system"])
        ax.plot(xs, [r["by_lr"][x]["test"] for x in xs], marker="o", label=r["system"], color=c)
        if main.get(r["system"]) in r["by_lr"]:
            ax.plot([main[r["system"]]], [r["by_lr"][main[r["system"]]]["test"]], marker="*", ms=14, color=c, ls="none")
    ax.set_xscale("log", base=2)
    ax.set_xticks(rates, [rate_text(cfg, m) for m in rates])
    ax.minorticks_off()
    ax.set_xlabel("peak learning rate" if cfg.lr_grid else "multiple of the recipe's peak learning rate")
    ax.set_ylabel(f"test {METRIC.replace('_', '-')} (seed 1)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    return _save(fig, out)


def per_seed(values, digits=2):
    return " (" + ", ".join("n/a" if v is None else f"{v:.{digits}f}" for v in values) + ")" if len(values) > 1 else ""


def seeds_text(test):
    return " vs ".join(f"{k}{' (pooled sd)' if term == 'pooled' else ''}" for k, term in zip(test["seeds"], test["seed_terms"]))


def test_text(tests, pooled, rows):
    """How the pairs were tested, and why (significance.py has the long form)."""
    single = [r["system"] for r in rows if len(r["seeds"]) == 1]
    if single and pooled:
        one = (f"A system with one seed ({', '.join(single)}) has no seed spread of its own: its seed term is the seed "
               f"standard deviation pooled over the other systems, {pooled[0] ** 0.5:.2f} ({pooled[1]} degrees of "
               "freedom). ")
    elif single:
        one = (f"No system has two seeds, so no seed spread is known: {', '.join(single)} are tested over test "
               "sentences only, so no pair is resolved (its p says only how sure the test set is of the delta). ")
    else:
        one = ""
    return ("Welch's t test on the difference of the seed means (qknorm_pipeline/scoring/significance.py, "
            "seed_t_test): each system's seed term is the sample variance of its seeds' scores over k with k − 1 "
            "degrees of freedom, so the interval reflects how little two or three seeds say about their spread "
            "(t at 0.975: 12.7 with one degree of freedom, 4.3 with two, against the normal's 1.96); the test "
            f"set's own sampling is added to the variance (a paired bootstrap over its sentences, {N_SAMPLES:,} "
            "samples, the seeds fixed) but not to the degrees of freedom, df: the Welch–Satterthwaite degrees of "
            "freedom of the seed terms, so no interval is narrower than Welch's test on the seed scores alone. "
            "Chosen over a seed bootstrap, whose interval with two or three seeds has no heavier tails than a "
            "normal's. " + one +
            "Two-sided, since the ranking that names the pairs comes from the same data. The family of tests: the "
            f"{len(tests)} {'pair' if len(tests) == 1 else 'pairs'} of neighbours in the ranking, the table's rows; "
            "p (Holm): Holm–Bonferroni adjusted "
            f"over that family. A pair is resolved when its adjusted p is below {ALPHA:g}; otherwise it is not resolved: the "
            "data do not separate the two systems, which is no evidence that they are equal. The 95% intervals are "
            "each pair's own, not adjusted.")


TEST_BLEU_LR = "![Test BLEU (seed 1) against the learning rate; a star at the rate each system is compared at](test_bleu_lr.png)"
DEV_BLEU = "![Every run's dev BLEU against updates and against wall time](dev_bleu.png)"


def lr_section(cfg, lrs, rankings, hold, peak_lr):
    mults = sorted({mm for r in lrs for mm in r["by_lr"]})
    lines = ["## Each system at every learning rate of the grid (seed 1)" if cfg.lr_grid else
             "## Each system at its peak learning rate and at a multiple of it (seed 1)", "",
             "| system | " + " | ".join(f"{rate_text(cfg, mm)} LR: multi-bleu-detok (dev)" for mm in mults) + " |",
             "|---|" + "---|" * len(mults)]
    for r in lrs:
        cells = [f"{r['by_lr'][mm]['test']:.2f} ({r['by_lr'][mm]['best_dev']:.2f})" if mm in r["by_lr"] else ""
                 for mm in mults]
        lines.append(f"| {r['system']} | " + " | ".join(cells) + " |")
    if cfg.lr_grid:
        about = ("The peak learning rates of every system's one recipe; each system's best by best dev BLEU (a tie: "
                 "the smaller) is the rate of its further seeds and of the tables below.")
    else:
        about = (f"Our systems' peak is {peak_lr:.3g} at 1×; the stock rows' is fairseq's IWSLT recipe's "
                 f"({cfg.config}), each times the same multiple.")
    lines += ["", about + " One seed per cell: a difference here is not tested against seed variance.", "",
              TEST_BLEU_LR, "", DEV_BLEU, ""]
    by = {r["system"]: r["by_lr"] for r in lrs}
    lines += [f"- Ranking at {rate_text(cfg, mm)}: {ranking_text(rk, lambda s, mm=mm: by[s][mm]['test'])}"
              for mm, rk in rankings.items()]
    lines += [f"- Orderings that hold at every learning rate: {', '.join(f'{a} > {b}' for a, b in hold) or 'none'}", ""]
    return lines


def test_row(t, first):
    lo, hi = t["ci95"]
    df = "∞" if t["df"] is None else f"{t['df']:.1f}"
    return (f"| {first} | {seeds_text(t)} | {t['delta']:+.2f} | [{lo:+.2f}, {hi:+.2f}] | {df} | {t['p_text']} | "
            f"{t['p_holm_text']} | ")


def claims_section(cfg, claims, n):
    m = cfg.model
    lines = ["## What the data say about the papers' claims", "",
             "| claim (where) | seeds | delta | 95% interval | df | p (two-sided) | p (Holm) | the data |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [test_row(t, f"{t['pair'][0]} > {t['pair'][1]} ({t['paper']})") + t["verdict"] + " |" for t in claims]
    lines += ["", f"Each claim: the claimed better system minus the claimed worse one, each at the rate it is compared "
              f"at, tested as the neighbours above; the family: these {len(claims)} claims, Holm-adjusted over "
              "it (apart from the neighbours'). Supported: resolved with the claimed sign; contradicted: resolved "
              "with the opposite sign; not resolved: the data do not separate the two systems. What is tested is the "
              f"claim at this study's size and budget (d = {m.embed_dim}, {m.layers}+{m.layers} layers, {n} updates, "
              "its own split), not the papers' published numbers.", ""]
    return lines


def plateau_section(plateau, curves):
    before = sum(r["before_last"] for r in plateau)
    lines = ["## Where each run's best dev BLEU fell", "",
             f"{before} of {len(plateau)} runs reached their best dev BLEU before their last validation; the others "
             "were still improving when the budget ended." + (" Their curves:" if curves else ""), "",
             *([DEV_BLEU, ""] if curves else []),
             "| run | best dev BLEU | first at update | last validation | before the last |", "|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['best_dev']:.2f} | {r['at']} | {r['last']} | {'yes' if r['before_last'] else 'no'} |"
              for r in plateau]
    return lines + [""]


def markdown(cfg, rows, ranked, tests, pooled, lrs, rankings, hold, claims, plateau, found, n, warmup, interval,
             command, signature, peak_lr, runs_text):
    m = cfg.model
    lines = [f"# {cfg.name}: TED gl→en, {len(rows)} systems", "",
             f"Command: `{command}`  ", f"Report built on: {machine()} (the runs' machines: Training wall time)  ",
             f"Date: {datetime.now().astimezone().isoformat(timespec='seconds')}  ",
             f"Settings: {cfg.config}; d = {m.embed_dim}, {m.layers}+{m.layers} layers, {m.heads} heads, ffn "
             f"{m.ffn_dim}; {n} updates of at most 4,096 tokens in {cfg.precision}; warmup {warmup}; greedy dev BLEU every {interval} "
             f"updates picks checkpoint_best.pt; test: beam 4, GNMT α 0.6, the TwT search, for every system. Data: "
             f"{corpus.describe(cfg)} (its own split, not the papers').  ", runs_text, ""]
    if lrs:
        lines += lr_section(cfg, lrs, rankings, hold, peak_lr)
    lines += ["## Test BLEU at " + ("each system's best learning rate of the grid" if cfg.lr_grid else
                                    "the recipes' learning rates"), "",
              "| system | seeds | multi-bleu | multi-bleu-detok | last checkpoint (detok) | best dev BLEU |",
              "|---|---|---|---|---|---|"]
    mean = {r["system"]: r[METRIC][0] for r in rows}.get
    for r in rows:
        last = (fmt_mean_sd(*r["last"]) if r["last"] else "n/a") + per_seed(r["last_per_seed"])
        # a one-seed row's tested metric shows the pooled sd its tests use
        tested = (f"{fmt_mean_sd(r[METRIC][0], pooled[0] ** 0.5)} (pooled sd)" if len(r["seeds"]) == 1 and pooled
                  else fmt_mean_sd(*r[METRIC]) + per_seed(r[METRIC + "_per_seed"]))
        lines.append(f"| {r['system']} | {len(r['seeds'])} | {fmt_mean_sd(*r['multi_bleu'])}"
                     f"{per_seed(r['multi_bleu_per_seed'])} | {tested} | {last} | {fmt_mean_sd(*r['best_dev'])} |")
    lines += ["", "Mean over seeds ± sample standard deviation, each seed's value in brackets (a system with one seed: "
              "its multi-bleu-detok ± the seed standard deviation pooled over the others, which its tests use). multi-bleu: "
              "multi-bleu.perl on the tokenized text; multi-bleu-detok: multi-bleu-detok.perl after Moses "
              f"detokenization, which is SacreBLEU ({signature}). The test columns decode checkpoint_best.pt, the "
              "checkpoint with the best greedy dev BLEU; 'last checkpoint' decodes checkpoint_last.pt alike (where "
              "the last validation was the best one they are the same checkpoint; n/a: a run recorded before "
              "the study kept its last checkpoint's output, whose best one came earlier).", "",
              "## Which differences the design resolves", "",
              f"Ranking by mean multi-bleu-detok: {ranking_text([r['system'] for r in ranked], mean)}.", "",
              "| pair | seeds | delta | 95% interval | df | p (two-sided) | p (Holm) | resolved |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [test_row(t, f"{t['pair'][0]} vs {t['pair'][1]}") + ("yes" if t["resolved"] else unresolved(t)) + " |"
              for t in tests]
    lines += ["", test_text(tests, pooled, rows), ""]
    if claims:
        lines += claims_section(cfg, claims, n)
    lines += plateau_section(plateau, curves=not lrs)  # else in the LR section
    labels = machine_labels(found)
    lines += ["## Training wall time", "",
              "| system | updates per seed | wall time per run, min | updates/s | machine per seed |",
              "|---|---|---|---|---|"]
    for r in rows:
        ups = [u / (w * 60) for u, w in zip(r["updates"], r["wall_per_seed"]) if w]
        lines.append(f"| {r['system']} | {' '.join(map(str, r['updates']))} | {fmt_mean_sd(*r['wall_min'], 1)}"
                     f"{per_seed(r['wall_per_seed'], 1)} | {sum(ups) / len(ups):.2f} | "
                     f"{' '.join(run_machines(v['log'], labels) for _, v in sorted(seeds_of(found, r['system']).items()))} |")
    extra = [v for v in found.values() if not v["main"]]
    for v in extra:
        lines.append(f"| {v['run'].name} | {v['log']['updates']} | {v['log']['wall_s'] / 60:.1f} | "
                     f"{updates_per_s(v['log']):.2f} | {run_machines(v['log'], labels)} |")
    total = sum(v["log"]["wall_s"] for v in found.values()) / 60
    lines += ["", f"Total training time: {total:.1f} min over {len(found)} runs (from the logs' timestamps; "
              "validation included, test decoding not).", "", machines_text(found, labels), ""] + speed_text(found)
    return "\n".join(lines)


def machine_labels(found):
    """{machine: M1, M2, ...} over the runs' train logs, in the order the runs first name them."""
    labels = {}
    for v in found.values():
        for m in v["log"]["machines"]:
            if m is not None and m not in labels:
                labels[m] = f"M{len(labels) + 1}"
    return labels


def run_labels(log, labels):
    """A run's machines in the order its segments trained on them ('?': a start that logged none)."""
    return list(dict.fromkeys(labels.get(m, "?") for m in log["machines"])) or ["?"]


def run_machines(log, labels):
    return "+".join(run_labels(log, labels))  # M1, or M1+M2 for a run resumed on another machine


def machines_text(found, labels):
    count = {}
    for v in found.values():
        for label in run_labels(v["log"], labels):
            count[label] = count.get(label, 0) + 1
    parts = [f"{label} = {m} ({count[label]} run{'s' * (count[label] != 1)})" for m, label in labels.items()]
    if "?" in count:
        parts.append(f"? = not recorded ({count['?']} run{'s' * (count['?'] != 1)}: a start logged before the training "
                     "entry point named its machine)")
    return "Machines (each start of a run logs its own): " + "; ".join(parts) + "."


def updates_per_s(log):
    return log["updates"] / max(log["wall_s"], 1e-9)


def speed_text(found):
    """Our runs' mean updates/s against the stock rows', each run weighed alike; nothing without both."""
    ups = {True: [], False: []}
    for v in found.values():
        ups[v["run"].stock].append(updates_per_s(v["log"]))
    if not ups[True] or not ups[False]:
        return []
    ours, stock = (sum(u) / len(u) for u in (ups[False], ups[True]))
    n_ours, n_stock = (f"{len(u)} run{'s' * (len(u) != 1)}" for u in (ups[False], ups[True]))
    return [f"Mean speed over the runs: ours {ours:.3f} updates/s ({n_ours}), stock fairseq {stock:.3f} "
            f"({n_stock}): ours at {ours / stock:.2f}× stock's. A rough ratio: the runs trained one at a time, "
            "on the machines above; `bash scripts/benchmark.sh fairseq-train` measures it "
            "side by side.", ""]


def write(cfg, chosen, where, records_dir, max_update=None, command=None):
    """The report of the runs CHOSEN. COMMAND: the words of the study's --report-only command; the
    report's Command: line adds --runs when the report lacks some of the study's runs."""
    rec = config.recipe(cfg, os.path.join(where.data_bin, cfg.pair))
    ref = os.path.join(where.data, cfg.pair, "tok", f"test.{rec.tgt}")
    if not os.path.isfile(ref):
        raise StudyError(f"no reference {ref}: prepare the study's data first (bash scripts/study.sh --report-only)")
    found = collect(cfg, chosen, records_dir, ref, rec)
    main = main_rates(cfg, found)
    for v in found.values():
        v["main"] = v["run"].rate == main[v["run"].system]
    rows = main_rows(cfg, found)
    ranked, tests, pooled = neighbours(rows, found)
    lrs = lr_rows(cfg, found)
    rankings, hold = lr_conclusions(lrs) if lrs else ({}, [])
    claims = claim_tests(cfg, rows, found, pooled)
    plateau = plateau_rows(found)
    n, warmup, interval = config.budget(cfg, max_update)
    signature = next(iter(found.values()))["test"]["sacrebleu_signature"]
    total, missing, waiting, short = coverage(cfg, found, records_dir, n)
    command = command and shlex.join(command + (["--runs", " ".join(found)] if missing else []))
    out = where.results
    plot(found, config.all_systems(cfg), os.path.join(out, "dev_bleu.png"), f"{cfg.name}: dev BLEU, {n} updates")
    if lrs:
        lr_plot(cfg, lrs, main, os.path.join(out, "test_bleu_lr.png"), f"{cfg.name}: test BLEU, {n} updates")
    text = markdown(cfg, rows, ranked, tests, pooled, lrs, rankings, hold, claims, plateau, found, n, warmup, interval,
                    command, signature, config.peak(cfg, rec), coverage_text(total, missing, waiting, short, len(found), n))
    result = {"name": cfg.name, "max_update": n, "warmup_updates": warmup, "validate_every": interval,
              "machine": machine(), "command": command, "metric": METRIC, "sacrebleu_signature": signature,
              "precision": cfg.precision, "runs_in_study": total, "not_in_report": missing,
              "not_named_yet": waiting, "short_of_budget": short, "systems": rows, "neighbours": tests,
              "family": "pairs of neighbours in the ranking", "alpha": ALPHA,
              "pooled_seed_sd": None if pooled is None else [pooled[0] ** 0.5, pooled[1]],
              "lr": lrs, "rankings": {f"{k:g}": v for k, v in rankings.items()}, "hold_at_every_lr": hold,
              "claims": claims, "claims_family": "the config's claims", "plateau": plateau,
              "runs": {name: {"system": v["run"].system, "seed": v["run"].seed, "lr_multiplier": v["run"].lr_multiplier,
                              "lr": v["run"].lr,
                              "test": {k: v["test"][k] for k in ("multi_bleu", METRIC, "sacrebleu")},
                              "last": v["last"], "last_source": v["last_source"],
                              **{k: v["log"][k] for k in ("wall_s", "segments", "updates", "curve", "commands",
                                                          "machines")}}
                       for name, v in found.items()}}
    write_atomic(os.path.join(out, "study.json"), json.dumps(result, indent=1) + "\n")
    md = os.path.join(out, "study.md")
    write_atomic(md, text)
    return md
