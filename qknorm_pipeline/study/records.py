"""A finished run's record, what its training log says, and the scores of its test outputs.

The record, $RESULTS_DIR/NAME/runs/PAIR/RUN/, is kept in git (.gitignore) and is all the report
reads, so a study that spans interruptions survives a fresh clone where checkpoints and logs are gone:
train.log, the test hypotheses and scores of the best-dev checkpoint (hyp.txt, scores.json) and of
the last one (last/), and command.txt, how the run was made without this machine's paths:

    train: LAUNCHER FAIRSEQ-TRAIN-ARGUMENTS...
    decode: FAIRSEQ-GENERATE-ARGUMENTS... --metric M --detok D

Wall time of a run: its train.log holds fairseq's console output, whose lines carry timestamps,
after a `# DATE COMMAND` line at every (re)start. Each start is one segment; its time is its last
timestamp minus its first, and a run's wall time is the sum over its segments (training, validation
and checkpoint saving; Python's start-up before fairseq's first line is not counted). fairseq's own
"wall" field is not used: it restarts at every resumption. A validation's place on the time axis is
the time of the segments before it plus its offset in its own segment; when a resumed run
validates an update again, the later validation is kept. A segment's machine is the one the
training entry point logs (`| qknorm_pipeline.fairseq_train | machine: ...`); logs written before it
did have none.
"""
import os
import re
import shlex
import shutil
from datetime import datetime

from .. import fairseq_train
from ..fairseq_log import parse_line
from ..files import atomic_dir, write_atomic
from ..paths import shareable, shareable_text
from ..processes import command_change
from ..scoring.score import score_runs
from . import config
from .config import StudyError, all_systems, best_rate, run_name
from .stats import METRIC

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[ ,]")
MACHINE = re.compile(rf"\| {re.escape(fairseq_train.logger.name)} \| {fairseq_train.MACHINE}(.+)$")


def _lines(text):
    """{'train': words, 'decode': words} of a command.txt; an older record's `study:` line (the
    train.sh command that the train line expands) is not compared."""
    out = {}
    for line in text.strip().splitlines():
        key, _, rest = line.partition(": ")
        if key in ("train", "decode"):
            words = shlex.split(rest)
            if key == "train":
                # the launcher (python -m <entry point>, fairseq-train, torchrun ...) is not the run:
                # fairseq-train's arguments start at the data folder
                start = next((i for i, w in enumerate(words) if w.startswith("$DATA_BIN")), 0)
                words = words[start:]
            out[key] = words
    return out


def record_change(old, new):
    """How a run's record (its command.txt) stands against the command the study would run now:
    'same'; 'more-updates' when the one difference is a larger --max-update (a raised budget
    continues the run from its checkpoints); otherwise 'different: ...' naming the first difference."""
    a, b = _lines(old), _lines(new)
    if sorted(a) != sorted(b):
        return f"different: the record has {' and '.join(sorted(a)) or 'no'} lines, now {' and '.join(sorted(b))}"
    changes = {key: command_change(a[key], b[key]) for key in sorted(a)}
    for key, change in changes.items():
        if change.startswith("different: "):
            return f"different: {key}: {change.removeprefix('different: ')}"
    return "more-updates" if "more-updates" in changes.values() else "same"


def write_record(rec_dir, log_path, best_dir, last_dir, command):
    """The finished run's record, written whole or not at all (staged outside PAIR/, where compare looks)."""
    with atomic_dir(rec_dir, stage_in=os.path.dirname(os.path.dirname(rec_dir))) as tmp:
        with open(log_path, encoding="utf-8") as f:
            write_atomic(os.path.join(tmp, "train.log"), shareable_text(f.read()))
        for src, dst in ((best_dir, tmp), (last_dir, os.path.join(tmp, "last"))):
            if src and os.path.isfile(os.path.join(src, "scores.json")):
                os.makedirs(dst, exist_ok=True)
                for name in ("hyp.txt", "scores.json"):
                    shutil.copy(os.path.join(src, name), dst)
        write_atomic(os.path.join(tmp, "command.txt"), command + "\n")


def read_run(path):
    """{'wall_s', 'segments', 'updates', 'curve': [{'updates', 'wall_s', 'bleu'}], 'commands',
    'machines': [each segment's machine or None]} of one run's train.log (see the module docstring)."""
    if not os.path.isfile(path):
        raise StudyError(f"no train log {path!r}: train the run first (bash scripts/study.sh)")
    segments, commands = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("# "):
                segments.append({"first": None, "last": None, "valid": [], "updates": 0, "machine": None})
                commands.append(shareable_text(line[2:].strip().partition(" ")[2]))
                continue
            m = STAMP.match(line)
            if not m:
                continue
            if not segments:
                raise StudyError(f"{path}: log lines before the first '# DATE COMMAND' line; not written by "
                                 "scripts/train.sh or scripts/study.sh")
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
            seg = segments[-1]
            seg["first"] = t if seg["first"] is None else seg["first"]
            seg["last"] = t
            found = MACHINE.search(line.rstrip("\n"))
            if found:
                seg["machine"] = found.group(1)
                continue
            parsed = parse_line(line)
            if parsed is None:
                continue
            rec = parsed[1]
            if "valid_bleu" in rec:
                seg["valid"].append((t, int(rec["valid_num_updates"]), float(rec["valid_bleu"])))
            for key in ("num_updates", "valid_num_updates", "train_num_updates"):
                if key in rec:
                    seg["updates"] = max(seg["updates"], int(rec[key]))
    wall, points = 0.0, {}
    for seg in segments:
        if seg["first"] is None:
            continue
        for t, updates, bleu in seg["valid"]:
            points[updates] = {"updates": updates, "wall_s": wall + t - seg["first"], "bleu": bleu}
        wall += seg["last"] - seg["first"]
    return {"wall_s": wall, "segments": len(segments), "updates": max([s["updates"] for s in segments] or [0]),
            "curve": [points[u] for u in sorted(points)], "commands": commands,
            "machines": [s["machine"] for s in segments]}


def recorded(records_dir, run):
    """Whether the run named RUN has a finished record (its command.txt is written last)."""
    return os.path.isfile(os.path.join(records_dir, run, "command.txt"))


def best_rates(cfg, records_dir):
    """{system: its best LR of the grid} of an lr_grid study, for every system whose seed-1 runs at
    each LR of the grid are recorded (config.best_rate: the best dev BLEU of the run)."""
    out = {}
    for system in all_systems(cfg):
        names = {lr: run_name(system, 1, lr=lr) for lr in cfg.lr_grid}
        if cfg.lr_grid and all(recorded(records_dir, name) for name in names.values()):
            curves = {lr: read_run(os.path.join(records_dir, name, "train.log"))["curve"] for lr, name in names.items()}
            out[system] = best_rate({lr: max((v["bleu"] for v in c), default=float("-inf")) for lr, c in curves.items()})
    return out


def _score(ref, hyps, detok, lang):
    """{run: scores} and {run: per-sentence stats of METRIC and multi_bleu} of (run, hyp path)s."""
    if not hyps:
        return {}, {}
    scores, stats, _ = score_runs([ref], hyps, detok, lang)
    return scores, stats


def collect(chosen, records_dir, ref, rec):
    """Per run of CHOSEN: its record's scores against REF (best-dev and last checkpoint), the
    per-sentence statistics of METRIC, and its log (read_run)."""
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
