"""One comparison table per pair: every evaluated system, every metric, the delta to the
baseline with its p-value, and the papers' published numbers beside ours.

usage: bash scripts/compare.sh [PAIR|all] [--baseline NAME] [--metric M] [--runs RUN...] [...]
       (python -m qknorm_pipeline.scoring.compare takes the same arguments)

Reads $RESULTS_DIR/PAIR/<run>/{hyp.txt,scores.json} (written by scripts/evaluate.sh), scores every
system under every metric, tests each against the baseline (postnorm, else scalenorm, else
prenorm; --baseline NAME), places the published numbers of results/published.csv beside them,
prints the table and writes $RESULTS_DIR/PAIR/compare.{md,csv,json}. Nothing is reused: the table
is computed from the current hypotheses every time. A run is refused when its evaluation did not
finish (no .done) or its checkpoint has changed since (trained again): evaluate it again.

Columns: multi_bleu (multi-bleu.perl on the tokenized text); multi_bleu_detok (multi-bleu-detok.perl
after the pair's detokenizer), which is SacreBLEU's 13a BLEU with the signature given under the
table (the two differ only when an n-gram order has no match at all: 0 against SacreBLEU's
smoothed score); sacrebleu_treebank, SacreBLEU after NLTK's Treebank detokenizer: on a pair with a
published QKNorm Table 3 number the authors' procedure, which keeps Moses escapes (13a then splits
`&apos;` into `& apos ;`, so every apostrophe adds easy matches: a warning says how many the
reference holds), elsewhere the same after undoing the escapes (--treebank-detok to choose).
p, two-sided (significance.py says why): the paired bootstrap over test sentences (Koehn 2004); at
the floor of its resamples it is a bound, printed "≤ 0.002 (resampling floor)" for 1,000 samples.
When a system has several seeds: Welch's t over the seeds' scores with the test set's sampling
variance added, a one-seed system with the seed variance pooled over the others (significance.py,
seed_t_test). The family is every system against the baseline; "p (Holm)" is its Holm-Bonferroni
adjusted p, and * marks an adjusted p below 0.01.
"""
import csv
import io
import json
import os
import statistics
import sys

from ..cli import Parser, UsageError, UserError, one_pair, prog
from ..cli import main as run_main
from ..files import file_digest, read_json, write_atomic
from ..names import split_seed
from ..paths import ROOT, shareable
from ..processes import command_change, is_done
from .bleu import DETOKENIZERS, MOSES_ESCAPES, ScoringError
from .score import METRICS, score_runs
from .significance import bootstrap_floor, format_p, holm, paired_bootstrap, pooled_variance, seed_t_test, sentence_variance

ALL_METRICS = METRICS + ("sacrebleu_treebank",)
ALPHA = 0.01  # * marks a row whose Holm-adjusted p is below this
SHOWN = ("multi_bleu", "multi_bleu_detok", "sacrebleu_treebank")  # sacrebleu: multi_bleu_detok's twin
DEFAULT_PUBLISHED = os.path.join(ROOT, "results", "published.csv")
# Baseline preference when none is named: TwT's baseline, then QKNorm's (Nguyen & Salazar).
BASELINE_ORDER = ("postnorm", "scalenorm", "prenorm")


def group_runs(runs):
    """{system: {seed: run name}} of evaluated run names."""
    groups = {}
    for run in runs:
        system, seed = split_seed(run)  # SYSTEM_seedK: seed K of SYSTEM (names.py)
        if seed in groups.setdefault(system, {}):
            raise ScoringError(f"runs {groups[system][seed]!r} and {run!r} are both seed {seed} of {system}")
        groups[system][seed] = run
    return {s: dict(sorted(g.items())) for s, g in sorted(groups.items())}


def load_published(path, pair):
    if path is None:  # the numbers of another split: none to show
        return []
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
    """The evaluated runs in pair_dir (<run>/scores.json + hyp.txt, finished: .done); only: just these,
    each required. A run whose result lacks its .done (a decoding failed or was stopped after an
    earlier one) is refused unless left out: its files may be the earlier decoding's."""
    if not os.path.isdir(pair_dir):
        raise ScoringError(f"no results in {pair_dir!r}: run scripts/evaluate.sh first")
    systems, unfinished = [], []
    for name in sorted(os.listdir(pair_dir)):
        d = os.path.join(pair_dir, name)
        result = [f for f in ("scores.json", "hyp.txt") if os.path.isfile(os.path.join(d, f))]
        if len(result) == 2 and is_done(d):
            systems.append(name)
        elif result and (only is None or name in only):
            unfinished.append(name)
    if unfinished:
        pair = os.path.basename(os.path.normpath(pair_dir))
        again = "; ".join(f"bash scripts/evaluate.sh {pair} {run}" for run in unfinished)
        raise UserError(f"unfinished evaluation of {', '.join(unfinished)} in {pair_dir!r} (a result without the .done "
                        f"evaluate.sh writes last: a decoding failed or was stopped, so its files may be an earlier "
                        f"one's): evaluate again ({again}) or leave {'them' if len(unfinished) > 1 else 'it'} out (--runs)")
    if only is not None:
        missing = [r for r in only if r not in systems]
        if missing:
            raise ScoringError(f"--runs: no evaluated run {', '.join(missing)} in {pair_dir!r} "
                               f"(have: {', '.join(systems) or 'none'}); evaluate it first or leave it out")
        systems = [s for s in systems if s in only]
    if not systems:
        raise ScoringError(f"no evaluated systems (<system>/scores.json + hyp.txt) in {pair_dir!r}")
    return systems


def check_current(pair, run, meta):
    """Refuse RUN's scores when the checkpoint or the reference they name (evaluate.sh records their
    SHA-256) has changed since: trained or prepared again without evaluating. Not checked when the
    file is gone (results kept without their checkpoints) or not named (scores.json written before
    evaluate.sh recorded it)."""
    ckpt = meta.get("checkpoint")
    path = ckpt and os.path.join(ROOT, ckpt["path"])
    if path and os.path.isfile(path) and file_digest(path) != ckpt["sha256"]:
        raise UserError(f"{pair}/{run}: its scores are of an earlier {ckpt['path']} (it has changed since it was "
                        f"evaluated: trained again?): evaluate again (bash scripts/evaluate.sh {pair} {run})")
    ref = meta.get("reference_sha256") and os.path.join(ROOT, meta["reference"][0])
    if ref and os.path.isfile(ref) and file_digest(ref) != meta["reference_sha256"]:
        raise UserError(f"{pair}/{run}: its scores are against an earlier {meta['reference'][0]} (the test set has "
                        f"changed since it was evaluated: prepared again?): evaluate again (bash scripts/evaluate.sh "
                        f"{pair} {run})")


def check_decoded_alike(pair, metas):
    """Refuse systems decoded with different fairseq-generate flags (evaluate.sh records them in
    scores.json; older scores have none and are not checked): the comparison would not be fair."""
    known = {s: m["decoding"] for s, m in metas.items() if "decoding" in m}
    first = next(iter(known), None)
    for s, words in known.items():
        change = command_change(known[first], words)
        if change != "same":
            raise ScoringError(f"{pair}/{s} was decoded with other fairseq-generate flags than {pair}/{first} "
                               f"({change.removeprefix('different: ')}): decode every system alike (bash "
                               f"scripts/evaluate.sh {pair} SYSTEM [flags]), or leave some out (--runs)")


def treebank_procedure(published, chosen=None):
    """The detokenizer of the sacrebleu_treebank column: the authors' (escapes kept) only where it
    re-scores a published QKNorm Table 3 number, else the same after undoing the escapes."""
    if chosen:
        return chosen
    return "treebank" if any(p["metric"] == "sacrebleu_treebank" for p in published) else "treebank_unescape"


def escape_warning(ref, procedure):
    """A warning when the escaped-Treebank procedure meets Moses escapes in the reference."""
    if procedure != "treebank":
        return None
    from .bleu import read_lines

    n = sum(line.count(e) for line in read_lines(ref[0], "reference") for e in MOSES_ESCAPES)
    if not n:
        return None
    return (f"sacrebleu_treebank keeps the reference's {n} Moses escapes, as the QKNorm Table 3 procedure did: "
            "SacreBLEU's 13a tokenizer splits `&apos;` into `& apos ;`, so every escape adds easy matches and "
            "raises the score on English output; compare this column only with the published one")


def _reference(metas, pair):
    # scores.json names the reference relative to the repository when it lies inside it (shareable);
    # older ones name it absolutely: the same file either way
    refs = {tuple(os.path.normpath(os.path.join(ROOT, r)) for r in m["reference"]) for m in metas.values()}
    if len(refs) != 1:
        raise ScoringError(f"systems of {pair} were scored against different references: {sorted(refs)}")
    return list(refs.pop())


def build(pair, results_dir, published_path=DEFAULT_PUBLISHED, baseline=None, metric=None, detok=None,
          lang="en", n_samples=1000, seed=12345, treebank_detok=None, runs=None):
    pair_dir = os.path.join(results_dir, pair)
    systems = find_systems(pair_dir, runs)
    metas = {}
    for s in systems:
        metas[s] = read_json(os.path.join(pair_dir, s, "scores.json"),
                             f"evaluate it again (bash scripts/evaluate.sh {pair} {s})")
        check_current(pair, s, metas[s])
    check_decoded_alike(pair, metas)
    ref = _reference(metas, pair)
    first = metas[systems[0]]
    metric = metric or first["metric"]
    detok = detok or first["detok"]
    published = load_published(published_path, pair)
    treebank_detok = treebank_procedure(published, treebank_detok)
    groups = group_runs(systems)
    if baseline is not None and baseline not in systems and baseline not in groups:
        raise ScoringError(f"baseline {baseline!r} has no results in {pair_dir} (have: {', '.join(systems)})")
    if baseline not in groups:
        baseline = next((s for s, g in groups.items() if baseline in g.values()), None) or next(
            (b for b in BASELINE_ORDER if b in groups), next(iter(groups)))
    runs = [(run, os.path.join(pair_dir, run, "hyp.txt")) for g in groups.values() for run in g.values()]
    scores, stats, score_fns = score_runs(ref, runs, detok, lang)
    tb, _, _ = score_runs(ref, runs, treebank_detok, lang)
    seeded = any(len(g) > 1 for g in groups.values())
    pooled = pooled_variance([[scores[r][metric] for r in g.values()] for g in groups.values()]) if seeded else None
    rows = []
    for system, by_seed in groups.items():
        per_seed = {k: {m: scores[run][m] if m != "sacrebleu_treebank" else tb[run]["sacrebleu"] for m in ALL_METRICS}
                    for k, run in by_seed.items()}
        row = {"system": system, "seeds": list(by_seed), "runs": dict(by_seed), "per_seed": per_seed}
        for m in ALL_METRICS:
            mean, sd = mean_sd([v[m] for v in per_seed.values()])
            row[m], row[m + "_sd"] = round(mean, 4), None if sd is None else round(sd, 4)
        row.update(delta=None, p_value=None, p_text=None, p_holm=None, p_holm_text=None, significant=None)
        if system != baseline:
            mine, base = list(by_seed.values()), list(groups[baseline].values())
            if seeded:
                spread = sentence_variance([stats[r][metric] for r in mine], [stats[r][metric] for r in base],
                                           n_samples=n_samples, seed=seed, score_fn=score_fns[metric])
                res = seed_t_test([scores[r][metric] for r in mine], [scores[r][metric] for r in base],
                                  sentence_var=spread, pooled=pooled)
            else:
                res = paired_bootstrap(stats[mine[0]][metric], stats[base[0]][metric], n_samples=n_samples, seed=seed,
                                       score_fn=score_fns[metric])
            row.update(delta=round(res["delta"], 4), p_value=res["p_two_sided"])
        else:
            row["delta"] = 0.0
        row["published"] = beside_published(row, published)
        rows.append(row)
    add_holm(rows, None if seeded else bootstrap_floor(n_samples))
    warning = escape_warning(ref, treebank_detok)
    return {"pair": pair, "baseline": baseline, "metric": metric, "detok": detok,
            "reference": [shareable(r) for r in ref], "treebank_detok": treebank_detok,
            "n_samples": n_samples, "seed": seed, "test": "seed_t_test" if seeded else "paired_bootstrap",
            "seeds": seeded, "pooled_sd": None if pooled is None else [pooled[0] ** 0.5, pooled[1]],
            "sacrebleu_signature": next(iter(scores.values()))["sacrebleu_signature"],
            "warnings": [warning] if warning else [], "rows": rows}


def add_holm(rows, floor):
    """The p texts, and the Holm-adjusted p over the family of every row tested against the baseline.
    FLOOR: the bootstrap's; a p at it is a bound, and so is an adjusted p up to m times it."""
    tested = [r for r in rows if r["p_value"] is not None]
    for r, adjusted in zip(tested, holm([r["p_value"] for r in tested])):
        r.update(p_text=format_p(r["p_value"], floor, ALPHA), p_holm=adjusted, significant=adjusted < ALPHA,
                 p_holm_text=format_p(adjusted, floor and min(1.0, len(tested) * floor), ALPHA))


def beside_published(row, published):
    """The published numbers of row's system, each with our score in its metric."""
    return [{"source": f"{p['paper']} T{p['table']}", "metric": p["metric"], "bleu": p["bleu"],
             "ours": row[p["metric"]], "diff": round(row[p["metric"]] - p["bleu"], 2)}
            for p in published if p["system"] == row["system"] and not p["variant"]]


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


def columns(table):
    """The metrics shown: multi_bleu and multi_bleu_detok (SacreBLEU's twin), the table's metric, the
    Treebank column."""
    return [m for m in ALL_METRICS if m in SHOWN or m == table["metric"]]


def to_rows(table):
    """Flat rows (header first) shared by the CSV and Markdown outputs."""
    sources = _sources(table)
    metrics = columns(table)
    header = ["system", *metrics, f"delta {table['metric']}", "p", "p (Holm)"]
    for src, m in sources:  # each published number beside ours in its own metric
        header += [f"{src} published ({m})", f"ours ({m})"]
    if table.get("seeds"):
        header[len(metrics) + 1:len(metrics) + 1] = ["seeds", f"per seed ({table['metric']})"]
    out = [header]
    for r in table["rows"]:
        if table.get("seeds"):
            cells = [r["system"]] + [fmt_mean_sd(r[m], r[m + "_sd"]) for m in metrics]
            cells += [str(len(r["seeds"])),
                      " ".join(f"{r['per_seed'][k][table['metric']]:.2f}" for k in r["seeds"])]
        else:
            cells = [r["system"]] + [f"{r[m]:.2f}" for m in metrics]
        cells.append("" if r["system"] == table["baseline"] else f"{r['delta']:+.2f}")
        cells.append("" if r["p_text"] is None else r["p_text"])
        cells.append("" if r["p_holm_text"] is None else r["p_holm_text"] + (" *" if r["significant"] else ""))
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
    tested = [r["system"] for r in table["rows"] if r["p_value"] is not None]
    if table.get("seeds"):
        pooled = table.get("pooled_sd")
        test = (f"mean over seeds ± sample standard deviation; delta of the means and p on {table['metric']} "
                f"from Welch's t over the seeds' scores, with the test set's sampling variance added (paired "
                f"bootstrap over sentences, {table['n_samples']} samples, seed {table['seed']}); two-sided; a "
                "system with one seed gets the seed standard deviation pooled over the others"
                + (f" ({pooled[0]:.2f}, {pooled[1]} degrees of freedom)" if pooled else ""))
    else:
        test = (f"Delta and p on {table['metric']} (paired bootstrap, {table['n_samples']} samples, "
                f"seed {table['seed']}; two-sided; its resampling floor is 2/{table['n_samples'] + 1:,})")
    if tested:
        test += (f". The family of tests: {', '.join(tested)}, each against {table['baseline']} ({len(tested)}); "
                 "p (Holm): Holm-Bonferroni adjusted over it (≤: a bound, at most the number of tests times the "
                 f"floor); * = adjusted p < {ALPHA:g}")
    else:
        test += ". No test: the table has no system besides the baseline"
    treebank = ("the QKNorm Table 3 procedure: Treebank on the Moses-escaped text" if table["treebank_detok"] ==
                "treebank" else "Treebank after undoing the Moses escapes")
    lines += ["", f"Baseline: {table['baseline']}. {test[0].upper() + test[1:]}. "
              f"Detokenizer for multi_bleu_detok: {table['detok']}; multi_bleu_detok is SacreBLEU "
              f"({table['sacrebleu_signature']}) by construction. sacrebleu_treebank = SacreBLEU after NLTK "
              f"detokenization ({treebank}). Published columns: results/published.csv, "
              "each beside our score in the metric named in its header (TwT Table 3: multi_bleu for every pair; "
              "QKNorm Table 2: multi_bleu_detok on TED, multi_bleu on en-vi; QKNorm Table 3: sacrebleu_treebank)."]
    lines += [f"\nWarning: {w}." for w in table.get("warnings", [])]
    return "\n".join(lines) + "\n"


def to_csv(table):
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(to_rows(table))
    return buf.getvalue()


def write(table, results_dir):
    base = os.path.join(results_dir, table["pair"], "compare")
    # every text first: a table that cannot be rendered leaves the old set of three whole
    texts = {".json": json.dumps(table, indent=2) + "\n", ".csv": to_csv(table), ".md": to_markdown(table)}
    for ext, text in texts.items():
        write_atomic(base + ext, text)
    return base


def read(path):
    """A table written by `write` (PAIR/compare.json), with the seeds' keys back to integers."""
    pair = os.path.basename(os.path.dirname(os.path.abspath(path)))
    table = read_json(path, f"build it again (bash scripts/compare.sh {pair})")
    for r in table["rows"]:
        if "per_seed" in r:
            r["per_seed"] = {int(k): v for k, v in r["per_seed"].items()}
            r["runs"] = {int(k): v for k, v in r["runs"].items()}
    return table


def has_runs(pair_dir):
    """Whether PAIR_DIR holds a run's result (<run>/scores.json or hyp.txt, finished or not), not only tables."""
    return any(os.path.isfile(os.path.join(pair_dir, name, f)) for name in os.listdir(pair_dir)
               for f in ("scores.json", "hyp.txt"))


def pairs_with_results(results_dir, data_bin):
    """Every pair under RESULTS_DIR that has a config or prepared data and a run's result (compare.sh all)."""
    from ..recipes import available_pairs

    pairs = [p for p in sorted(os.listdir(results_dir)) if os.path.isdir(os.path.join(results_dir, p))
             and (p in available_pairs() or os.path.isfile(os.path.join(data_bin, p, "stats.json")))
             and has_runs(os.path.join(results_dir, p))] if os.path.isdir(results_dir) else []
    if not pairs:
        raise ScoringError(f"no evaluated pairs under {results_dir}: run bash scripts/evaluate.sh PAIR SYSTEM first")
    return pairs


def compare(pair, results_dir, lang=None, **options):
    """Build, write and print PAIR's table; returns it."""
    from .. import recipes

    lang = lang or recipes.load(pair).tgt
    table = build(pair, results_dir, lang=lang, **options)
    base = write(table, results_dir)
    for w in table["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    print(to_markdown(table))
    print(f"wrote {shareable(base)}.{{md,csv,json}}", file=sys.stderr)
    return table


def parser():
    ap = Parser(prog=prog("qknorm_pipeline.scoring.compare"), tag="compare", description=__doc__)
    ap.add_argument("pair_arg", nargs="?", metavar="PAIR", help="a pair with results, or all (the default)")
    ap.add_argument("--pair", help="the pair (or give it as the first argument)")
    ap.add_argument("--results-dir", help="default: $RESULTS_DIR, else results/")
    ap.add_argument("--published", default=DEFAULT_PUBLISHED)
    ap.add_argument("--baseline", help="default: postnorm, else scalenorm, else prenorm, else the first")
    ap.add_argument("--metric", choices=METRICS, help="default: the one evaluate.sh used")
    ap.add_argument("--detok", choices=DETOKENIZERS, help="default: the one evaluate.sh used")
    ap.add_argument("--treebank-detok", choices=("treebank", "treebank_unescape"),
                    help="sacrebleu_treebank: Treebank on the escaped text as the authors did (the default where "
                         "it re-scores a published QKNorm Table 3 number), or after undoing the Moses escapes "
                         "(the default elsewhere)")
    ap.add_argument("--lang", help="target language (default: the pair's tgt)")
    ap.add_argument("--n-samples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--runs", nargs="+", metavar="RUN",
                    help="only these run folders of the pair (default: every evaluated one)")
    return ap


def run(args):
    from ..paths import folders

    if args.n_samples < 2:
        raise UsageError(f"--n-samples must be at least 2 (the seeded test estimates a variance from the resamples), "
                         f"got {args.n_samples}")
    if args.seed < 0:
        raise UsageError(f"--seed must be a non-negative integer, got {args.seed}")
    where = folders()
    results_dir = args.results_dir or where.results
    pair = one_pair(args, default="all")
    pairs = pairs_with_results(results_dir, where.data_bin) if pair == "all" else [pair]
    for p in pairs:
        compare(p, results_dir, lang=args.lang, published_path=args.published, baseline=args.baseline,
                metric=args.metric, detok=args.detok, n_samples=args.n_samples, seed=args.seed,
                treebank_detok=args.treebank_detok, runs=args.runs)


def main(argv=None):
    return run_main(run, parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
