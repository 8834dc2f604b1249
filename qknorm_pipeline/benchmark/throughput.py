"""Real fairseq-train updates per second: a pair's recipe for our systems against stock fairseq, in
every precision this machine trains in, with what an update costs the host.

Each system trains --updates updates of the pair's prepared data exactly as train.sh starts it
(the recipe's model, batch and precision), without validation or checkpoints; the stock row is
fairseq's `transformer` at the recipe's model size with fairseq's IWSLT recipe (configs/base.yaml
stock:), started by the same entry point as ours
(qknorm_pipeline.fairseq_train, which bf16 on a CPU needs), so the rows differ only in model and
recipe. On a CPU each row also names its memory allocator (allocator.py; --mallocs compares them side
by side). The (system, precision, allocator) runs alternate, --reps times. A run's speed is the median of
fairseq's own `ups` (updates/s over each --log-interval) after --warmup updates; the median of each
epoch's `ups` is kept beside it (a GPU meets every batch shape for the first time in epoch 1 and
pays for it there: cuDNN plans, allocator blocks, compiled graphs). Then, once per
run, qknorm_pipeline/benchmark/step_profile.py counts one non-logging update (--profile-update; two
past an epoch's batches it profiles a later epoch, whose shapes the caches have met): ATen ops by phase,
host-device syncs, the training split's batch shapes per epoch and padding fraction, and the time of
the update before it by op family; the table prints the matrix products' share of that update and
the update's time over theirs: how far the update is from the time its arithmetic needs.
Records are appended to --out (default: results/gpu/throughput.json on a GPU,
results/throughput-cpu.json on a CPU), one per system, precision and repetition.
"""
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime

from .. import allocator, recipes
from .. import train as train_step
from ..cli import UserError, log
from ..fairseq_log import parse_line
from ..fairseq_train import onednn_cache
from ..files import read_json, write_atomic
from ..hardware import cpu_has_bf16, device_name, machine
from ..paths import Folders, folders, shareable
from ..recipes import STOCK
from ..train import ENTRY

CUDNN_ENV = "QKNORM_CUDNN_ATTENTION"  # qknorm_fairseq/cudnn_attention.py (not imported: it imports torch)
HELP = "real fairseq-train updates/s of a pair's recipe against stock fairseq (writes throughput.json)"
PROFILED_UPDATE = 6  # the default: inside epoch 1 on every pair


def stock_command(cfg, data_bin, save_dir, gpu, precision):
    """fairseq-train (no --user-dir) with the stock recipe (fairseq's IWSLT recipe) at the pair
    recipe's model size and batch, started as train.sh starts ours."""
    m, st = cfg.model, cfg.stock
    extra = [*recipes.size_args(m.embed_dim, m.ffn_dim, m.encoder_layers, m.decoder_layers, m.heads),
             "--warmup-updates", str(st.warmup_updates), *([] if gpu else ["--cpu"]),
             *([f"--{precision}"] if precision != "fp32" else [])]
    flags = {**st.flags, **st.iwslt, "max_tokens": cfg.train.max_tokens}
    return [sys.executable, "-m", ENTRY, *recipes.stock_args(cfg, flags, data_bin, save_dir, cfg.train.seed, extra)]


def mallocs(choices):
    """The allocators CHOICES (QKNORM_MALLOC values) name, as the records keep them: tcmalloc,
    jemalloc, system, or a library's path; UserError for one this machine does not have."""
    out = []
    for choice in choices:
        try:
            name, path = allocator.resolve(choice, allocator.search_dirs())
        except ValueError as e:
            raise UserError(str(e)) from None
        out.append(name if choice in allocator.CHOICES else path)
    return out


def commands(opts, where, scratch):
    """{(system, precision, allocator): (command, environment)} of every run to time."""
    data_bin = os.path.join(where.data_bin, opts.pair)
    if not any(f.startswith("dict.") for f in (os.listdir(data_bin) if os.path.isdir(data_bin) else [])):
        raise UserError(f"no prepared data in {shareable(data_bin)}: bash scripts/prepare.sh {opts.pair} first")
    timing = ["--max-update", str(opts.updates), "--disable-validation", "--no-save", "--log-format", "json",
              "--log-interval", str(opts.log_interval), "--num-workers", "0", *opts.extra]
    runs = Folders(where.data, where.data_bin, os.path.join(scratch, "ckpt"), os.path.join(scratch, "logs"),
                   where.results)
    out = {}
    for malloc in opts.mallocs:
        for precision in opts.precisions:
            for spec in opts.systems:
                system, _, flags = spec.partition(":")
                extra = timing + shlex.split(flags)
                if system == STOCK:
                    cfg = recipes.load(opts.pair, data_bin)
                    cmd = stock_command(cfg, data_bin, os.path.join(scratch, STOCK), opts.gpu, precision) + extra
                    env = dict(os.environ)
                else:
                    run = train_step.plan(opts.pair, system, train_step.Options(precision=precision, extra=extra), runs)
                    cmd, env = run.cmd, dict(run.env)
                env[allocator.VAR] = malloc
                out[spec, precision, malloc] = (cmd, env)
    return out


def recorded(cmd, scratch, gpu=False, malloc="system"):
    """CMD as a record keeps it: this Python as `python`, the repository's paths relative to it, the
    temporary folder as $SCRATCH, preceded by what changes its speed from outside it:
    QKNORM_CUDNN_ATTENTION=... when it is set, and on a CPU the size of oneDNN's kernel cache the run
    had (the training entry point's, or the user's) and its allocator MALLOC."""
    words = ["python" if w == sys.executable else shareable(w).replace(scratch, "$SCRATCH") for w in cmd]
    env = [f"{CUDNN_ENV}={os.environ[CUDNN_ENV]}"] if CUDNN_ENV in os.environ else []
    env += [] if gpu else ["{}={}".format(*onednn_cache()), f"{allocator.VAR}={shareable(malloc)}"]
    return shlex.join(env + words)


def profile_one(cmd, env, scratch, update=PROFILED_UPDATE):
    """step_profile's record of non-logging update UPDATE of CMD (an entry-point command)."""
    out = os.path.join(scratch, "profile.json")
    i = cmd.index(ENTRY)
    prof = [*cmd[:i], "qknorm_pipeline.benchmark.step_profile", out, "--update", str(update), "--",
            *cmd[i + 1:], "--max-update", str(update), "--log-interval", str(max(1000, update + 1))]
    p = subprocess.run(prof, env=env, capture_output=True, text=True)
    if p.returncode != 0 or not os.path.isfile(out):
        raise UserError(f"profiling {' '.join(cmd[:3])} ... failed ({p.returncode}): {(p.stderr or p.stdout)[-1500:]}")
    rec = read_json(out, "a step_profile run wrote it incompletely; run the benchmark again")
    os.remove(out)
    kept = ("ops", "syncs", "h2d", "sync_sites", "batches_per_epoch", "shapes_per_epoch", "padding", "padding_source",
            "padding_target", "update_ms", "op_ms", "top_ops", "op_families")
    return {"profiled_update": update, **{k: rec[k] for k in kept}}


def time_one(cmd, env, warmup, updates):
    """(median of fairseq's `ups` over the train_inner records after WARMUP updates, {epoch: median
    `ups` of that epoch's records}); the first record is in no epoch's median: it holds the start."""
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    check_allocator(p.stdout + p.stderr, cmd, env)
    ups, by_epoch, last = [], {}, 0
    for line in (p.stdout + p.stderr).splitlines():
        parsed = parse_line(line)
        if parsed and parsed[0] == "train_inner":
            rec = parsed[1]
            if last and "epoch" in rec:
                by_epoch.setdefault(str(int(rec["epoch"])), []).append(rec["ups"])
            last = int(rec["num_updates"])
            if last > warmup:
                ups.append(rec["ups"])
    if p.returncode != 0:
        if p.returncode > 0 or last < updates:
            raise UserError(f"{' '.join(cmd[:3])} ... failed ({p.returncode}): {(p.stderr or p.stdout)[-1500:]}")
        # every update logged, then the process died at exit (seen once on a 2-core CPU: a C++
        # "terminate called without an active exception"): the measurement is whole, the death is said
        log("benchmark", f"warning: {' '.join(cmd[:3])} ... logged all {updates} updates, then died with signal "
                         f"{-p.returncode} on exit")
    if not ups:
        raise UserError(f"no train_inner record after update {warmup}: raise --updates or lower --log-interval")
    return statistics.median(ups), {e: statistics.median(v) for e, v in by_epoch.items()}


def check_allocator(output, cmd, env):
    """UserError when a CPU run's log (OUTPUT) names another allocator than its environment chose."""
    malloc = (env or {}).get(allocator.VAR)
    if not malloc or not allocator.applies(cmd) or allocator.LOG not in output:
        return
    said = output[output.index(allocator.LOG):].splitlines()[0]
    if not said.startswith(allocator.LOG + allocator.label(malloc)):
        raise UserError(f"{' '.join(cmd[:3])} ... ran with another allocator than {allocator.VAR}={malloc} chose: {said}")


def old_records(out):
    """The records already in OUT (a JSON list), or [] when there is none."""
    if not os.path.isfile(out):
        return []
    return read_json(out, "repair it or name another file with --out", kind=list)


def default_precisions(gpu):
    if gpu:
        return ["bf16"]
    return ["fp32", "bf16"] if cpu_has_bf16() else ["fp32"]


def run(opts):
    if opts.profile_update < 3:
        raise UserError(f"--profile-update {opts.profile_update}: give 3 or more (its time is the update before it, "
                        "and the first update builds what the others reuse)")
    import torch

    opts.gpu = torch.cuda.is_available()
    opts.precisions = opts.precisions or default_precisions(opts.gpu)
    chosen = getattr(opts, "mallocs", None) or [os.environ.get(allocator.VAR, "auto")]
    opts.mallocs = ["system"] if opts.gpu else mallocs(chosen)
    if not opts.gpu:
        for precision in opts.precisions:
            train_step.check_cpu_precision(precision)
    device, machine_line = device_name(opts.gpu), machine(opts.gpu)
    out = opts.out or os.path.join(folders().results, "gpu/throughput.json" if opts.gpu else "throughput-cpu.json")
    if opts.warmup >= opts.updates:
        raise UserError(f"--warmup {opts.warmup} must be below --updates {opts.updates}")
    old_records(out)  # before the hour of measuring: a file the records cannot be appended to is refused now
    with tempfile.TemporaryDirectory() as scratch:
        cmds = commands(opts, folders(), scratch)
        speeds = {key: [] for key in cmds}
        epochs = {key: [] for key in cmds}
        for rep in range(1, opts.reps + 1):
            for key, (cmd, env) in cmds.items():
                ups, by_epoch = time_one(cmd, env, opts.warmup, opts.updates)
                speeds[key].append(ups)
                epochs[key].append(by_epoch)
                log("benchmark", f"rep {rep}/{opts.reps} {' '.join(key)}: {ups:.2f} updates/s "
                                 f"(by epoch: {per_epoch(by_epoch)})")
        profiles = {}
        if opts.profile:
            for key, (cmd, env) in cmds.items():
                profiles[key] = profile_one(cmd, env, scratch, opts.profile_update)
                log("benchmark", f"profiled {' '.join(key)}: {profiles[key]['ops']['total']} ops, "
                                 f"{profiles[key]['syncs']} syncs per update")
    date = datetime.now().astimezone().isoformat(timespec="seconds")
    records = [{"system": s, "updates_per_s": v, "updates_per_s_by_epoch": epochs[s, p, m][i], "rep": i + 1,
                "device": device, "machine": machine_line, "precision": p, "allocator": allocator.name_of(m),
                "pair": opts.pair, "updates": opts.updates, "warmup": opts.warmup, "label": opts.label, "date": date,
                "command": recorded(cmds[s, p, m][0], scratch, opts.gpu, m),
                **profiles.get((s, p, m), {})}
               for (s, p, m), values in speeds.items() for i, v in enumerate(values)]
    old = old_records(out)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    write_atomic(out, json.dumps(old + records, indent=1) + "\n")
    print(table(speeds, profiles, opts.reps, epochs))
    print(f"\n{opts.pair}, {machine_line}; appended to {shareable(out)}")
    return records


def per_epoch(by_epoch):
    return ", ".join(f"{e}: {v:.2f}" for e, v in by_epoch.items()) or "-"


def table(speeds, profiles, reps, epochs):
    """One row per (system, precision, allocator): median updates/s, its ratios to stock (same
    precision and allocator) and to fp32, each epoch's updates/s (the first repetition's), and the
    profile."""
    med = {k: statistics.median(v) for k, v in speeds.items()}
    head = f"| system | precision | allocator | updates/s (median of {reps}) | vs stock | vs fp32 | updates/s by epoch |"
    rule = "|---|---|---|---|---|---|---|"
    if profiles:
        head += (" ATen ops per update (fwd / bwd / clip / step / other) | syncs per update | shapes per epoch |"
                 " padding (source / target) | matrix products: ms (share of the update) | update / matrix products |")
        rule += "---|---|---|---|---|---|"
    lines = [head, rule]
    for (s, p, m), v in med.items():
        stock, fp32 = med.get((STOCK, p, m)), med.get((s, "fp32", m))  # a SYSTEM:FLAGS row: vs plain stock
        row = f"| {s} | {p} | {allocator.name_of(m)} | {v:.2f} |"
        row += f" {v / stock:.2f} |" if stock else " |"
        row += f" {v / fp32:.2f} |" if fp32 and p != "fp32" else " |"
        row += f" {per_epoch(epochs[s, p, m][0])} |"
        if (s, p, m) in profiles:
            r = profiles[s, p, m]
            o = r["ops"]
            phases = " / ".join(str(o.get(k, 0)) for k in ("forward", "backward", "clip", "step", "other"))
            row += (f" {o['total']} ({phases}) | {r['syncs']} | {r['shapes_per_epoch']} of {r['batches_per_epoch']} "
                    f"batches | {r['padding']:.1%} ({r['padding_source']:.1%} / {r['padding_target']:.1%}) | {matmul_share(r)} |")
        lines.append(row)
    return "\n".join(lines)


def matmul_share(profile):
    """'MS (SHARE) | RATIO' of a profiled update: its matrix products' milliseconds, their share of
    the update's wall time, and that time over theirs."""
    mm, wall = profile["op_families"]["matrix products"], profile["update_ms"]
    return f"{mm:.0f} ({mm / wall:.0%}) | {wall / mm:.2f}×" if mm else "0 | -"


def add_arguments(s):
    s.add_argument("--pair", default="gl-en", help="a prepared pair (default gl-en)")
    s.add_argument("--systems", nargs="+", default=["qknorm", STOCK],
                   help=f"systems of the pair's recipe and/or {STOCK} (default: qknorm {STOCK}); SYSTEM:FLAGS "
                        "adds fairseq-train flags to one row, e.g. 'qknorm:--fast-dropout --length-buckets 16'")
    s.add_argument("--updates", type=int, default=60, help="updates per timed run (default 60)")
    s.add_argument("--warmup", type=int, default=10, help="updates left out of the median (default 10)")
    s.add_argument("--log-interval", type=int, default=5, help="fairseq's --log-interval: ups is averaged over it")
    s.add_argument("--reps", type=int, default=1, help="alternating repetitions of every system (default 1)")
    s.add_argument("--precisions", nargs="+", choices=recipes.PRECISIONS,
                   help="default: bf16 on a GPU; on a CPU fp32 and, where it has native bf16 instructions, bf16")
    s.add_argument("--mallocs", nargs="+", metavar="ALLOCATOR",
                   help=f"CPU: the memory allocators to compare, each a {allocator.VAR} value ({', '.join(allocator.CHOICES)} "
                        f"or a library's path; default: {allocator.VAR}, else auto)")
    s.add_argument("--no-profile", dest="profile", action="store_false",
                   help="skip the per-update profile (ops, syncs, batch shapes)")
    s.add_argument("--profile-update", type=int, default=PROFILED_UPDATE,
                   help=f"the update the profile counts, timing the one before it (default {PROFILED_UPDATE}, in epoch "
                        "1); at an epoch's batches + 2 or more (gl-en: 159) a later epoch's, whose batch shapes "
                        "oneDNN's and cuDNN's caches have met; the profile trains that many updates of each row")
    s.add_argument("--label", default="", help="a note stored with the records, e.g. before or after a change")
    s.add_argument("--out", help="the JSON file the records are appended to")
    s.add_argument("extra", nargs="*", default=[], help="after --: fairseq-train flags for every system (e.g. a smaller model)")
