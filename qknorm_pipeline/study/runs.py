"""Training, evaluating and recording every run of a study, resumable across interruptions.

A run whose record was made by the same command is skipped; one whose record differs only by a
smaller --max-update continues from its checkpoints; any other difference stops the study (move
the record away to redo the run). Each run: train (our systems: the train step with the study's
flags; stock rows: train.plan_stock's), resumed from checkpoint_last.pt; decode the test set with
the best-dev and with the last checkpoint; write the record.
"""
import os
import shlex
import sys

from .. import evaluate as evaluate_step
from .. import recipes
from .. import train as train_step
from ..cli import UserError, log
from ..names import run_name
from ..paths import ROOT, short
from . import config, records

TAG = "study"


def portable(cmd, where):
    """CMD as a record holds it: the study's folders by name, no machine paths, no device flag."""
    out = []
    for word in train_step.without_gpu_validation(cmd):
        if word == "--cpu":
            continue
        word = "python" if word == sys.executable else word
        for folder, var in ((where.data_bin, "$DATA_BIN"), (where.ckpt, "$CKPT_DIR")):
            word = word.replace(folder + os.sep, var + "/")
        out.append(word.replace(ROOT + os.sep, ""))
    return shlex.join(out)


def plan(cfg, run, rec, where, max_update=None, check=True):
    """The train.Run of one of the study's runs: ours through the train step, a stock row plain.
    CHECK: refuse a precision this machine cannot train in."""
    pair = cfg.pair
    if not run.stock:
        ours = cfg.systems[run.system]
        opts = train_step.Options(precision=cfg.precision, fast=cfg.fast, seed=run.seed, stopping=ours.stopping, schedule=cfg.schedule,
                                  name=run.name, extra=config.train_flags(cfg, run, rec, max_update))
        return train_step.plan(pair, run.system, opts, where, recipe=rec, check=check)
    data_bin, save_dir = os.path.join(where.data_bin, pair), os.path.join(where.ckpt, pair, run.name)
    args = config.stock_args(cfg, run, rec, data_bin, save_dir, max_update)
    return train_step.plan_stock(pair, run.system, run.name, args, cfg.precision, where, check=check)


def record_text(cfg, planned, rec, where):
    """command.txt of a run: the whole training command and the decoding settings."""
    decode = recipes.generate_args(rec, os.path.join(where.data_bin, cfg.pair))
    decode += ["--metric", rec.eval.metric, "--detok", rec.eval.detok]
    return f"train: {portable(planned.cmd, where)}\ndecode: {portable(decode, where)}"


def one_run(cfg, run, rec, where, records_dir, label, max_update=None, dry=False):
    """Train, evaluate and record RUN unless its record says it is finished."""
    planned = plan(cfg, run, rec, where, max_update, check=not dry)  # a dry run shows it on any machine
    command = record_text(cfg, planned, rec, where)
    rec_dir = os.path.join(records_dir, run.name)
    change = "to train"
    if records.recorded(records_dir, run.name):
        with open(os.path.join(rec_dir, "command.txt"), encoding="utf-8") as f:
            change = records.record_change(f.read(), command)
    if dry:
        print(f"== {run.name}: {change}\n{command}")
        return
    ckpt_last = os.path.join(planned.save_dir, "checkpoint_last.pt")
    if change == "same":
        log(TAG, f"{label}: finished, record {short(rec_dir)}/")
        return
    if change == "more-updates":
        if not os.path.isfile(ckpt_last):
            raise UserError(f"{label}: its record has fewer updates than asked and its checkpoints are not in "
                            f"{short(planned.save_dir)}/ to continue from; bring them back, or move the record away "
                            f"to train {run.name} from scratch")
        log(TAG, f"{label}: continuing its finished run to {planned.max_update} updates")
    elif change != "to train":
        raise UserError(f"{label}: its record {short(rec_dir)}/ was made by another command "
                        f"({change.removeprefix('different: ')}); move the record away (and "
                        f"{short(planned.save_dir)}/, to start from scratch) to train {run.name} again")
    else:
        log(TAG, label)
    train_step.train(planned, python_warnings="count" if run.stock else "show")
    evaluate_step.evaluate(cfg.pair, run.name, where=where)
    evaluate_step.evaluate(cfg.pair, run.name, checkpoint="last", where=where)
    records.write_record(rec_dir, planned.log, evaluate_step.out_dir(where, cfg.pair, run.name),
                         evaluate_step.out_dir(where, cfg.pair, run.name, "last"), command)
    log(TAG, f"record of {run.name}: {short(rec_dir)}/ (train.log, hyp.txt, scores.json, last/, command.txt; "
             "commit it)")


def waiting_text(cfg, waiting, records_dir):
    """What a dry run says of the runs at a best rate not known yet (config.waiting)."""
    grid = ", ".join(f"{lr:g}" for lr in cfg.lr_grid)
    lines = []
    for system, seeds in waiting.items():
        done = sum(os.path.isfile(os.path.join(records_dir, run_name(system, 1, lr=lr), "command.txt"))
                   for lr in cfg.lr_grid)
        lines.append(f"== {system} seeds {', '.join(map(str, seeds))}: at {system}'s best learning rate of the grid "
                     f"({grid}) by dev BLEU, named once its {len(cfg.lr_grid)} grid runs are recorded ({done} of "
                     f"{len(cfg.lr_grid)} so far)")
    return "\n".join(lines)


def train_all(cfg, chosen, where, records_dir, max_update=None, dry=False, waiting=None):
    """Train (or, DRY, show) the CHOSEN runs; WAITING: the runs of an lr_grid study that wait for
    their system's grid (config.waiting)."""
    rec = config.recipe(cfg, os.path.join(where.data_bin, cfg.pair))
    n = max_update or cfg.budget.max_update
    later = sum(len(seeds) for seeds in (waiting or {}).values())
    log(TAG, f"study {os.path.basename(where.results)}: {len(chosen)} runs of {n} updates each"
             + (f", then {later} at the best rates of the grid" if later else "")
             + ("; dry run: nothing is trained" if dry else ""))
    for i, run in enumerate(chosen, 1):
        one_run(cfg, run, rec, where, records_dir, f"run {i}/{len(chosen)} {run.name}", max_update, dry)
    if dry and waiting:
        print(waiting_text(cfg, waiting, records_dir))
