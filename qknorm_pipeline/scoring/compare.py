"""One comparison table per pair: every evaluated system, every metric, the delta to the
baseline with its paired-bootstrap p-value, and the papers' published numbers beside ours.

    python -m qknorm_pipeline.scoring.compare --pair PAIR --results-dir DIR [--baseline NAME]
        [--metric M] [--detok D] [--lang L] [--published results/published.csv]

Reads DIR/PAIR/<system>/{hyp.txt,scores.json} (written by scripts/evaluate.sh) and writes
DIR/PAIR/compare.{md,csv,json}. ``sacrebleu_treebank`` is SacreBLEU after NLTK's Treebank
detokenizer (QKNorm Table 3's procedure); the other metrics follow scripts/evaluate.sh.
"""
import csv
import io
import json
import os
import re
import statistics
import sys

from ..paths import ROOT, shareable
from .bleu import DETOKENIZERS, ScoringError
from ..files import write_atomic
from .evaluate import METRICS, score_runs, score_systems
from .significance import replicate_bootstrap
from ..cli import Parser, fail

ALL_METRICS = METRICS + ("sacrebleu_treebank",)
DEFAULT_PUBLISHED = os.path.join(ROOT, "results", "published.csv")
# Baseline preference when none is named: TwT's baseline, then QKNorm's (Nguyen & Salazar).
BASELINE_ORDER = ("postnorm", "scalenorm", "prenorm")
# A run trained with `train.sh --seed K` (K != 1) is named SYSTEM_seedK; the plain SYSTEM is seed 1.
SEED_RUN = re.compile(r"^(?P<system>.+)_seed(?P<seed>[0-9]+)$")


def group_runs(runs):
    """{system: {seed: run name}} of evaluated run names."""
    groups = {}
    for run in runs:
        m = SEED_RUN.match(run)
        system, seed = (m["system"], int(m["seed"])) if m else (run, 1)
        if seed in groups.setdefault(system, {}):
            raise ScoringError(f"runs {groups[system][seed]!r} and {run!r} are both seed {seed} of {system}")
        groups[system][seed] = run
    return {s: dict(sorted(g.items())) for s, g in sorted(groups.items())}


def load_published(path, pair):
    if not os.path.exists(path):
        raise ScoringError(f"published numbers {path!r} not found")
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["pair"] == pair]
    for r in rows:
        if r["metric"] not in ALL_METRICS:
            raise ScoringError(f"{path}: unknown metric {r['metric']!r} (expected one of {ALL_METRICS})")
        r["bleu"] = float(r["bleu"])
    return rows


def find_systems(pair_dir, only=None):
    """The evaluated runs in pair_dir (<run>/scores.json + hyp.txt); only: just these, each required."""
    if not os.path.isdir(pair_dir):
        raise ScoringError(f"no results in {pair_dir!r}: run scripts/evaluate.sh first")
    systems = []
    for name in sorted(os.listdir(pair_dir)):
        d = os.path.join(pair_dir, name)
        if os.path.isfile(os.path.join(d, "scores.json")) and os.path.isfile(os.path.join(d, "hyp.txt")):
            systems.append(name)
    if only is not None:
        missing = [r for r in only if r not in systems]
        if missing:
            raise ScoringError(f"--runs: no evaluated run {', '.join(missing)} in {pair_dir!r} "
                               f"(have: {', '.join(systems) or 'none'}); evaluate it first or leave it out")
        systems = [s for s in systems if s in only]
    if not systems:
        raise ScoringError(f"no evaluated systems (<system>/scores.json + hyp.txt) in {pair_dir!r}")
    return systems


def build(pair, results_dir, published_path=DEFAULT_PUBLISHED, baseline=None, metric=None, detok=None,
          lang="en", n_samples=1000, seed=12345, treebank_detok="treebank", runs=None):
    pair_dir = os.path.join(results_dir, pair)
    systems = find_systems(pair_dir, runs)
    metas = {s: json.load(open(os.path.join(pair_dir, s, "scores.json"))) for s in systems}
    # scores.json names the reference relative to the repository when it lies inside it (shareable);
    # older ones name it absolutely: the same file either way
    refs = {tuple(os.path.normpath(os.path.join(ROOT, r)) for r in m["reference"]) for m in metas.values()}
    if len(refs) != 1:
        raise ScoringError(f"systems of {pair} were scored against different references: {sorted(refs)}")
    ref = list(refs.pop())
    first = metas[systems[0]]
    metric = metric or first["metric"]
    detok = detok or first["detok"]
    if baseline is None:
        baseline = next((b for b in BASELINE_ORDER if b in systems), systems[0])
    elif baseline not in systems:
        raise ScoringError(f"baseline {baseline!r} has no results in {pair_dir} (have: {', '.join(systems)})")
    groups = group_runs(systems)
    if any(len(g) > 1 for g in groups.values()):
        return build_seeds(pair, pair_dir, groups, ref, metric, detok, lang, baseline, published_path,
                           n_samples, seed, treebank_detok)
    hyps = [(s, os.path.join(pair_dir, s, "hyp.txt")) for s in systems]
    main = score_systems(ref, hyps, baseline=baseline, detok=detok, lang=lang, metric=metric,
                         n_samples=n_samples, seed=seed)
    tb = score_systems(ref, hyps, detok=treebank_detok, lang=lang)
    published = load_published(published_path, pair)
    rows = []
    for s in systems:
        r = main["systems"][s]
        row = {"system": s, **{m: r[m] for m in METRICS},
               "sacrebleu_treebank": tb["systems"][s]["sacrebleu"],
               "delta": r["delta"], "p_value": r["p_value"],
               "significant": None if r["p_value"] is None else r["p_value"] < 0.01}
        row["published"] = beside_published(row, published)
        rows.append(row)
    return {"pair": pair, "baseline": baseline, "metric": metric, "detok": detok,
            "reference": [shareable(r) for r in ref],
            "treebank_detok": treebank_detok,
            "n_samples": n_samples, "seed": seed,
            "sacrebleu_signature": main["systems"][baseline]["sacrebleu_signature"], "rows": rows}


def beside_published(row, published):
    """The published numbers of row's system, each with our score in its metric."""
    return [{"source": f"{p['paper']} T{p['table']}", "metric": p["metric"], "bleu": p["bleu"],
             "ours": row[p["metric"]], "diff": round(row[p["metric"]] - p["bleu"], 2)}
            for p in published if p["system"] == row["system"] and not p["variant"]]


def build_seeds(pair, pair_dir, groups, ref, metric, detok, lang, baseline, published_path, n_samples,
                seed, treebank_detok):
    """The table when some system was trained with several seeds: per metric the mean and the
    sample standard deviation over seeds, every seed's score, and the replicate bootstrap."""
    if baseline is None or baseline not in groups:
        if baseline is not None and baseline in {r for g in groups.values() for r in g.values()}:
            baseline = next(s for s, g in groups.items() if baseline in g.values())
        else:
            baseline = next((b for b in BASELINE_ORDER if b in groups), next(iter(groups)))
    runs = [(run, os.path.join(pair_dir, run, "hyp.txt")) for g in groups.values() for run in g.values()]
    scores, stats, score_fns = score_runs(ref, runs, detok, lang)
    tb, _, _ = score_runs(ref, runs, treebank_detok, lang)
    for run in scores:
        scores[run]["sacrebleu_treebank"] = tb[run]["sacrebleu"]
    published = load_published(published_path, pair)
    rows = []
    for system, by_seed in groups.items():
        per_seed = {k: {m: scores[run][m] for m in ALL_METRICS} for k, run in by_seed.items()}
        row = {"system": system, "seeds": list(by_seed), "runs": dict(by_seed), "per_seed": per_seed}
        for m in ALL_METRICS:
            mean, sd = mean_sd([v[m] for v in per_seed.values()])
            row[m], row[m + "_sd"] = round(mean, 4), None if sd is None else round(sd, 4)
        row["delta"] = row["p_value"] = row["significant"] = None
        if system != baseline:
            res = replicate_bootstrap([stats[r][metric] for r in by_seed.values()],
                                      [stats[r][metric] for r in groups[baseline].values()],
                                      n_samples=n_samples, seed=seed, score_fn=score_fns[metric])
            row.update(delta=round(res["delta"], 4), p_value=res["p_value"], significant=res["p_value"] < 0.01)
        row["published"] = beside_published(row, published)
        rows.append(row)
    first = next(iter(scores.values()))
    return {"pair": pair, "baseline": baseline, "metric": metric, "detok": detok,
            "reference": [shareable(r) for r in ref], "treebank_detok": treebank_detok,
            "n_samples": n_samples, "seed": seed, "test": "replicate_bootstrap", "seeds": True,
            "sacrebleu_signature": first["sacrebleu_signature"], "rows": rows}


def _sources(table):
    seen = []
    for r in table["rows"]:
        for p in r["published"]:
            key = (p["source"], p["metric"])
            if key not in seen:
                seen.append(key)
    return seen


def mean_sd(values):
    """Mean and sample standard deviation over seeds (sd None for one seed)."""
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def fmt_mean_sd(mean, sd, digits=2):
    return f"{mean:.{digits}f}" + ("" if sd is None else f" ± {sd:.{digits}f}")


def to_rows(table):
    """Flat rows (header first) shared by the CSV and Markdown outputs."""
    sources = _sources(table)
    header = ["system", *ALL_METRICS, f"delta {table['metric']}", "p"]
    for src, m in sources:  # each published number beside ours in its own metric
        header += [f"{src} published ({m})", f"ours ({m})"]
    if table.get("seeds"):
        header[len(ALL_METRICS) + 1:len(ALL_METRICS) + 1] = ["seeds", f"per seed ({table['metric']})"]
    out = [header]
    for r in table["rows"]:
        if table.get("seeds"):
            cells = [r["system"]] + [fmt_mean_sd(r[m], r[m + "_sd"]) for m in ALL_METRICS]
            cells += [str(len(r["seeds"])),
                      " ".join(f"{r['per_seed'][k][table['metric']]:.2f}" for k in r["seeds"])]
        else:
            cells = [r["system"]] + [f"{r[m]:.2f}" for m in ALL_METRICS]
        cells.append("" if r["delta"] is None or r["system"] == table["baseline"] else f"{r['delta']:+.2f}")
        cells.append("" if r["p_value"] is None else f"{r['p_value']:.3f}" + (" *" if r["significant"] else ""))
        pub = {(p["source"], p["metric"]): p for p in r["published"]}
        for key in sources:
            cells += [f"{pub[key]['bleu']:.2f}", f"{pub[key]['ours']:.2f}"] if key in pub else ["", ""]
        out.append(cells)
    return out


def to_markdown(table):
    rows = to_rows(table)
    lines = [f"# {table['pair']}: test BLEU", "",
             "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    if table.get("seeds"):
        test = (f"mean over seeds ± sample standard deviation; delta of the means and p on {table['metric']} "
                f"from the replicate bootstrap (test sentences and training seeds resampled together, "
                f"{table['n_samples']} samples, seed {table['seed']}; one-sided, * = p < 0.01)")
    else:
        test = (f"Delta and p on {table['metric']} (paired bootstrap, {table['n_samples']} samples, "
                f"seed {table['seed']}; one-sided, * = p < 0.01)")
    lines += ["", f"Baseline: {table['baseline']}. {test[0].upper() + test[1:]}. "
              f"Detokenizer for multi_bleu_detok/sacrebleu: {table['detok']}; sacrebleu_treebank = "
              f"SacreBLEU after NLTK Treebank detokenization ({table.get('treebank_detok', 'treebank')}; "
              "QKNorm Table 3: escapes kept). "
              f"SacreBLEU: {table['sacrebleu_signature']}. Published columns: results/published.csv, "
              "each beside our score in the metric named in its header (TwT Table 3: multi_bleu for every pair; "
              "QKNorm Table 2: multi_bleu_detok on TED, multi_bleu on en-vi; QKNorm Table 3: sacrebleu_treebank)."]
    return "\n".join(lines) + "\n"


def to_csv(table):
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(to_rows(table))
    return buf.getvalue()


def write(table, results_dir):
    base = os.path.join(results_dir, table["pair"], "compare")
    write_atomic(base + ".json", json.dumps(table, indent=2) + "\n")
    write_atomic(base + ".csv", to_csv(table))
    write_atomic(base + ".md", to_markdown(table))
    return base


def read(path):
    """A table written by `write` (PAIR/compare.json), with the seeds' keys back to integers."""
    with open(path, encoding="utf-8") as f:
        table = json.load(f)
    for r in table["rows"]:
        if "per_seed" in r:
            r["per_seed"] = {int(k): v for k, v in r["per_seed"].items()}
            r["runs"] = {int(k): v for k, v in r["runs"].items()}
    return table


def main(argv=None):
    ap = Parser(prog="python -m qknorm_pipeline.scoring.compare", description=__doc__)
    ap.add_argument("--pair", required=True)
    ap.add_argument("--results-dir", required=True)
    ap.add_argument("--published", default=DEFAULT_PUBLISHED)
    ap.add_argument("--baseline", help="default: postnorm, else scalenorm, else prenorm, else the first")
    ap.add_argument("--metric", choices=METRICS, help="default: the one evaluate.sh used")
    ap.add_argument("--detok", choices=DETOKENIZERS, help="default: the one evaluate.sh used")
    ap.add_argument("--treebank-detok", choices=("treebank", "treebank_unescape"), default="treebank",
                    help="sacrebleu_treebank: Treebank on the escaped text as the authors did (default), or "
                         "after undoing the Moses escapes")
    ap.add_argument("--lang", default="en")
    ap.add_argument("--n-samples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--runs", nargs="+", metavar="RUN",
                    help="only these run folders of the pair (default: every evaluated one)")
    args = ap.parse_args(argv)
    try:
        table = build(args.pair, args.results_dir, args.published, args.baseline, args.metric, args.detok,
                      args.lang, args.n_samples, args.seed, args.treebank_detok, args.runs)
    except ScoringError as e:
        return fail(e, 2)
    base = write(table, args.results_dir)
    print(to_markdown(table))
    print(f"wrote {shareable(base)}.{{md,csv,json}}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
