"""The effect of the original code's procedure on one pair and system, one item at a time.

usage: bash scripts/ablate.sh PAIR SYSTEM [-- extra fairseq-train flags for every run]
       (python -m qknorm_pipeline.ablation takes the same arguments)

Trains SYSTEM with its recipe (output bias, the system's stopping rule), SYSTEM_nobias
(--no-output-bias) and SYSTEM_stopALT (the other procedure: the TwT paper's stopping, or the
original code's, which brings its own schedule); decodes every run's best checkpoint with both
beam searches (--beam-search twt, the recipe's, and fairseq's search + GNMT re-ranking) and writes
$RESULTS_DIR/PAIR/ablation_SYSTEM.{md,json}. Resumable: finished runs and decodings are reused.
Exit status: 0 ok, 2 a usage error, 1 a failure.
"""
import dataclasses
import json
import os
import sys

from . import evaluate as evaluate_step
from . import recipes
from . import train as train_step
from .cli import Parser, UsageError, prog
from .cli import main as run_main
from .fairseq_log import LogError, parse_log
from .files import read_json, write_atomic
from .paths import folders

SEARCHES = ("twt", "fairseq")


def alternative(rule):
    """The other stopping procedure: the original code's for a system on the TwT paper's, else the paper's."""
    return "twt_code" if rule == "twt_paper" else "twt_paper"


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
        scores = read_json(path, f"evaluate {run} again with --beam-search {search}")["systems"]
        row[f"test_{search}"] = next(iter(scores.values()))["multi_bleu"]
    return row


def write_report(pair, system, rows, settings, out):
    ref = next(iter(rows.values()))
    lines = [f"# {pair} {system}: the original code's procedure, one item at a time", "", settings, "",
             "| run | change from the recipe | stopped at update | best dev BLEU | test BLEU, TwT search | "
             "test BLEU, fairseq search + GNMT re-ranking | test diff to recipe (TwT search) |",
             "|---|---|---|---|---|---|---|"]
    for run, r in rows.items():
        lines.append(f"| {run} | {r['what']} | {r['stopped_at']} | {r['best_dev_bleu']:.2f} | {r['test_twt']:.2f} | "
                     f"{r['test_fairseq']:.2f} | {r['test_twt'] - ref['test_twt']:+.2f} |")
    lines += ["", "Test BLEU: multi-bleu on the tokenized test set, best-dev checkpoint, beam 4, GNMT alpha 0.6."]
    write_atomic(out + ".json", json.dumps({"pair": pair, "system": system, "settings": settings, "runs": rows},
                                           indent=1) + "\n")
    write_atomic(out + ".md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def ablate(pair, system, extra=(), where=None):
    where = where or folders()
    cfg = recipes.load(pair, os.path.join(where.data_bin, pair))
    rule = recipes.system(cfg, system).stopping
    alt = alternative(rule)
    runs = {system: (f"none (the recipe: output bias, stopping {rule})", {}),
            f"{system}_nobias": ("--no-output-bias", {"extra": ["--no-output-bias"]}),
            f"{system}_stop{alt}": (f"--stopping {alt}", {"stopping": alt})}
    out = os.path.join(where.results, pair, "ablation", system)
    rows = {}
    for name, (what, change) in runs.items():
        opts = train_step.Options(name=name, **{**change, "extra": list(extra) + change.get("extra", [])})
        train_step.train(train_step.plan(pair, system, opts, where))
        for search in SEARCHES:
            evaluate_step.evaluate(pair, name, ["--beam-search", search],
                                   where=dataclasses.replace(where, results=os.path.join(out, search)))
        rows[name] = {"what": what, **run_row(os.path.join(where.logs, pair, name, "train.log"), out, pair, name)}
    command = f"bash scripts/ablate.sh {pair} {system}" + (f" -- {' '.join(extra)}" if extra else "")
    write_report(pair, system, rows, f"Command: {command}", os.path.join(where.results, pair, f"ablation_{system}"))


def parser():
    p = Parser(prog=prog("qknorm_pipeline.ablation"), tag="ablate", description=__doc__,
               usage="%(prog)s PAIR SYSTEM [-- extra fairseq-train flags]",
               unknown_hint="; fairseq-train flags go after --")
    p.add_argument("pair")
    p.add_argument("system")
    p.add_argument("extra", nargs="*", default=[], help="after --: fairseq-train flags for every run")
    return p


def run(a):
    if a.pair.startswith("-"):
        raise UsageError("need PAIR and SYSTEM")
    ablate(a.pair, a.system, a.extra)


def main(argv=None):
    return run_main(run, parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
