"""The real-data study: our normalisation presets and stock fairseq trained on TED gl->en with the
same data, model size and number of updates, several seeds each, and each also at a multiple of
its peak learning rate (configs/studies/gl-en.yaml), or every system under one recipe at each
learning rate of a grid, then more seeds at its best rate (configs/studies/gl-en-norm.yaml); test
decoding alike; a report of test BLEU with significance tests over seeds and sentences, training
wall time and dev-BLEU curves.

usage: bash scripts/study.sh [--config FILE] [--systems "a b"] [--seeds N] [--runs "RUN ..."]
                             [--max-update N] [--source-dir DIR] [--report-only] [--dry-run] [--verbose]
       (python -m qknorm_pipeline.study takes the same arguments)

Steps, each resumable (a study's runs take days, across interruptions; re-run the same command to go on):
  1. the config's corpus (downloaded once, or copied from its dir: or --source-dir DIR; its line
     counts and sha256 checked at every call) prepared into the study's own $DATA_DIR/NAME and
     $DATA_BIN/NAME (skipped when done)
  2. every run (qknorm_pipeline/study/runs.py): trained, its best-dev and last checkpoints decoded,
     its record written to $RESULTS_DIR/NAME/runs/PAIR/RUN/ (kept in git)
  3. the report from the records: $RESULTS_DIR/NAME/study.md, study.json, dev_bleu.png (and
     test_bleu_lr.png), of every recorded run of the chosen systems and seeds (--runs narrows the
     training only; --report-only --runs the report); it says which of the study's runs it lacks, and
     its Command: line is the --report-only command that rebuilds it
Runs: checkpoints $CKPT_DIR/NAME/PAIR/RUN, log $LOG_DIR/NAME/PAIR/RUN/train.log, test outputs
$RESULTS_DIR/NAME/PAIR/RUN (RUN = SYSTEM for seed 1, SYSTEM_seedK for seed K, SYSTEM_lrMx for
seed 1 at M times the peak learning rate; with a grid SYSTEM_lrL for seed 1 at peak L, e.g.
qknorm_lr1e-3, and SYSTEM_lrL_seedK at the system's best L by dev BLEU, named once its grid runs
are recorded: the same call trains the grid, then those).
Exit status: 0 ok, 2 a usage error, 1 a failure.
"""
import os
import sys
import time

from .. import hardware
from .. import train as train_step
from ..cli import Parser, UsageError, UserError, log, prog
from ..cli import main as run_main
from ..paths import folders, short
from . import config, corpus, records, report, runs

TAG = "study"


def prepare_data(cfg, where, source_dir=None):
    """The study's corpus, fetched once and checked, prepared into its own folders; also for
    --report-only (the records' scores name the reference test set it holds)."""
    from ..prepare import prepare
    from ..reproduce import into_log

    data_log = os.path.join(where.logs, cfg.pair, "data.log")
    os.makedirs(os.path.dirname(data_log), exist_ok=True)
    raw = corpus.ensure(cfg, where, source_dir)
    t0 = time.time()
    with into_log(data_log):
        prepare(cfg.pair, src_dir=raw, tokenized=True, where=where)
    log(TAG, f"data: {short(os.path.join(where.data_bin, cfg.pair))} ready in {time.time() - t0:.0f} s "
             f"(log {short(data_log)})")


def parser():
    p = Parser(prog=prog("qknorm_pipeline.study"), tag=TAG, description=__doc__)
    p.add_argument("--config", default=config.DEFAULT, help="the study (default configs/studies/gl-en.yaml: model size, "
                                                     "budget, systems, seeds, the stock rows' recipe)")
    p.add_argument("--systems", help='a subset of the config\'s systems, "a b" (ours and its stock rows)')
    p.add_argument("--seeds", type=int, help="seeds 1..N of every chosen system (default: each system's seeds)")
    p.add_argument("--runs", help='only these runs of the chosen systems and seeds, "RUN1 RUN2" (e.g. qknorm_seed3 '
                                  "postnorm_lr2x): train only these (the report then holds every recorded run), or "
                                  "with --report-only report only these")
    p.add_argument("--max-update", type=int, help="a smaller budget for a smoke run; its runs and results go to "
                                                  "folders named NAME-uN, apart from the study's")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild the report from the records of the chosen runs (every one must be finished); "
                        "it needs the study's corpus, whose prepared test set is the reference")
    p.add_argument("--source-dir", help="take the study's corpus from this folder ({train,dev,test}.{xx,yy}, checked "
                                        "against the config's line counts and sha256) instead of its corpus: source "
                                        "or dir; copied into the study's $DATA_DIR/NAME/PAIR/raw, used from there on")
    p.add_argument("--dry-run", action="store_true",
                   help="print every run's state (same, more-updates, different: ..., to train) and the "
                        "command.txt its record would hold; train nothing")
    p.add_argument("--verbose", action="store_true", help="every tool's whole output (= VERBOSE=1)")
    return p


def select(cfg, a, records_dir, names=None):
    """The runs of the chosen systems and seeds, or of those only NAMES ("RUN1 RUN2", --runs), and
    {system: [seeds]} of those that wait for the system's grid."""
    systems = a.systems.split() if a.systems else None
    best = records.best_rates(cfg, records_dir)
    chosen = config.runs(cfg, systems, a.seeds, best=best)
    waiting = config.waiting(cfg, systems, a.seeds, best)
    if names:
        unknown = [r for r in names.split() if r not in {c.name for c in chosen}]
        if unknown:
            later = f"; not named yet: the best-rate runs of {', '.join(waiting)}" if waiting else ""
            raise UsageError(f"--runs: {' '.join(unknown)} not among the study's runs ({' '.join(c.name for c in chosen)})"
                             + later)
        chosen, waiting = [c for c in chosen if c.name in names.split()], {}
    return chosen, waiting


def report_command(a):
    """The --report-only command of this study (the report adds --runs when it lacks some runs)."""
    words = ["bash", "scripts/study.sh"] + (["--config", a.config] if a.config != config.DEFAULT else [])
    return words + (["--max-update", str(a.max_update)] if a.max_update else []) + ["--report-only"]


def run(a):
    if a.verbose:
        os.environ["VERBOSE"] = "1"
    for flag, value in (("--seeds", a.seeds), ("--max-update", a.max_update)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be a positive integer, got {value}")
    cfg = config.load(a.config)
    if cfg.closed and not (a.report_only or a.dry_run):
        raise UserError(f"{cfg.config}: the study is closed (closed: true), it trains no more runs: rebuild its report "
                        "with --report-only, or remove closed: to train")
    name = cfg.name + (f"-u{a.max_update}" if a.max_update else "")
    where = folders().under(name)
    records_dir = os.path.join(where.results, "runs", cfg.pair)
    chosen, waiting = select(cfg, a, records_dir, a.runs)
    if not a.report_only and not hardware.has_gpu():
        where_to = "on a GPU" + (" or on a CPU that has them" if cfg.precision == "bf16" else "")
        try:
            train_step.check_cpu_precision(cfg.precision, setting=f"{cfg.config}: precision:",
                                           fix=f"run the study {where_to} (every run of a study trains in its "
                                               "config's precision)")
        except UserError as e:
            if not a.dry_run:
                raise
            log(TAG, f"note: this machine could not train these runs: {e}")  # a dry run trains nothing
    prepare_data(cfg, where, a.source_dir)
    if not a.report_only:
        runs.train_all(cfg, chosen, where, records_dir, a.max_update, a.dry_run, waiting)
        if waiting and not a.dry_run:  # the grid's records now name each system's best rate
            known = {c.name for c in chosen}
            chosen, waiting = select(cfg, a, records_dir, a.runs)
            named = [c for c in chosen if c.name not in known]
            if named:
                runs.train_all(cfg, named, where, records_dir, a.max_update, waiting=waiting)
    if a.dry_run:
        return
    if not a.report_only:  # the report: every recorded run of the chosen systems and seeds, not only this call's
        chosen = [c for c in select(cfg, a, records_dir)[0] if records.recorded(records_dir, c.name)]
    md = report.write(cfg, chosen, where, records_dir, a.max_update, report_command(a))
    with open(md, encoding="utf-8") as f:
        print(f.read())


def main(argv=None):
    return run_main(run, parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
