"""study.md from a StudyReport (report.py computes it, stats.py its numbers), in this order:

- a summary: the ranking by either checkpoint, what the design resolves, how far the last checkpoint
  moves a score, how many runs levelled off, how the verdicts rest on the pooled seed sd;
- each system at every rate of seed 1, best-dev and last checkpoint, the rankings at each rate and
  the orderings that hold at all of them;
- test BLEU per system over seeds at the rate it is compared at; the tests of the ranking's
  neighbours and the smallest |delta| each would resolve; what the pooled seed sd changes; the
  papers' claims;
- whether each run levelled off (a running median of its dev BLEU); training wall time, the machines
  the logs name, and our speed against the stock rows'.
"""
from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from ..hardware import machine
from ..scoring.compare import fmt_mean_sd
from . import corpus
from .config import Study
from .stats import ALPHA, METRIC, N_SAMPLES, WINDOW, dev_noise, seeds_of, unresolved


@dataclass
class StudyReport:
    """What study.md shows, computed from the records of the runs it holds."""

    cfg: Study
    found: dict                 # {run: record scores, log, statistics} (records.collect), "main": at its compared rate
    rows: list                  # per system at its compared rate (stats.main_rows)
    ranked: list                # rows by mean METRIC
    tests: list                 # the neighbours' tests, a Holm family (stats.neighbours)
    pooled: Optional[tuple]     # (variance, degrees of freedom) pooled over the systems with seeds
    claims: list                # the config's claims' tests, a Holm family (stats.claim_tests)
    sensitivity: dict           # {"neighbours", "claims": stats.pooled_sensitivity of each family}
    plateau: list               # stats.plateau_rows
    gaps: list                  # stats.checkpoint_gaps
    lrs: list                   # stats.lr_rows: every system at every rate, seed 1
    lr_best: tuple              # (rankings, orderings that hold) by the best-dev checkpoint (stats.lr_conclusions)
    lr_last: tuple              # the same by the last checkpoint
    max_update: int
    warmup: int
    interval: int
    peak_lr: float              # our systems' peak LR at 1x (a multiplier study)
    signature: str              # SacreBLEU's
    command: Optional[str]      # the --report-only command that rebuilds the report
    coverage: str               # the Runs: line (coverage_text)


TEST_BLEU_LR = "![Test BLEU (seed 1) against the learning rate; a star at the rate each system is compared at](test_bleu_lr.png)"
DEV_BLEU = "![Every run's dev BLEU against updates and against wall time](dev_bleu.png)"


def plural(n, word):
    return f"{n} {word}{'s' * (n != 1)}"


def ranking_text(systems, score):
    """SYSTEMS in their order, '>' between neighbours, '=' where their scores print alike (2 decimals)."""
    text = systems[0]
    for a, b in zip(systems, systems[1:]):
        text += f" {'=' if f'{score(a):.2f}' == f'{score(b):.2f}' else '>'} {b}"
    return text


def rate_text(cfg, rate):
    return f"{rate:g}" if cfg.lr_grid else f"{rate:g}×"


def per_seed(values, digits=2):
    return " (" + ", ".join("n/a" if v is None else f"{v:.{digits}f}" for v in values) + ")" if len(values) > 1 else ""


def seeds_text(test):
    return " vs ".join(f"{k}{' (pooled sd)' if term == 'pooled' else ''}" for k, term in zip(test["seeds"], test["seed_terms"]))


def coverage_text(cfg, total, missing, waiting, short, reported, n):
    """The Runs: line: how many of the study's runs the report holds, and which it lacks: not in this
    report, or not run when the config has closed the study."""
    # a record made under a smaller budget (max_update raised since, the run not yet continued)
    short_text = (f" Short of the budget of {n} updates: {', '.join(f'{r} ({u})' for r, u in short.items())}."
                  if short else "")
    if not missing and not waiting:
        return f"Runs: all {total} of the study's." + short_text
    later = {}
    for system, seeds in waiting.items():
        later.setdefault(tuple(seeds), []).append(system)
    unnamed = [f"seed{'s' if len(k) > 1 else ''} {', '.join(map(str, k))} of {', '.join(s)} at each one's best rate of "
               "the grid" + ("" if cfg.closed else " (named once its grid runs are recorded; until then its best rate, "
                             "and what follows from it here, can change)") for k, s in later.items()]
    parts = "; ".join(([", ".join(missing)] if missing else []) + unnamed)
    if cfg.closed:
        return (f"Runs: {reported} of the study's {total}. The study is closed (closed: in {cfg.config}); not run: "
                f"{parts}." + short_text)
    return f"Runs: {reported} of the study's {total}; not in this report: {parts}." + short_text


def last_ranking(rows):
    """The ranking by the last checkpoint's mean METRIC, and the systems without one for every seed."""
    have = sorted((r for r in rows if r["last"]), key=lambda r: -r["last"][0])
    text = ranking_text([r["system"] for r in have], {r["system"]: r["last"][0] for r in have}.get) if have else "none"
    missing = [r["system"] for r in rows if not r["last"]]
    return text + (f" (no last checkpoint of every seed: {', '.join(missing)})" if missing else "")


def summary_section(r):
    mean = {row["system"]: row[METRIC][0] for row in r.rows}
    resolved = [t for t in r.tests if t["resolved"]]
    known = [t for t in r.tests if t["resolvable_delta"] is not None]
    lines = ["## Summary", "",
             f"- Ranking by mean test multi-bleu-detok at the rate each system is compared at: best-dev checkpoint "
             f"{ranking_text([row['system'] for row in r.ranked], mean.get)}; last checkpoint {last_ranking(r.rows)}."]
    if r.tests:
        which = ", ".join(f"{t['pair'][0]} {'>' if t['delta'] > 0 else '<'} {t['pair'][1]}" for t in resolved)
        text = f"- Pairs of neighbours resolved: {len(resolved)} of {len(r.tests)}" + (f" ({which})." if which else ".")
        if known:
            least = min(known, key=lambda t: t["resolvable_delta"])
            top = max(r.tests, key=lambda t: abs(t["delta"]))
            text += (f" The smallest difference between neighbours this design resolves, at these seeds and this test "
                     f"set: {least['resolvable_delta']:.2f} BLEU ({least['pair'][0]} vs {least['pair'][1]}, seeds "
                     f"{seeds_text(least)}); the largest delta between neighbours is {top['delta']:+.2f} "
                     f"({top['pair'][0]} vs {top['pair'][1]}), and the whole ranking spans "
                     f"{r.ranked[0][METRIC][0] - r.ranked[-1][METRIC][0]:.2f}.")
        else:
            text += " No seed spread is known, so the design resolves no difference."
        lines.append(text)
    if r.gaps:
        top = ", ".join(f"{run}: {best:.2f} / {last:.2f}" for run, best, last in r.gaps[:3])
        deltas = sorted(abs(t["delta"]) for t in r.tests)
        lines.append(f"- Best-dev against last checkpoint: a run's test multi-bleu-detok moves by up to "
                     f"{abs(r.gaps[0][2] - r.gaps[0][1]):.2f} ({top})"
                     + (f", against deltas of {deltas[0]:.2f} to {deltas[-1]:.2f} between neighbours" if deltas else "")
                     + "; every table of test BLEU gives both.")
    lines.append("- " + levelled_text(r.plateau))
    flips = flips_text(r)
    if flips:
        lines.append(f"- The one-seed systems' seed sd is the pooled {r.pooled[0] ** 0.5:.2f} ({r.pooled[1]} degrees of "
                     f"freedom), an assumption; verdicts that change with it halved or doubled: {flips}.")
    return lines + [""]


def lr_section(r):
    cfg, lrs = r.cfg, r.lrs
    mults = sorted({mm for row in lrs for mm in row["by_lr"]})
    lines = ["## Each system at every learning rate of the grid (seed 1)" if cfg.lr_grid else
             "## Each system at its peak learning rate and at a multiple of it (seed 1)", "",
             "| system | " + " | ".join(f"{rate_text(cfg, mm)} LR: best / last (dev)" for mm in mults) + " |",
             "|---|" + "---|" * len(mults)]
    for row in lrs:
        cells = [(f"{row['by_lr'][mm]['test']:.2f} / " + ("n/a" if row["by_lr"][mm]["last"] is None else
                                                          f"{row['by_lr'][mm]['last']:.2f}") +
                  f" ({row['by_lr'][mm]['best_dev']:.2f})") if mm in row["by_lr"] else "" for mm in mults]
        lines.append(f"| {row['system']} | " + " | ".join(cells) + " |")
    if cfg.lr_grid:
        about = ("The peak learning rates of every system's one recipe; each system's best by best dev BLEU (a tie: "
                 "the smaller) is the rate of its further seeds and of the tables below.")
    else:
        about = (f"Our systems' peak is {r.peak_lr:.3g} at 1×; the stock rows' is fairseq's IWSLT recipe's "
                 f"({cfg.config}), each times the same multiple.")
    lines += ["", "Each cell: test multi-bleu-detok of the best-dev checkpoint / of the last checkpoint (n/a: not "
              "decoded), best dev BLEU in brackets. " + about + " One seed per cell: a difference here is not tested "
              "against seed variance.", "", TEST_BLEU_LR, "", DEV_BLEU, ""]
    (best, hold), (last, hold_last) = r.lr_best, r.lr_last
    by = {row["system"]: row["by_lr"] for row in lrs}
    for mm, rk in best.items():
        text = f"- Ranking at {rate_text(cfg, mm)}: best-dev checkpoint {ranking_text(rk, lambda s, mm=mm: by[s][mm]['test'])}"
        if last.get(mm):
            text += f"; last checkpoint {ranking_text(last[mm], lambda s, mm=mm: by[s][mm]['last'])}"
        missing = [s for s in rk if s not in last.get(mm, [])]
        text += f" (no last checkpoint: {', '.join(missing)})" if missing else ""
        lines.append(text)
    both = [h for h in hold if h in hold_last]
    only = [(f"by the best-dev checkpoint but not the last (whose scores differ or were not decoded): "
             f"{', '.join(f'{a} > {b}' for a, b in hold if (a, b) not in both)}" if len(both) < len(hold) else ""),
            (f"by the last checkpoint only: {', '.join(f'{a} > {b}' for a, b in hold_last if (a, b) not in both)}"
             if len(both) < len(hold_last) else "")]
    lines += [f"- Orderings that hold at every learning rate, by both checkpoints: "
              f"{', '.join(f'{a} > {b}' for a, b in both) or 'none'}" + "".join(f"; {o}" for o in only if o), ""]
    return lines


def main_section(r):
    cfg = r.cfg
    lines = ["## Test BLEU at " + ("each system's best learning rate of the grid" if cfg.lr_grid else
                                   "the recipes' learning rates"), "",
             "| system | seeds | multi-bleu | multi-bleu-detok | last checkpoint (detok) | best dev BLEU |",
             "|---|---|---|---|---|---|"]
    for row in r.rows:
        last = (fmt_mean_sd(*row["last"]) if row["last"] else "n/a") + per_seed(row["last_per_seed"])
        # a one-seed row's tested metric shows the pooled sd its tests use
        tested = (f"{fmt_mean_sd(row[METRIC][0], r.pooled[0] ** 0.5)} (pooled sd)" if len(row["seeds"]) == 1 and r.pooled
                  else fmt_mean_sd(*row[METRIC]) + per_seed(row[METRIC + "_per_seed"]))
        lines.append(f"| {row['system']} | {len(row['seeds'])} | {fmt_mean_sd(*row['multi_bleu'])}"
                     f"{per_seed(row['multi_bleu_per_seed'])} | {tested} | {last} | {fmt_mean_sd(*row['best_dev'])} |")
    lines += ["", "Mean over seeds ± sample standard deviation, each seed's value in brackets (a system with one seed: "
              "its multi-bleu-detok ± the seed standard deviation pooled over the others, which its tests use). multi-bleu: "
              "multi-bleu.perl on the tokenized text; multi-bleu-detok: multi-bleu-detok.perl after Moses "
              f"detokenization, which is SacreBLEU ({r.signature}). The test columns decode checkpoint_best.pt, the "
              "checkpoint with the best greedy dev BLEU; 'last checkpoint' decodes checkpoint_last.pt alike (where "
              "the last validation was the best one they are the same checkpoint; n/a: a run recorded before "
              "the study kept its last checkpoint's output, whose best one came earlier). The tests below compare "
              "the best-dev checkpoints.", ""]
    return lines


def test_row(t, first):
    lo, hi = t["ci95"]
    df = "∞" if t["df"] is None else f"{t['df']:.1f}"
    return (f"| {first} | {seeds_text(t)} | {t['delta']:+.2f} | [{lo:+.2f}, {hi:+.2f}] | {df} | {t['p_text']} | "
            f"{t['p_holm_text']} | ")


def neighbours_section(r):
    mean = {row["system"]: row[METRIC][0] for row in r.rows}.get
    lines = ["## Which differences the design resolves", "",
             f"Ranking by mean multi-bleu-detok: {ranking_text([row['system'] for row in r.ranked], mean)}; by the "
             f"last checkpoint: {last_ranking(r.rows)}.", "",
             "| pair | seeds | delta | 95% interval | df | p (two-sided) | p (Holm) | resolves \\|delta\\| ≥ | resolved |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [test_row(t, f"{t['pair'][0]} vs {t['pair'][1]}")
              + ("n/a" if t["resolvable_delta"] is None else f"{t['resolvable_delta']:.2f}") + " | "
              + ("yes" if t["resolved"] else unresolved(t)) + " |" for t in r.tests]
    lines += ["", test_text(r.tests, r.pooled, r.rows), "",
              f"resolves |delta| ≥: the smallest |delta| at which the pair's Holm-adjusted p would fall below {ALPHA:g}, "
              "its standard error and degrees of freedom as tested and the other pairs' p as observed (found by "
              "bisection on Welch's t); the design resolves no smaller difference between these two systems at these "
              "seeds and this test set.", ""]
    return lines + pooled_section(r)


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
            f"{plural(len(tests), 'pair')} of neighbours in the ranking, the table's rows; "
            "p (Holm): Holm–Bonferroni adjusted "
            f"over that family. A pair is resolved when its adjusted p is below {ALPHA:g}; otherwise it is not resolved: the "
            "data do not separate the two systems, which is no evidence that they are equal. The 95% intervals are "
            "each pair's own, not adjusted.")


def sensitivity_rows(r):
    """(label, entry) of every test that uses the pooled seed sd, neighbours first, then claims."""
    claims = {tuple(t["pair"]): t["paper"] for t in r.claims}
    return ([(f"{e['pair'][0]} vs {e['pair'][1]}", e) for e in r.sensitivity["neighbours"]] +
            [(f"claim {e['pair'][0]} > {e['pair'][1]} ({claims[tuple(e['pair'])]})", e) for e in r.sensitivity["claims"]])


def flips_text(r):
    """Which verdicts change with the pooled sd halved or doubled; '' without a pooled sd in any test."""
    entries = sensitivity_rows(r)
    if not entries:
        return ""
    flips = [f"{label} {'resolved' if e[k]['resolved'] else 'not resolved'} with it {word}" for label, e in entries
             for k, word in (("sd_x0.5", "halved"), ("sd_x2", "doubled")) if e[k]["resolved"] != e["as_tested"]["resolved"]]
    return "; ".join(flips) if flips else "none"


def pooled_section(r):
    entries = sensitivity_rows(r)
    if not entries:
        return []
    sd, df = r.pooled[0] ** 0.5, r.pooled[1]
    source = [row["system"] for row in r.rows if len(row["seeds"]) > 1]

    def cell(x):
        return f"{x['p_holm']:.3f}" + (" (resolved)" if x["resolved"] else "")

    lines = ["### The pooled seed sd, an assumption", "",
             f"No one-seed system has a seed spread of its own: each is given the sd pooled over {', '.join(source)}, "
             f"{sd:.2f} ({df} degrees of freedom), which assumes it varies over seeds as they do. Each test that uses it, "
             f"retested with it halved ({sd / 2:.2f}) and doubled ({sd * 2:.2f}), its degrees of freedom and the test "
             "set's variance kept, Holm-adjusted over its family again:", "",
             f"| test | p (Holm), sd {sd / 2:.2f} | p (Holm) as tested, sd {sd:.2f} | p (Holm), sd {sd * 2:.2f} |",
             "|---|---|---|---|"]
    lines += [f"| {label} | {cell(e['sd_x0.5'])} | {cell(e['as_tested'])} | {cell(e['sd_x2'])} |" for label, e in entries]
    return lines + ["", f"Verdicts that change: {flips_text(r)}. (A smaller pooled sd can raise a p: the Welch–Satterthwaite "
                    "degrees of freedom then lean on the other system's own few seeds.)", ""]


def claims_section(r):
    m = r.cfg.model
    lines = ["## What the data say about the papers' claims", "",
             "| claim (where) | seeds | delta | 95% interval | df | p (two-sided) | p (Holm) | the data |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [test_row(t, f"{t['pair'][0]} > {t['pair'][1]} ({t['paper']})") + t["verdict"] + " |" for t in r.claims]
    lines += ["", f"Each claim: the claimed better system minus the claimed worse one, each at the rate it is compared "
              f"at, tested as the neighbours above; the family: these {len(r.claims)} claims, Holm-adjusted over "
              "it (apart from the neighbours'). Supported: resolved with the claimed sign; contradicted: resolved "
              "with the opposite sign; not resolved: the data do not separate the two systems. What is tested is the "
              f"claim at this study's size and budget (d = {m.embed_dim}, {m.layers}+{m.layers} layers, {r.max_update} "
              "updates, its own split), not the papers' published numbers.", ""]
    return lines


def levelled_text(plateau):
    """How many runs levelled off by the running-median rule and by the single-point rule, and whether
    most did by each (the aim of a study's budget)."""
    counted = [p for p in plateau if p["levelled_off"] is not None]
    k, j = sum(p["levelled_off"] for p in counted), sum(p["before_last"] for p in plateau)
    rules = [("the running-median rule", k, len(counted))] if counted else []
    rules.append(("the single-point rule (best dev BLEU before the last validation)", j, len(plateau)))
    few = len(plateau) - len(counted)
    return ("Runs that levelled off: " + ", ".join(f"{a} of {n} by {rule}" for rule, a, n in rules)
            + (f" ({plural(few, 'run')} with fewer than {2 * WINDOW} validations not judged by the running median)"
               if few else "")
            + ". Did most runs level off before the budget ended, as a study's budget aims? "
            + ", ".join(f"{'yes' if 2 * a > n else 'no'} by {rule.split(' (')[0]}" for rule, a, n in rules) + ".")


def plateau_section(r, curves):
    noise = dev_noise(r.found)
    noise = (f"Dev BLEU moves by {noise[0]:.2f} between consecutive validations of the runs' second halves in the "
             f"median (a quarter of the moves exceed {noise[1]:.2f}), so one validation says little about whether a "
             "run still improves. " if noise else "")
    w = WINDOW
    lines = ["## Whether each run levelled off", "",
             noise + f"The rule: the median of every {w} consecutive validations ({w * r.interval:,} updates); a run has "
             f"levelled off when the median of its last {w} validations is no higher than the highest median of {w} "
             f"consecutive validations that end before them (runs with fewer than {2 * w} validations are not judged). "
             f"Rise: the last {w} validations' median minus that of the {w} before them. " + levelled_text(r.plateau)
             + (" The curves:" if curves else ""), "",
             *([DEV_BLEU, ""] if curves else []),
             f"| run | best dev BLEU | first at update | median of the last {w} | highest median of {w} before them (its "
             f"last update) | rise over the {w} before | levelled off | best before the last validation |",
             "|---|---|---|---|---|---|---|---|"]
    for p in r.plateau:
        judged = p["levelled_off"] is not None
        cells = [f"{p['median_last']:.2f}", f"{p['median_before']:.2f} ({p['median_before_at']})",
                 f"{p['median_rise']:+.2f}", "yes" if p["levelled_off"] else "no"] if judged else ["n/a"] * 4
        lines.append(f"| {p['run']} | {p['best_dev']:.2f} | {p['at']} | {' | '.join(cells)} | "
                     f"{'yes' if p['before_last'] else 'no'} |")
    return lines + [""]


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
    parts = [f"{label} = {m} ({plural(count[label], 'run')})" for m, label in labels.items()]
    if "?" in count:
        parts.append(f"? = not recorded ({plural(count['?'], 'run')}: a start whose log names no machine)")
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
    return [f"Mean speed over the runs: ours {ours:.3f} updates/s ({plural(len(ups[False]), 'run')}), stock fairseq "
            f"{stock:.3f} ({plural(len(ups[True]), 'run')}): ours at {ours / stock:.2f}× stock's. A rough ratio: the "
            "logs do not show that the runs trained on the same machine or alone on it; `bash scripts/benchmark.sh "
            "fairseq-train` measures it side by side.", ""]


def wall_section(r):
    found = r.found
    labels = machine_labels(found)
    lines = ["## Training wall time", "",
             "| system | updates per seed | wall time per run, min | updates/s | machine per seed |",
             "|---|---|---|---|---|"]
    for row in r.rows:
        ups = [u / (w * 60) for u, w in zip(row["updates"], row["wall_per_seed"]) if w]
        seeds = sorted(seeds_of(found, row["system"]).items())
        lines.append(f"| {row['system']} | {' '.join(map(str, row['updates']))} | {fmt_mean_sd(*row['wall_min'], 1)}"
                     f"{per_seed(row['wall_per_seed'], 1)} | {sum(ups) / len(ups):.2f} | "
                     f"{' '.join(run_machines(v['log'], labels) for _, v in seeds)} |")
    for v in found.values():
        if not v["main"]:
            lines.append(f"| {v['run'].name} | {v['log']['updates']} | {v['log']['wall_s'] / 60:.1f} | "
                         f"{updates_per_s(v['log']):.2f} | {run_machines(v['log'], labels)} |")
    total = sum(v["log"]["wall_s"] for v in found.values()) / 60
    return lines + ["", f"Total training time: {total:.1f} min over {len(found)} runs (from the logs' timestamps; "
                    "validation included, test decoding not).", "", machines_text(found, labels), ""] + speed_text(found)


def markdown(r: StudyReport):
    cfg, m = r.cfg, r.cfg.model
    fast = " (ours on the fast path, train.sh --fast)" if cfg.fast else ""
    lines = [f"# {cfg.name}: TED gl→en, {len(r.rows)} systems", "",
             f"Command: `{r.command}`  ", f"Report built on: {machine()} (the runs' machines: Training wall time)  ",
             f"Date: {datetime.now().astimezone().isoformat(timespec='seconds')}  ",
             f"Settings: {cfg.config}; d = {m.embed_dim}, {m.layers}+{m.layers} layers, {m.heads} heads, ffn "
             f"{m.ffn_dim}; {r.max_update} updates of at most 4,096 tokens in {cfg.precision}{fast}; warmup {r.warmup}; greedy "
             f"dev BLEU every {r.interval} updates picks checkpoint_best.pt; test: beam 4, GNMT α 0.6, the TwT search, "
             f"for every system. Data: {corpus.describe(cfg)} (its own split, not the papers').  ", r.coverage, ""]
    lines += summary_section(r)
    if r.lrs:
        lines += lr_section(r)
    lines += main_section(r) + neighbours_section(r)
    if r.claims:
        lines += claims_section(r)
    lines += plateau_section(r, curves=not r.lrs)  # else in the LR section
    return "\n".join(lines + wall_section(r))
