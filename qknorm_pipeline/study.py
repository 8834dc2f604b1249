"""The real-data study (configs/studies/*.yaml, run by scripts/study.sh): training flags,
wall time and dev-BLEU curves of every run, and the report.

    python -m qknorm_pipeline.study get CONFIG KEY                  # one value (dotted key)
    python -m qknorm_pipeline.study train-flags CONFIG SYSTEM [--max-update N]
        # fairseq flags appended to `scripts/train.sh PAIR SYSTEM` for one of our systems
    python -m qknorm_pipeline.study stock-args CONFIG --data-bin DIR --save-dir DIR --seed K [--max-update N]
        # the whole plain fairseq-train command line of the stock reference row
    python -m qknorm_pipeline.study record-change RECORD_COMMAND_TXT NOW_FILE|-
        # same / more-updates / different: ... (a finished run's record against the command now)
    python -m qknorm_pipeline.study report CONFIG --log-dir DIR --compare JSON --out DIR
        [--max-update N] [--command TEXT]

Wall time of a run: scripts/train.sh (and study.sh for the stock row) append fairseq's console
output, whose lines carry timestamps, to the run's train.log, after a `# DATE COMMAND` line at
every (re)start. Each start is one segment; its time is its last timestamp minus its first, and a
run's wall time is the sum over its segments (training, validation and checkpoint saving;
Python's start-up before fairseq's first line is not counted). fairseq's own "wall" field is not
used: it restarts at every resumption, and after a resumption mid-epoch it would read 0 (in
fairseq 0.12's code, StopwatchMeter.load_state_dict drops the start time; not observed here). A validation's place on the time axis is
the time of the segments before it plus its offset in its own segment; when a resumed run
validates an update again, the later validation is kept.
"""
import json
import os
import platform
import re
import shlex
import sys
from datetime import datetime

import yaml

from . import recipes
from .cli import Parser, fail
from .fairseq_log import parse_line
from .paths import ROOT, cpu_name, shareable
from .files import write_atomic

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[ ,]")


class StudyError(ValueError):
    pass


# ---------------------------------------------------------------- config

def load(path):
    if not os.path.isfile(path):
        raise StudyError(f"study config {path!r} not found (see configs/studies/)")
    with open(path) as f:
        cfg = yaml.safe_load(f) or {}
    for key in ("name", "pair", "source_dir", "seeds", "model", "budget", "dev_bleu", "systems", "stock"):
        if key not in cfg:
            raise StudyError(f"{path}: no {key!r} (see configs/studies/gl-en.yaml)")
    cfg["config"] = shareable(path)
    return cfg


def budget(cfg, max_update=None):
    """(updates, warmup updates, validation interval) of the study, or of a --max-update override
    (a smoke run: warmup and interval scaled with it). The study's own warmup is a fixed number
    of updates, so that no schedule depends on max_update: raising it continues every run."""
    b = cfg["budget"]
    n = int(max_update or b["max_update"])
    if n < 1:
        raise StudyError(f"--max-update must be >= 1, got {n}")
    if max_update is None:
        return n, int(b["warmup_updates"]), int(b["validate_every"])
    scale = n / int(b["max_update"])
    return n, max(1, round(int(b["warmup_updates"]) * scale)), max(1, round(int(b["validate_every"]) * scale))


def _model_flags(m):
    d, ffn, layers, heads = (str(m[k]) for k in ("embed_dim", "ffn_dim", "layers", "heads"))
    return ["--encoder-embed-dim", d, "--decoder-embed-dim", d, "--encoder-ffn-embed-dim", ffn,
            "--decoder-ffn-embed-dim", ffn, "--encoder-layers", layers, "--decoder-layers", layers,
            "--encoder-attention-heads", heads, "--decoder-attention-heads", heads]


def _schedule_flags(cfg, n, warmup, interval):
    dev = {k: cfg["dev_bleu"][k] for k in ("beam", "max_len_a", "max_len_b")}
    return ["--max-update", str(n), "--warmup-updates", str(warmup), "--validate-interval-updates", str(interval),
            "--save-interval-updates", str(interval), "--eval-bleu-args", json.dumps(dev)]


def train_flags(cfg, system, max_update=None, data_bin=None):
    """Flags that turn `train.sh PAIR SYSTEM`'s recipe into the study's: model size, budget, warmup,
    validation, and the peak LR the recipe's schedule gives at the study's model size with the
    recipe's own warmup (configs/studies/gl-en.yaml says why: the short warmup would raise it 8x)."""
    if system not in cfg["systems"]:
        raise StudyError(f"{system!r} is not one of the study's systems: {', '.join(all_systems(cfg))}")
    rec = recipes.load(cfg["pair"], data_bin)
    sched = rec["schedules"][rec["schedules"]["default"]]
    n, warmup, interval = budget(cfg, max_update)
    if "lr_scale" in sched:
        lr = recipes.peak_lr(float(sched["lr_scale"]), int(cfg["model"]["embed_dim"]), int(sched["warmup_updates"]))
    else:
        lr = float(sched["lr"])
    return [*_model_flags(cfg["model"]), *_schedule_flags(cfg, n, warmup, interval), "--lr", f"{lr:.6g}"]


def stock_args(cfg, data_bin, save_dir, seed, max_update=None):
    """fairseq-train's arguments for the stock row: fairseq's own recipe, no plugin."""
    rec = recipes.load(cfg["pair"], data_bin)
    n, warmup, interval = budget(cfg, max_update)
    args = [data_bin, "--source-lang", rec["src"], "--target-lang", rec["tgt"]]
    for key, value in cfg["stock"]["flags"].items():
        args += recipes._flag(key, value)
    args += [*_model_flags(cfg["model"]), *_schedule_flags(cfg, n, warmup, interval), "--seed", str(seed),
             "--validate-interval", "1000000", "--keep-interval-updates", "1", "--no-epoch-checkpoints",
             "--eval-bleu", "--eval-bleu-remove-bpe", recipes.remove_bpe(rec, data_bin), "--eval-tokenized-bleu",
             "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric",
             "--log-format", "json", "--log-interval", str(rec["train"].get("log_interval", 100)),
             "--save-dir", save_dir]
    return args


def all_systems(cfg):
    return [*cfg["systems"], cfg["stock"]["name"]]


def get(cfg, key):
    node = recipes.get(cfg, key)
    return " ".join(map(str, node)) if isinstance(node, list) else node


# ---------------------------------------------------------------- records

def record_change(old, new):
    """How a run's record (its command.txt: the study's command, the whole training command and the
    decoding settings, one per line) stands against the command the study would run now: 'same';
    'more-updates' when the one difference is a larger --max-update (a raised budget continues the
    run from its checkpoints); otherwise 'different: ...' naming the first difference."""
    old_lines, new_lines = old.strip().splitlines(), new.strip().splitlines()
    if old_lines == new_lines:
        return "same"
    if len(old_lines) != len(new_lines):
        return f"different: {len(old_lines)} lines against {len(new_lines)} (a record of an older format)"
    more = False
    for a, b in zip(old_lines, new_lines):
        ta, tb = shlex.split(a), shlex.split(b)
        if len(ta) != len(tb):
            return f"different: {a.split(':')[0]} line has {len(ta)} words against {len(tb)}"
        for i, (x, y) in enumerate(zip(ta, tb)):
            if x == y:
                continue
            if i and ta[i - 1] == "--max-update" and x.isdigit() and y.isdigit() and int(y) > int(x):
                more = True
                continue
            return f"different: {ta[0]} ... {ta[i - 1] if i else ''} {x!r} now {y!r}"
    return "more-updates" if more else "same"


# ---------------------------------------------------------------- logs

def read_run(path):
    """{'wall_s', 'segments', 'updates', 'curve': [{'updates', 'wall_s', 'bleu'}], 'commands'} of one
    run's train.log (see the module docstring)."""
    if not os.path.isfile(path):
        raise StudyError(f"no train log {path!r}: train the run first (bash scripts/study.sh)")
    segments, commands = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("# "):
                segments.append({"first": None, "last": None, "valid": [], "updates": 0})
                # the command without this checkout's location, which results must not name
                commands.append(line[2:].strip().partition(" ")[2].replace(ROOT + os.sep, ""))
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
            "curve": [points[u] for u in sorted(points)], "commands": commands}


# ---------------------------------------------------------------- report

def runs_of(system, seeds):
    """Run names of SYSTEM's seeds (train.sh --seed K: seed 1 is SYSTEM, K > 1 is SYSTEM_seedK)."""
    return {k: system if k == 1 else f"{system}_seed{k}" for k in range(1, seeds + 1)}


def collect(cfg, log_dir, systems, seeds):
    """{system: {seed: read_run(...)}} of the study's runs."""
    return {s: {k: read_run(os.path.join(log_dir, cfg["pair"], run, "train.log"))
                for k, run in runs_of(s, seeds).items()} for s in systems}


def time_rows(runs):
    from .scoring.compare import mean_sd

    rows = []
    for system, by_seed in runs.items():
        walls = [r["wall_s"] / 60 for r in by_seed.values()]
        best = [max(p["bleu"] for p in r["curve"]) for r in by_seed.values() if r["curve"]]
        rows.append({"system": system, "updates": [r["updates"] for r in by_seed.values()],
                     "wall_min": mean_sd(walls), "wall_per_seed": walls, "wall_total_min": sum(walls),
                     "best_dev_bleu": mean_sd(best) if best else None, "best_per_seed": best})
    return rows


def plot(runs, out, title):
    import matplotlib.pyplot as plt

    from .plots import _save

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (system, by_seed) in enumerate(runs.items()):
        for j, (seed, r) in enumerate(by_seed.items()):
            kw = {"color": colours[i % len(colours)], "ls": ["-", "--", ":", "-."][j % 4], "marker": ".",
                  "label": f"{system} seed {seed}"}
            axes[0].plot([p["updates"] for p in r["curve"]], [p["bleu"] for p in r["curve"]], **kw)
            axes[1].plot([p["wall_s"] / 60 for p in r["curve"]], [p["bleu"] for p in r["curve"]], **kw)
    axes[0].set_xlabel("updates")
    axes[1].set_xlabel("training wall time, minutes (validation included)")
    for ax in axes:
        ax.set_ylabel("dev BLEU (greedy)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    return _save(fig, out)


def machine():
    return f"{cpu_name()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"


def report(cfg, log_dir, compare_json, out_dir, max_update=None, command=None, systems=None, seeds=None):
    from .scoring import compare

    if not os.path.isfile(compare_json):
        raise StudyError(f"no test table {compare_json!r}: evaluate the runs first (bash scripts/study.sh)")
    table = compare.read(compare_json)
    for row in table["rows"]:
        row["published"] = []  # the papers' numbers are on another split of the corpus
    seeds = int(seeds or cfg["seeds"])
    runs = collect(cfg, log_dir, systems or all_systems(cfg), seeds)
    n, warmup, interval = budget(cfg, max_update)
    png = plot(runs, os.path.join(out_dir, "dev_bleu.png"),
               f"{cfg['name']}: dev BLEU, {n} updates, {seeds} seed(s) per system")
    times = time_rows(runs)
    m = cfg["model"]
    test = compare.to_rows(table)
    lines = [f"# {cfg['name']}: TED gl→en, {len(runs)} systems × {seeds} seed(s)", "",
             f"Command: `{command or 'bash scripts/study.sh'}`  ",
             f"Machine: {machine()}  ", f"Date: {datetime.now().astimezone().isoformat(timespec='seconds')}  ",
             f"Settings: {cfg['config']}; d = {m['embed_dim']}, {m['layers']}+{m['layers']} layers, "
             f"{m['heads']} heads, ffn {m['ffn_dim']}; {n} updates of at most 4,096 tokens; warmup {warmup}; "
             f"greedy dev BLEU every {interval} updates; test: scripts/evaluate.sh (beam 4, GNMT α 0.6) for every "
             f"system. Data: {cfg['source_dir']} (its own split, not the papers').", "",
             "## Test BLEU", "", "| " + " | ".join(test[0]) + " |", "|" + "---|" * len(test[0])]
    lines += ["| " + " | ".join(r) + " |" for r in test[1:]]
    if table.get("seeds"):
        spread = "mean over seeds ± sample standard deviation; p from the replicate bootstrap"
    else:
        spread = "one run per system, no spread; p from the paired bootstrap (test sentences only, not seed variance)"
    lines += ["", f"Baseline {table['baseline']}; {spread} (qknorm_pipeline/scoring/compare.py).", "",
              "## Training wall time and dev BLEU", "",
              "| system | updates per seed | wall time per run, min | all seeds, min | best dev BLEU |",
              "|---|---|---|---|---|"]
    def per_seed(values, digits):  # every seed's value after the mean, as the test table has them
        return " (" + ", ".join(f"{v:.{digits}f}" for v in values) + ")" if len(values) > 1 else ""

    for r in times:
        best = "" if r["best_dev_bleu"] is None else (compare.fmt_mean_sd(*r["best_dev_bleu"])
                                                      + per_seed(r["best_per_seed"], 2))
        wall = compare.fmt_mean_sd(*r["wall_min"], 1) + per_seed(r["wall_per_seed"], 1)
        lines.append(f"| {r['system']} | {' '.join(map(str, r['updates']))} | {wall} | "
                     f"{r['wall_total_min']:.1f} | {best} |")
    total = sum(r["wall_total_min"] for r in times)
    lines += ["", f"Total training time: {total:.1f} min (sum over runs, from the logs' timestamps; "
              "test decoding not included). Curves: dev_bleu.png (against updates and against wall time).", ""]
    result = {"name": cfg["name"], "max_update": n, "warmup_updates": warmup, "validate_every": interval,
              "seeds": seeds, "machine": machine(), "command": command, "test": table["rows"],
              "runs": {s: {str(k): {key: r[key] for key in ("wall_s", "segments", "updates", "curve", "commands")}
                           for k, r in by_seed.items()} for s, by_seed in runs.items()}}
    write_atomic(os.path.join(out_dir, "study.json"), json.dumps(result, indent=1) + "\n")
    write_atomic(os.path.join(out_dir, "study.md"), "\n".join(lines))
    return os.path.join(out_dir, "study.md"), png


# ---------------------------------------------------------------- command line

def main(argv=None):
    ap = Parser(prog="python -m qknorm_pipeline.study", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    p = sub.add_parser("get")
    p.add_argument("config")
    p.add_argument("key")
    p = sub.add_parser("train-flags")
    p.add_argument("config")
    p.add_argument("system")
    p.add_argument("--data-bin")
    p = sub.add_parser("stock-args")
    p.add_argument("config")
    p.add_argument("--data-bin", required=True)
    p.add_argument("--save-dir", required=True)
    p.add_argument("--seed", type=int, required=True)
    p = sub.add_parser("record-change", help="a record's command.txt against the command now (record_change)")
    p.add_argument("record", help="the record's command.txt")
    p.add_argument("now", help="a file with the command the study would run now ('-': standard input)")
    p = sub.add_parser("report")
    p.add_argument("config")
    p.add_argument("--log-dir", required=True)
    p.add_argument("--compare", required=True, help="compare.json of the study's runs (scoring/compare.py)")
    p.add_argument("--out", required=True, help="folder for study.md, study.json, dev_bleu.png")
    p.add_argument("--command", help="the command that ran the study, quoted in the report")
    p.add_argument("--systems", nargs="+", help="default: every system of the config")
    p.add_argument("--seeds", type=int, help="default: the config's seeds")
    for name in ("train-flags", "stock-args", "report"):
        sub.choices[name].add_argument("--max-update", type=int, help="override the config's budget (smoke runs)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "record-change":
            with open(args.record, encoding="utf-8") as f:
                old = f.read()
            new = sys.stdin.read() if args.now == "-" else open(args.now, encoding="utf-8").read()
            print(record_change(old, new))
            return 0
        cfg = load(args.config)
        if args.cmd == "get":
            print(get(cfg, args.key))
        elif args.cmd == "train-flags":
            print(shlex.join(train_flags(cfg, args.system, args.max_update, args.data_bin)))
        elif args.cmd == "stock-args":
            print(shlex.join(stock_args(cfg, args.data_bin, args.save_dir, args.seed, args.max_update)))
        else:
            for path in report(cfg, args.log_dir, args.compare, args.out, args.max_update, args.command,
                               args.systems, args.seeds):
                print(shareable(path))
    except StudyError as e:
        return fail(e, 2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
