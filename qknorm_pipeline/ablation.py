"""The effect of the original code's procedure, one item at a time (scripts/ablate.sh writes the runs).

    python -m qknorm_pipeline.ablation --pair PAIR --system SYSTEM --runs RUN=WHAT ... \
        --log-dir LOG_DIR/PAIR --results RESULTS_DIR/PAIR/ablation/SYSTEM --out PREFIX

For every run: the update it stopped at, its best dev BLEU (fairseq's validation), and test BLEU of
its best checkpoint decoded with each beam search (RESULTS/SEARCH/PAIR/RUN/scores.json: scripts/evaluate.sh
run with RESULTS_DIR=RESULTS/SEARCH). Writes PREFIX.md and PREFIX.json.
"""
import json
import os
import sys

from .cli import Parser, main as run_main
from .fairseq_log import LogError, parse_log
from .files import write_atomic

SEARCHES = ("twt", "fairseq")


def run_row(log_path, results, pair, run):
    log = parse_log(log_path)
    if not log["valid"]:
        raise LogError(f"{log_path}: no validation record")
    row = {"stopped_at": max(int(r["valid_num_updates"]) for r in log["valid"]),
           "best_dev_bleu": max(float(r["valid_bleu"]) for r in log["valid"])}
    for search in SEARCHES:
        path = os.path.join(results, search, pair, run, "scores.json")
        if not os.path.isfile(path):
            raise LogError(f"{path} is missing: evaluate {run} with --beam-search {search}")
        scores = json.load(open(path))["systems"]
        row[f"test_{search}"] = next(iter(scores.values()))["multi_bleu"]
    return row


def main(argv=None):
    ap = Parser(prog="python -m qknorm_pipeline.ablation", description=__doc__)
    ap.add_argument("--pair", required=True)
    ap.add_argument("--system", required=True)
    ap.add_argument("--runs", nargs="+", required=True, metavar="RUN=WHAT", help="run name = what it changes")
    ap.add_argument("--log-dir", required=True, help="LOG_DIR/PAIR")
    ap.add_argument("--results", required=True, help="folder with SEARCH/PAIR/RUN/scores.json")
    ap.add_argument("--settings", default="", help="a line describing the runs, copied into the report")
    ap.add_argument("--out", required=True, help="output prefix")
    opts = ap.parse_args(argv)
    rows = {}
    try:
        for run, what in ap.named(opts.runs, "--runs", "RUN=WHAT"):
            rows[run] = {"what": what, **run_row(os.path.join(opts.log_dir, run, "train.log"), opts.results, opts.pair,
                                                   run)}
    except LogError as e:
        return fail(e)
    ref = next(iter(rows.values()))
    lines = [f"# {opts.pair} {opts.system}: the original code's procedure, one item at a time", "",
             opts.settings, "",
             "| run | change from the recipe | stopped at update | best dev BLEU | test BLEU, TwT search | "
             "test BLEU, fairseq search + GNMT re-ranking | test diff to recipe (TwT search) |",
             "|---|---|---|---|---|---|---|"]
    for run, r in rows.items():
        lines.append(f"| {run} | {r['what']} | {r['stopped_at']} | {r['best_dev_bleu']:.2f} | {r['test_twt']:.2f} | "
                     f"{r['test_fairseq']:.2f} | {r['test_twt'] - ref['test_twt']:+.2f} |")
    lines += ["", "Test BLEU: multi-bleu on the tokenized test set, best-dev checkpoint, beam 4, GNMT alpha 0.6."]
    write_atomic(opts.out + ".json", json.dumps({"pair": opts.pair, "system": opts.system,
                                                 "settings": opts.settings, "runs": rows}, indent=1) + "\n")
    write_atomic(opts.out + ".md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
