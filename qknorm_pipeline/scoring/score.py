"""Score several systems against one reference with every metric, plus significance.

    python -m qknorm_pipeline.scoring --ref REF --sys NAME=HYP [--sys NAME2=HYP2 ...]
        [--baseline NAME] [--detok none|moses|treebank|treebank_unescape] [--lang LANG]
        [--metric multi_bleu|multi_bleu_detok|sacrebleu] [--test bootstrap|ar]
        [--n-samples N] [--seed S] [--json] [--output FILE]

Metrics: ``multi_bleu`` = multi-bleu.perl on the files as given (tokenized text);
``multi_bleu_detok`` = multi-bleu-detok.perl and ``sacrebleu`` = SacreBLEU (13a), both on
hypotheses and references detokenized with ``--detok``. The two-sided p-value (``--metric``,
paired bootstrap by default) tests each system against ``--baseline``; null for the baseline and
when no baseline is named.
"""
import json
import sys

from ..cli import Parser, prog
from ..cli import main as run_main
from ..files import write_atomic
from ..paths import shareable
from . import bleu
from .significance import approximate_randomization, paired_bootstrap

METRICS = ("multi_bleu", "multi_bleu_detok", "sacrebleu")


def score_runs(ref_paths, systems, detok="none", lang="en", warn=None):
    """Every metric of every (name, hypothesis path), with the per-sentence statistics behind them.
    Returns (scores by name, statistics by name and metric, score function by metric: None for
    multi-bleu's formula, else a function from summed statistics to BLEU)."""
    ref_sets = [bleu.read_lines(p, "reference") for p in ref_paths]
    for p, refs in zip(ref_paths[1:], ref_sets[1:]):
        if len(refs) != len(ref_sets[0]):
            raise bleu.ScoringError(f"reference {p!r} has {len(refs)} lines but {ref_paths[0]!r} "
                                    f"has {len(ref_sets[0])}")
    detok_refs = [bleu.detokenize(r, detok, lang) for r in ref_sets]
    out, stats = {}, {}
    sb_metric = None
    for name, path in systems:
        hyps = bleu.read_lines(path, f"hypothesis file of {name}")
        if len(hyps) != len(ref_sets[0]):
            raise bleu.ScoringError(
                f"hypothesis file {path!r} ({name}) has {len(hyps)} lines but reference "
                f"{ref_paths[0]!r} has {len(ref_sets[0])}: they must be line-parallel")
        msg = bleu.escape_mismatch(hyps, ref_sets[0])
        if msg and warn:
            warn(f"{name}: {msg}")
        dhyps = bleu.detokenize(hyps, detok, lang)
        mb = bleu.multi_bleu(hyps, ref_sets)
        mbd = bleu.multi_bleu_detok(dhyps, detok_refs)
        sb, sig, sb_stats, sb_metric = bleu.sacrebleu_score(dhyps, detok_refs)
        stats[name] = {"multi_bleu": mb.stats, "multi_bleu_detok": mbd.stats, "sacrebleu": sb_stats}
        out[name] = {"multi_bleu": round(mb.score, 4), "multi_bleu_detok": round(mbd.score, 4),
                     "sacrebleu": round(sb.score, 4), "sacrebleu_signature": sig,
                     "multi_bleu_str": str(mb), "p_value": None, "delta": None}
    score_fns = {"multi_bleu": None, "multi_bleu_detok": None,
                 "sacrebleu": lambda row: bleu.sacrebleu_from_stats(sb_metric, row)}
    return out, stats, score_fns


def score_systems(ref_paths, systems, baseline=None, detok="none", lang="en", metric="multi_bleu",
                  test="bootstrap", n_samples=1000, seed=12345, warn=None):
    """systems: list of (name, hypothesis path). Returns the JSON-ready result dict."""
    if metric not in METRICS:
        raise bleu.ScoringError(f"unknown metric {metric!r}: choose one of {', '.join(METRICS)}")
    if baseline is not None and baseline not in dict(systems):
        raise bleu.ScoringError(f"baseline {baseline!r} is not among the systems "
                                f"({', '.join(n for n, _ in systems)})")
    out, stats, score_fns = score_runs(ref_paths, systems, detok, lang, warn)
    if baseline is not None:
        for name, _ in systems:
            out[name]["delta"] = round(out[name][metric] - out[baseline][metric], 4)
            if name == baseline:
                continue
            fn = paired_bootstrap if test == "bootstrap" else approximate_randomization
            res = fn(stats[name][metric], stats[baseline][metric], n_samples=n_samples, seed=seed,
                     score_fn=score_fns[metric])
            out[name]["p_value"] = res["p_two_sided"]
    return {"systems": out, "reference": [shareable(p) for p in ref_paths], "baseline": baseline, "detok": detok,
            "metric": metric, "test": test if baseline else None, "n_samples": n_samples, "seed": seed}


def format_table(result):
    metric = result["metric"]
    rows = [("system", "multi_bleu", "multi_bleu_detok", "sacrebleu", f"delta({metric})", "p")]
    for name, s in result["systems"].items():
        rows.append((name, f"{s['multi_bleu']:.2f}", f"{s['multi_bleu_detok']:.2f}", f"{s['sacrebleu']:.2f}",
                     "" if s["delta"] is None else f"{s['delta']:+.2f}",
                     "" if s["p_value"] is None else f"{s['p_value']:.4f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    sigs = {s["sacrebleu_signature"] for s in result["systems"].values()}
    lines.append(f"detok: {result['detok']}; sacrebleu: {', '.join(sorted(sigs))}")
    if result["baseline"]:
        lines.append(f"p: {result['test']} on {metric} vs {result['baseline']} "
                     f"({result['n_samples']} samples, seed {result['seed']})")
    return "\n".join(lines)


def write_scores(path, result):
    write_atomic(path, json.dumps(result, indent=2, ensure_ascii=False) + "\n")


def parser():
    ap = Parser(prog=prog("qknorm_pipeline.scoring"), tag="scoring", description=__doc__)
    ap.add_argument("--ref", action="append", required=True,
                    help="reference file (repeat for multiple references)")
    ap.add_argument("--sys", action="append", required=True, metavar="NAME=HYP",
                    help="a system's hypothesis file, line-parallel to the reference (repeatable)")
    ap.add_argument("--baseline", help="system the others are tested against")
    ap.add_argument("--detok", default="none", choices=bleu.DETOKENIZERS,
                    help="detokenizer for multi_bleu_detok and sacrebleu (default: none)")
    ap.add_argument("--lang", default="en", help="target language for --detok moses (default: en)")
    ap.add_argument("--metric", default="multi_bleu", choices=METRICS,
                    help="metric of the significance test and the delta (default: multi_bleu)")
    ap.add_argument("--test", default="bootstrap", choices=["bootstrap", "ar"],
                    help="paired bootstrap (Koehn 2004) or approximate randomisation")
    ap.add_argument("--n-samples", type=int, default=None,
                    help="resamples (default: 1000 for bootstrap, 10000 for ar)")
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--output", help="also write the JSON result to this file (atomically)")
    return ap


def main(argv=None):
    ap = parser()

    def run(args):
        n_samples = args.n_samples if args.n_samples is not None else 1000 if args.test == "bootstrap" else 10000
        if n_samples < 1:
            ap.error(f"--n-samples must be positive, got {n_samples}")
        if args.seed < 0:
            ap.error(f"--seed must be a non-negative integer, got {args.seed}")
        result = score_systems(args.ref, ap.named(args.sys, "--sys", "NAME=HYP"), baseline=args.baseline,
                               detok=args.detok, lang=args.lang, metric=args.metric, test=args.test,
                               n_samples=n_samples, seed=args.seed,
                               warn=lambda m: print(f"warning: {m}", file=sys.stderr))
        if args.output:
            write_scores(args.output, result)
        print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else format_table(result))

    return run_main(run, ap, argv)
