"""Real fairseq-train updates per second: a pair's recipe for our systems against stock fairseq.

Each system trains --updates updates of the pair's prepared data exactly as train.sh starts it
(the recipe's model, batch and precision), without validation or checkpoints; the stock row is plain
`fairseq-train --arch transformer` at the recipe's model size with fairseq's IWSLT recipe (the
study's stock flags, configs/studies/gl-en.yaml). The systems alternate, --reps times. A system's
speed is the median of fairseq's own `ups` (updates/s over each --log-interval) after --warmup
updates. Records are appended to --out (default: results/gpu/throughput.json on a GPU,
results/throughput-cpu.json on a CPU), one per system and repetition: system, updates_per_s,
device, precision, command, label, date.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime

from .. import recipes
from .. import train as train_step
from ..cli import UserError, log
from ..files import write_atomic
from ..paths import Folders, folders, shareable
from ..study import config as study_config

HELP = "real fairseq-train updates/s of a pair's recipe against stock fairseq (writes throughput.json)"
STOCK = "fairseq_transformer"


def stock_command(cfg, data_bin, save_dir, gpu, precision):
    """Plain fairseq-train with the study's stock recipe at the pair recipe's model size and batch."""
    m = cfg.model
    args = [data_bin, "--source-lang", cfg.src, "--target-lang", cfg.tgt,
            *study_config.stock_flags(study_config.load(study_config.DEFAULT), STOCK, max_tokens=cfg.train.max_tokens),
            *recipes.size_args(m.embed_dim, m.ffn_dim, m.encoder_layers, m.decoder_layers, m.heads),
            "--warmup-updates", "4000", "--save-dir", save_dir]
    args += ([f"--{precision}"] if precision != "fp32" else []) if gpu else ["--cpu"]
    return [os.path.join(os.path.dirname(sys.executable), "fairseq-train"), *args]


def commands(opts, where, scratch):
    """{system: (command, environment)} of every system to time."""
    data_bin = os.path.join(where.data_bin, opts.pair)
    if not any(f.startswith("dict.") for f in (os.listdir(data_bin) if os.path.isdir(data_bin) else [])):
        raise UserError(f"no prepared data in {shareable(data_bin)}: bash scripts/prepare.sh {opts.pair} first")
    timing = ["--max-update", str(opts.updates), "--disable-validation", "--no-save", "--log-format", "json",
              "--log-interval", str(opts.log_interval), "--num-workers", "0", *opts.extra]
    runs = Folders(where.data, where.data_bin, os.path.join(scratch, "ckpt"), os.path.join(scratch, "logs"),
                   where.results)
    out = {}
    for system in opts.systems:
        if system == STOCK:
            cfg = recipes.load(opts.pair, data_bin)
            cmd = stock_command(cfg, data_bin, os.path.join(scratch, STOCK), opts.gpu, opts.precision) + timing
            out[system] = (cmd, dict(os.environ))
        else:
            run = train_step.plan(opts.pair, system, train_step.Options(precision=opts.precision, extra=timing),
                                  runs)
            out[system] = (run.cmd, run.env)
    return out


def time_one(cmd, env, warmup, updates):
    """Median of fairseq's `ups` over the train_inner records after WARMUP updates."""
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    ups, last = [], 0
    for line in (p.stdout + p.stderr).splitlines():
        if "train_inner" in line and "{" in line:
            rec = json.loads(line[line.index("{"):])
            last = int(rec["num_updates"])
            if last > warmup:
                ups.append(float(rec["ups"]))
    if p.returncode != 0:
        if p.returncode > 0 or last < updates:
            raise UserError(f"{' '.join(cmd[:3])} ... failed ({p.returncode}): {(p.stderr or p.stdout)[-1500:]}")
        # every update logged, then the process died at exit (seen once on a 2-core CPU: a C++
        # "terminate called without an active exception"): the measurement is whole, the death is said
        log("benchmark", f"warning: {' '.join(cmd[:3])} ... logged all {updates} updates, then died with signal "
                         f"{-p.returncode} on exit")
    if not ups:
        raise UserError(f"no train_inner record after update {warmup}: raise --updates or lower --log-interval")
    return statistics.median(ups)


def run(opts):
    import torch

    opts.gpu = torch.cuda.is_available()
    opts.precision = opts.precision or ("bf16" if opts.gpu else "fp32")
    device = torch.cuda.get_device_name(0) if opts.gpu else f"CPU ({os.cpu_count()} cores)"
    out = opts.out or os.path.join(folders().results, "gpu/throughput.json" if opts.gpu else "throughput-cpu.json")
    if opts.warmup >= opts.updates:
        raise UserError(f"--warmup {opts.warmup} must be below --updates {opts.updates}")
    with tempfile.TemporaryDirectory() as scratch:
        cmds = commands(opts, folders(), scratch)
        speeds = {s: [] for s in cmds}
        for rep in range(1, opts.reps + 1):
            for system, (cmd, env) in cmds.items():
                speeds[system].append(time_one(cmd, env, opts.warmup, opts.updates))
                log("benchmark", f"rep {rep}/{opts.reps} {system}: {speeds[system][-1]:.2f} updates/s")
    date = datetime.now().astimezone().isoformat(timespec="seconds")
    records = [{"system": s, "updates_per_s": v, "rep": i + 1, "device": device, "precision": opts.precision,
                "pair": opts.pair, "updates": opts.updates, "warmup": opts.warmup, "label": opts.label, "date": date,
                "command": " ".join(shareable(w).replace(sys.executable, "python") for w in cmds[s][0])}
               for s, values in speeds.items() for i, v in enumerate(values)]
    old = json.load(open(out, encoding="utf-8")) if os.path.isfile(out) else []
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    write_atomic(out, json.dumps(old + records, indent=1) + "\n")
    base = statistics.median(speeds[STOCK]) if STOCK in speeds else None
    print(f"| system | updates/s (median of {opts.reps}) | vs stock |\n|---|---|---|")
    for s, values in speeds.items():
        med = statistics.median(values)
        print(f"| {s} | {med:.2f} | {med / base:.2f} |" if base else f"| {s} | {med:.2f} | |")
    print(f"\n{opts.pair}, {device}, {opts.precision}; appended to {shareable(out)}")
    return records


def add_arguments(s):
    s.add_argument("--pair", default="gl-en", help="a prepared pair (default gl-en)")
    s.add_argument("--systems", nargs="+", default=["qknorm", STOCK],
                   help=f"systems of the pair's recipe and/or {STOCK} (default: qknorm {STOCK})")
    s.add_argument("--updates", type=int, default=60, help="updates per timed run (default 60)")
    s.add_argument("--warmup", type=int, default=10, help="updates left out of the median (default 10)")
    s.add_argument("--log-interval", type=int, default=5, help="fairseq's --log-interval: ups is averaged over it")
    s.add_argument("--reps", type=int, default=1, help="alternating repetitions of every system (default 1)")
    s.add_argument("--precision", choices=("fp32", "bf16", "fp16"), help="default: bf16 on a GPU, fp32 on a CPU")
    s.add_argument("--label", default="", help="a note stored with the records, e.g. before or after a change")
    s.add_argument("--out", help="the JSON file the records are appended to")
    s.add_argument("extra", nargs="*", default=[], help="after --: fairseq-train flags for every system (e.g. a smaller model)")
