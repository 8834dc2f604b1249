"""Trains one system on one language pair with the papers' recipe (configs/base.yaml + configs/PAIR.yaml).

usage: bash scripts/train.sh [options] PAIR SYSTEM [extra fairseq-train flags...]
       (python -m qknorm_pipeline.train takes the same arguments)

  PAIR     a configs/PAIR.yaml ({pairs}), or a pair prepared with
           scripts/prepare.sh --src-dir (the base recipe, sized from its training set)
  SYSTEM   one of the config's systems (each a preset of qknorm_fairseq/architectures.py):
           {systems}
Extra flags go to fairseq-train unchanged and win over the recipe, e.g. --max-update 200 for a
short run.

Prints one line when training starts, then the progress (update / max update, loss, last dev BLEU,
LR, updates per second, ETA: a redrawn bar on a terminal, a line per validation otherwise), then a
summary with where the time went (start-up, validations, checkpoint writing). Writes checkpoints to
$CKPT_DIR/PAIR/NAME/ (checkpoint_best.pt by dev BLEU, checkpoint_last.pt) and fairseq's whole output
(JSON log records) to $LOG_DIR/PAIR/NAME/train.log.
Re-running resumes from checkpoint_last.pt (one cut short is refused, with what to do); a run that
finished with the same command is skipped.
Exit status: 0 trained (or already trained), 2 a usage error (this command's or fairseq's), 1 a failure.
"""
import argparse
import contextlib
import hashlib
import os
import shlex
import sys
import time
from dataclasses import dataclass, field

from . import hardware, processes, recipes
from .cli import Parser, UsageError, UserError, log, prog, report
from .cli import main as run_main
from .files import file_digest, is_whole_checkpoint, locked, write_atomic
from .names import folder_name, run_name
from .paths import folders, short

TAG = "train"
ENTRY = "qknorm_pipeline.fairseq_train"  # fairseq-train with --bf16 usable on a CPU (see its docstring)


@dataclass
class Options:
    """train.sh's options (see its --help)."""

    precision: str = "fp32"
    fast: bool = False
    schedule: str = None
    stopping: str = None
    paper_qknorm_length: bool = False
    seed: int = None
    name: str = None
    gpus: int = None
    max_tokens_per_gpu: int = None
    nodes: int = 1
    node_rank: int = None
    master: str = None
    extra: list = field(default_factory=list)  # fairseq-train flags after PAIR SYSTEM


@dataclass
class Run:
    """One training as it will be started."""

    pair: str
    system: str
    name: str
    cmd: list            # the whole command line, launcher included
    fairseq_args: list   # what fairseq-train receives: the run's identity
    save_dir: str
    log: str
    max_update: int
    where: str
    env: dict
    split: str = ""      # how an update's tokens are split over GPU processes


def _distributed(cfg, opts):
    """(launcher, fairseq flags, message) of a run on --gpus N [--nodes M]."""
    total, world = cfg.train.max_tokens, opts.gpus * opts.nodes
    if opts.max_tokens_per_gpu:
        tokens = opts.max_tokens_per_gpu
        split = f"{world} GPU processes x {tokens} tokens = {world * tokens} tokens per update (the recipe has {total})"
    else:
        if total % world:
            raise UserError(f"{world} GPU processes do not divide the recipe's {total} tokens per update: pass "
                            f"--max-tokens-per-gpu T (an update is then {world} x T tokens)")
        tokens = total // world
        split = (f"{world} GPU processes x {tokens} tokens = {total} tokens per update (the recipe's; "
                 "--max-tokens-per-gpu to change)")
    if opts.nodes > 1:
        host, port = opts.master.rsplit(":", 1)
        launcher = ["torchrun", "--nnodes", str(opts.nodes), "--node_rank", str(opts.node_rank),
                    "--nproc_per_node", str(opts.gpus), "--master_addr", host, "--master_port", port]
    else:
        launcher = ["torchrun", "--standalone", "--nproc_per_node", str(opts.gpus)]
    dist = ["--distributed-world-size", str(world), "--max-tokens", str(tokens)]
    if world == 1:
        # fairseq skips its distributed set-up at world size 1 (infer_init_method returns early); name
        # the init method so that one GPU runs the same code path (NCCL process group) as eight.
        dist += ["--distributed-init-method", "env://", "--distributed-no-spawn"]
    return launcher, dist, split


def last_value(args, flag, default=0):
    """The value of FLAG as fairseq reads it: the last one given wins."""
    value = default
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def plan(pair, system, opts, where=None, recipe=None, check=True):
    """The Run of PAIR SYSTEM with OPTS: the command, its folders and environment. RECIPE: a recipe
    of PAIR to use instead of its configs (a study's). CHECK: refuse a precision this machine cannot
    train in (a dry run shows the command all the same)."""
    where = where or folders()
    name = opts.name or run_name(system, opts.seed, opts.schedule)
    folder_name("--name" if opts.name else "run name", name, UsageError)
    data_bin = os.path.join(where.data_bin, pair)
    cfg = recipe or recipes.load(pair, data_bin, announce=True)
    recipes.system(cfg, system)
    save_dir = os.path.join(where.ckpt, pair, name)
    args = recipes.train_args(cfg, system, opts.schedule, opts.paper_qknorm_length, data_bin, save_dir, opts.stopping)
    args += ["--seed", str(opts.seed)] if opts.seed is not None else []
    launcher, split = [sys.executable, "-m"], ""
    if opts.gpus:
        launcher, dist, split = _distributed(cfg, opts)
        launcher += ["-m"]
        args += dist
    env = dict(os.environ)
    check_fast(opts)
    if opts.gpus or hardware.has_gpu():  # --gpus: a dry run on a machine without GPUs prints the GPU command
        args += [] if opts.precision == "fp32" else [f"--{opts.precision}"]
        if cfg.gpu.max_tokens_valid:
            args += ["--max-tokens-valid", str(cfg.gpu.max_tokens_valid)]
        device = f"{opts.gpus or 1} GPU(s) ({opts.precision})"
    else:
        env = recipes.cpu_env(cfg)
        if check:
            check_cpu_precision(opts.precision, env)
        args += ["--cpu"] + ([] if opts.precision == "fp32" else ["--bf16"])
        args += recipes.fast_args(cfg, opts.precision) if opts.fast else []
        optimizer = last_value(args + opts.extra, "--optimizer", None)
        if "--fused-adam" in args and optimizer != "multi_tensor_adam":  # only --fast adds it here
            raise UsageError(f"--fast with --precision bf16 adds --fused-adam, an option of --optimizer multi_tensor_adam, "
                             f"not of --optimizer {optimizer}: drop --optimizer {optimizer}, or --fast")
        device = f"CPU ({opts.precision}{', fast path' if opts.fast else ''})"
    args += opts.extra
    return _run(pair, system, name, [*launcher, ENTRY, *args], args, save_dir, where, device, env, split)


def plan_stock(pair, system, name, args, precision, where, check=True):
    """The Run of a stock fairseq row SYSTEM named NAME: ARGS from recipes.stock_args, whose --save-dir
    ends in PAIR/NAME, without --user-dir: plain fairseq-train in fp32, our entry point in bf16 and fp16. CHECK: as plan's."""
    gpu = hardware.has_gpu()
    args = args + ([] if gpu else ["--cpu"])
    if not gpu and check:
        check_cpu_precision(precision)
    # torch >= 2.6 loads with weights_only=True, which refuses fairseq 0.12's checkpoints (they pickle
    # an argparse.Namespace), so plain fairseq-train could not resume; our runs get an allow-list
    # from the plugin (qknorm_fairseq/checkpoint_compat.py), which this row must not load. It only
    # ever loads the checkpoints it wrote itself, in its own save dir.
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    # fairseq-train itself cannot train in bf16 without TPUs (qknorm_pipeline/fairseq_train.py, fix 1):
    # a bf16 stock row is started as ours are, with no --user-dir
    launcher = ["fairseq-train"] if precision == "fp32" else [sys.executable, "-m", ENTRY]
    return _run(pair, system, name, [*launcher, *args], args, last_value(args, "--save-dir"), where,
                f"{'GPU' if gpu else 'CPU'} ({precision})", env)


def _run(pair, system, name, cmd, args, save_dir, where, device, env, split=""):
    max_update = last_value(args, "--max-update")
    if not max_update.isdigit() or int(max_update) < 1:
        raise UsageError(f"--max-update must be a positive whole number, got {max_update!r}")
    return Run(pair, system, name, cmd, args, save_dir, os.path.join(where.logs, pair, name, "train.log"),
               int(max_update), device, env, split)


_WARNED = {}  # the slow-bf16 warning is given once per process


def check_cpu_precision(precision, env=None, setting="--precision", fix=None):
    """fp32 anywhere; bf16 on a CPU that multiplies bf16 natively (elsewhere torch emulates it, slower
    than fp32), with a warning where hardware.BF16_PROBE finds it slower than fp32 all the same (ENV: the
    run's); fp16 never (CPUs have no fast fp16 training path). SETTING: where the user chose the
    precision; FIX: what the error tells them to do instead."""
    if precision == "fp16":
        raise UserError(f"{setting} fp16 needs a GPU; none is visible to torch: "
                        f"{fix or 'on a CPU use bf16 (with native bf16 support) or fp32'}")
    if precision == "bf16" and not hardware.cpu_has_bf16():
        raise UserError(f"{setting} bf16: this CPU has no native bf16 instructions (AVX512-BF16, AMX or ARM BF16), "
                        f"so bf16 would run emulated, slower than fp32; {fix or 'drop --precision (fp32)'}")
    if precision == "bf16":
        speedup = hardware.cpu_bf16_speedup(env)
        if speedup < 1 and not _WARNED:
            _WARNED["bf16"] = True
            log(TAG, f"warning: --precision bf16 on this CPU ({hardware.cpu_name()}): a bf16 matrix product runs at "
                     f"{speedup:.2f}x the speed of fp32's (4096x256 by 256x1024), so bf16 trains slower than fp32 "
                     "here; drop --precision for speed (training goes on in bf16, as asked)")


def shown(cmd):
    """CMD as a user would type it: this Python as `python`."""
    return shlex.join(["python" if c == sys.executable else c for c in cmd])


def signature(run):
    """What makes a finished run the same: fairseq-train's arguments (not the launcher, not a GPU's
    validation batch size)."""
    return hashlib.sha1(shlex.join(without_gpu_validation(run.fairseq_args)).encode()).hexdigest()


def without_flags(args, flags):
    """ARGS without each of FLAGS and the value after it."""
    out, skip = [], False
    for word in args:
        if skip:
            skip = False
        elif word in flags:
            skip = True
        else:
            out.append(word)
    return out


def without_gpu_validation(args):
    """ARGS without --max-tokens-valid N, which a recipe's gpu: section adds on a GPU: a device setting,
    like --cpu, that a finished run's signature and a study's records leave out."""
    return without_flags(args, ("--max-tokens-valid",))


def settings(args):
    """fairseq-train's ARGS without the device's (--cpu, the distributed set-up, a GPU's validation batch
    size), with one --max-tokens first (so that a flag added at the end is named as the difference): the
    tokens per update, the last --max-tokens (fairseq's) times the processes. What must not change while
    a run's checkpoints are continued."""
    tokens = int(last_value(args, "--max-tokens", 0)) * int(last_value(args, "--distributed-world-size", 1))
    device = ("--distributed-world-size", "--distributed-init-method", "--max-tokens", "--max-tokens-valid")
    out = [w for w in without_flags(args, device) if w not in ("--cpu", "--distributed-no-spawn")]
    return ["--max-tokens", str(tokens)] + out


def check_same_run(run):
    """Resuming continues the checkpoints in the run's folder: refuse a command that differs from the
    one that trained them (its .command) in more than a larger --max-update."""
    started = os.path.join(run.save_dir, ".command")
    if not (os.path.isfile(started) and os.path.exists(os.path.join(run.save_dir, "checkpoint_last.pt"))):
        return
    with open(started, encoding="utf-8") as f:
        change = processes.command_change(shlex.split(f.read()), settings(run.fairseq_args))
    if change.startswith("different: "):
        raise UserError(f"{run.pair}/{run.name}: its checkpoints in {short(run.save_dir)}/ were trained by another "
                        f"command ({change.removeprefix('different: ')}): train this one under another name (--name NEW), "
                        f"or move that folder away to start {run.name} over")


def data_digest(data_bin):
    """SHA-256 over the binarized data (dictionaries, .bin and .idx files) a run trains on."""
    names = sorted(f for f in os.listdir(data_bin) if f.startswith("dict.") or f.endswith((".bin", ".idx")))
    return hashlib.sha256(" ".join(f"{n}:{file_digest(os.path.join(data_bin, n))}" for n in names).encode()).hexdigest()


def trained_on_other_data(save_dir, digest):
    """Whether the checkpoints in SAVE_DIR were trained on other data than DIGEST's (its .data; data prepared
    again since, another BPE or corpus, would be continued or decoded with the wrong vocabulary)."""
    path = os.path.join(save_dir, ".data")
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8") as f:
        return f.read().strip() != digest


def check_same_data(run, digest):
    """A run's checkpoints belong to the data they were trained on."""
    if trained_on_other_data(run.save_dir, digest):
        raise UserError(f"{run.pair}/{run.name}: the data in {short(run.fairseq_args[0])} has changed since its "
                        f"checkpoints in {short(run.save_dir)}/ were trained (prepared again?): train this one "
                        f"under another name (--name NEW), or move that folder away to train {run.name} again")


def check_resumable(run):
    """fairseq resumes from checkpoint_last.pt; one cut short would stop it with torch's traceback."""
    last = os.path.join(run.save_dir, "checkpoint_last.pt")
    if not os.path.exists(last) or is_whole_checkpoint(last):
        return
    raise UserError(f"{short(last)} is not a whole checkpoint (cut short?): move it away and train again, which "
                    f"starts {run.pair}/{run.name} over, or resumes from a readable checkpoint of this run copied "
                    "to that name (checkpoint_best.pt: from its best validation)")


def set_aside_old_log(run):
    """A run that starts from scratch (no checkpoint_last.pt) starts its log afresh, the earlier one renamed: a
    log's validations, curves and wall time are then one run's."""
    if os.path.exists(os.path.join(run.save_dir, "checkpoint_last.pt")) or not os.path.isfile(run.log):
        return
    stem, ext = os.path.splitext(run.log)
    old = stem + time.strftime(".%Y%m%dT%H%M%S", time.gmtime()) + ext
    os.replace(run.log, old)
    log(TAG, f"{run.pair}/{run.name}: no checkpoint to resume; the earlier log is kept as {short(old)}")


def train(run, python_warnings="show"):
    """Train RUN, resuming from its last checkpoint; skipped when it finished with the same command."""
    data_bin = run.fairseq_args[0]
    if not any(f.startswith("dict.") for f in (os.listdir(data_bin) if os.path.isdir(data_bin) else [])):
        raise UserError(f"no binarized data in {short(data_bin)}: run bash scripts/prepare.sh --pair {run.pair} first")
    os.makedirs(run.save_dir, exist_ok=True)

    def busy():
        raise UserError(f"{run.pair}/{run.name} is being trained by another process ({short(run.save_dir)}/ is locked): "
                        "wait for it to finish, or stop it, then run this command again")

    # two trainings of one run would write the same checkpoints and log; the other machines of a
    # multi-node run (--node-rank 1..) share the folder with the first, which holds the lock
    first = last_value(run.cmd, "--node_rank", "0") == "0"
    with locked(run.save_dir, busy) if first else contextlib.nullcontext():
        digest = data_digest(data_bin)
        check_same_data(run, digest)
        if processes.is_done(run.save_dir, signature(run)):
            log(TAG, f"{run.pair}/{run.name} already trained with this command: {short(run.save_dir)}/checkpoint_best.pt "
                     f"(move {short(run.save_dir)}/ away to train it again)")
            return
        check_resumable(run)
        check_same_run(run)
        if first:
            set_aside_old_log(run)
        if run.split:
            log(TAG, run.split)
        write_atomic(os.path.join(run.save_dir, ".command"), shlex.join(settings(run.fairseq_args)) + "\n")
        write_atomic(os.path.join(run.save_dir, ".data"), digest + "\n")
        log(TAG, f"training {run.pair}/{run.name} ({run.system}) on {run.where}; log {short(run.log)}, "
                 f"checkpoints {short(run.save_dir)}/")
        processes.run_training(f"{run.pair}/{run.name}", run.log, run.max_update, run.cmd, env=run.env,
                               python_warnings=python_warnings)
        processes.mark_done(run.save_dir, signature(run))


def check_options(opts):
    """A usage error for options that cannot go together or are out of range, before any work."""
    check_precision(opts.precision)
    check_fast(opts)
    for flag, value in (("--gpus", opts.gpus), ("--max-tokens-per-gpu", opts.max_tokens_per_gpu),
                        ("--nodes", opts.nodes)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be a positive integer, got {value}")
    if opts.seed is not None and opts.seed < 0:
        raise UsageError(f"--seed must be a non-negative integer, got {opts.seed}")
    if opts.max_tokens_per_gpu and not opts.gpus:
        raise UsageError("--max-tokens-per-gpu goes with --gpus")
    if opts.nodes > 1:
        if not opts.gpus:
            raise UsageError(f"--nodes {opts.nodes} goes with --gpus N (GPUs per machine)")
        if opts.node_rank is None or not 0 <= opts.node_rank < opts.nodes:
            raise UsageError(f"--nodes {opts.nodes} needs --node-rank 0..{opts.nodes - 1}, got {opts.node_rank}")
        host, _, port = (opts.master or "").rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"--nodes {opts.nodes} needs --master HOST:PORT (the machine of --node-rank 0), "
                             f"got {opts.master!r}")


def check_fast(opts):
    if opts.fast and (opts.gpus or hardware.has_gpu()):
        raise UsageError("--fast is the CPU's fast path; on a GPU the recipe as it is trains fastest "
                         "(docs/performance.md): drop --fast")


def check_precision(precision):
    if precision not in recipes.PRECISIONS:
        raise UsageError(f"--precision must be one of {', '.join(recipes.PRECISIONS)}, got {precision!r}")


def parser():
    base = recipes.base()
    p = Parser(prog=prog("qknorm_pipeline.train"), tag=TAG,
               description=__doc__.format(pairs=" ".join(recipes.available_pairs()), systems=" ".join(base.systems)),
               usage="%(prog)s [options] PAIR SYSTEM [extra fairseq-train flags...]",
               unknown_hint=" before PAIR SYSTEM; fairseq flags go after PAIR SYSTEM")
    p.add_argument("--precision", default="fp32", help=f"{'|'.join(recipes.PRECISIONS)} (default fp32): on a GPU any; "
                                                       "on a CPU bf16 where it has native bf16 instructions "
                                                       "(AVX512-BF16, AMX), else an error; a warning where "
                                                       "bf16 still multiplies slower than fp32")
    p.add_argument("--fast", action="store_true",
                   help="on a CPU, the fast path: the flags of the config's cpu.fast (and cpu.fast_bf16 with "
                        "--precision bf16), which change the bits of a run, not its recipe (docs/performance.md)")
    p.add_argument("--schedule", help=f"LR schedule from the config's schedules: ({', '.join(base.schedules)}); "
                                      "default: the config's train.schedule")
    p.add_argument("--stopping", help=f"stopping rule from the config's stopping: ({', '.join(base.stopping)}); "
                                      "default: the system's (docs/training.md)")
    p.add_argument("--paper-qknorm-length", action="store_true",
                   help="QKNorm's L from the config (the papers' value) instead of the data")
    p.add_argument("--seed", type=int, help="fairseq's random seed (default: the recipe's, 1); K != 1 trains the run "
                                            "SYSTEM_seedK, so each seed has its own checkpoints")
    p.add_argument("--name", help="run name (default SYSTEM, or SYSTEM_SCHEDULE with --schedule, then _seedK)")
    p.add_argument("--gpus", type=int, help="data-parallel training on N GPUs of this machine: N processes started "
                                            "by torchrun, fairseq's distributed engine (NCCL); the recipe's tokens "
                                            "per update are kept (each process takes max-tokens / N)")
    p.add_argument("--max-tokens-per-gpu", type=int, help="with --gpus: T tokens per process (an update is N x T)")
    p.add_argument("--nodes", type=int, default=1, help="with --gpus N: M machines of N GPUs each (run the same "
                                                        "command on every machine; scripts/slurm_train.sbatch does "
                                                        "this under Slurm)")
    p.add_argument("--node-rank", type=int, help="with --nodes: this machine's rank, 0..M-1")
    p.add_argument("--master", help="with --nodes: HOST:PORT of the machine of --node-rank 0")
    p.add_argument("--dry-run", action="store_true", help="print the command and exit")
    p.add_argument("--verbose", action="store_true", help="show fairseq's whole output instead of the progress "
                                                          "display (the same as VERBOSE=1)")
    p.add_argument("words", nargs=argparse.REMAINDER, help="PAIR SYSTEM [extra fairseq-train flags...]")
    return p


def run(a, own_options=()):
    """OWN_OPTIONS: train.sh's option strings, refused after PAIR SYSTEM."""
    if a.words[:1] == ["--"]:
        a.words = a.words[1:]
    if len(a.words) < 2 or a.words[0].startswith("-"):
        raise UsageError("need PAIR and SYSTEM")
    for word in a.words[2:]:
        if word.split("=", 1)[0] in own_options:
            # fairseq would reject it, or, for --seed, train another seed into the recipe's run folder
            raise UsageError(f"{word.split('=', 1)[0]} is train.sh's own option: put it before PAIR SYSTEM "
                             f"(train.sh {word.split('=', 1)[0]} ... {a.words[0]} {a.words[1]}); the flags after "
                             "them go to fairseq-train")
    if a.verbose:
        os.environ["VERBOSE"] = "1"
    opts = Options(a.precision, a.fast, a.schedule, a.stopping, a.paper_qknorm_length, a.seed, a.name, a.gpus,
                   a.max_tokens_per_gpu, a.nodes, a.node_rank, a.master, a.words[2:])
    check_options(opts)
    r = plan(a.words[0], a.words[1], opts)
    if a.dry_run:
        if r.split:
            log(TAG, r.split)
        print(shown(r.cmd))
        return
    if opts.gpus and hardware.gpu_count() < opts.gpus:
        raise UserError(f"--gpus {opts.gpus}: torch sees {hardware.gpu_count()} CUDA device(s) on this machine")
    train(r)


def main(argv=None):
    try:
        p = parser()  # its help names the base config's systems and schedules
    except UserError as e:  # before the parser, whose --help it names, exists
        return report(TAG, e)
    own = set(p._option_string_actions) - {"-h", "--help"}
    return run_main(lambda a: run(a, own), p, argv)


if __name__ == "__main__":
    sys.exit(main())
