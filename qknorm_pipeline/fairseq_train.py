"""`fairseq-train` with seven fixes: for the hardware people actually have, for interruptions and resumes.

    python -m qknorm_pipeline.fairseq_train [fairseq-train arguments]      (what scripts/train.sh runs)

1. bf16 on a GPU or a CPU. fairseq 0.12 ties `--bf16` to TPUs: `options.parse_args_and_arch` sets
   `args.tpu = True` whenever `--bf16` is given, so a bf16 run goes down the
   torch_xla path and fails (`'NoneType' object has no attribute 'xrt_world_size'` under
   distributed training). Undone here when torch_xla is not installed; bf16 itself (model cast to
   bf16, fp32 master weights in fairseq's FP16Optimizer) is fairseq's own. `--cpu --bf16` on a CPU
   without native bf16 instructions is an error (torch emulates bf16 there: docs/gpu.md, Precision).
2. Several processes on CPUs. fairseq's default DDP backend cannot wrap a CPU model (see
   distributed.py); with `--cpu` and no `--ddp-backend` given, `legacy_ddp` is used instead.

3. The training step. fairseq's Trainer is replaced by qknorm_fairseq/trainer.py's FastTrainer: no
   host-device sync in an update that does not log, one flat fp32 master tensor under --bf16.
4. Ctrl-C while a checkpoint is written. fairseq saves the first checkpoint file atomically but
   copies it onto the others (checkpoint_last.pt, the one a resume loads) in place, so a Ctrl-C in
   the copy would leave a truncated checkpoint_last.pt; here the Ctrl-C waits until saving returns.
5. bf16 matrix products on a CPU. oneDNN builds a kernel for every new product shape, costlier
   than the product, and keeps the last 1,024: fewer than an epoch's batches make, so every epoch
   built them all again. The cache keeps ONEDNN_CAPACITY (docs/performance.md: speed and memory)
   unless the user set its size; a CPU run's log says which.
6. Memory on a CPU. glibc's malloc spends a seventh of the update's main thread sorting its free
   chunks; a CPU run starts itself again with tcmalloc or jemalloc preloaded where one is installed
   (QKNORM_MALLOC chooses; allocator.py). Its log names the allocator.

7. A resume at the budget. fairseq's epoch loop trains an update before it tests --max-update, so a run
   resumed from a checkpoint_last.pt that already holds --max-update updates (its .done lost, or stopped
   between its last save and its end) would train one update past its budget and overwrite its
   checkpoints; here it trains none and ends, saying so in its log.

It also silences, at their source, the warnings no user can act on (NOISE: fairseq's own calls into
hydra's deprecated API and torch's deprecated autocast, pinned memory without a GPU; the plugin's
fairseq_quirks.py quiets fairseq's import); every other warning and every log record stays. And
it logs the machine it runs on (`machine: CPU, ...; torch ...`, with the GPU first on one), so a
train log says where each start of a run trained.
"""
import functools
import logging
import os
import signal
import sys
import warnings

from . import allocator, hardware

logger = logging.getLogger("qknorm_pipeline.fairseq_train")
MACHINE = "machine: "

# (category, start of the message) of warnings raised inside fairseq, hydra and torch on every start
NOISE = (
    (UserWarning, r"hydra\.experimental\.\w+\(\) is no longer experimental"),
    (UserWarning, r"\s*The version_base parameter is not specified"),
    (UserWarning, r"In '\w+': Usage of deprecated keyword in package header"),
    (UserWarning, r"\s*'\w+' is validated against ConfigStore schema"),
    (UserWarning, r"\s*The strict flag in the compose API is deprecated"),
    (UserWarning, r"'pin_memory' argument is set as true but no accelerator is found"),
    (FutureWarning, r"`torch\.cuda\.amp\.\w+\(args\.\.\.\)` is deprecated"),
)


def silence_noise():
    for category, message in NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)


# read by oneDNN when it builds its first kernel, so setting it before training is enough
ONEDNN_VARS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")  # the second: its old name
ONEDNN_CAPACITY = "16384"


def onednn_cache(environ=os.environ):
    """(variable, value): the size of oneDNN's kernel cache a training started in ENVIRON gets."""
    return next(((v, environ[v]) for v in ONEDNN_VARS if v in environ), (ONEDNN_VARS[0], ONEDNN_CAPACITY))


def keep_onednn_kernels(environ=os.environ):
    var, value = onednn_cache(environ)
    environ[var] = value


def _given(flag, argv):
    return any(a == flag or a.startswith(flag + "=") for a in argv)


# benchmark/step_profile.py counts ATen ops and syncs, which are the same on every CPU, so it may
# run emulated bf16; nothing that trains for its result does
EMULATED_BF16_OK = False


def fix_args(ns, argv):
    if getattr(ns, "bf16", False) and getattr(ns, "cpu", False) and not hardware.cpu_has_bf16() and not EMULATED_BF16_OK:
        sys.exit("[fairseq_train] error: --cpu --bf16: this CPU has no native bf16 instructions (AVX512-BF16, AMX "
                 "or ARM BF16), so torch would emulate bf16, many times slower than fp32; drop --bf16")
    if getattr(ns, "bf16", False) and getattr(ns, "tpu", False) and not _given("--tpu", argv):
        try:
            import torch_xla  # noqa: F401  (a real TPU machine keeps fairseq's behaviour)
        except ImportError:
            ns.tpu = False
    world = max(getattr(ns, "distributed_world_size", 1) or 1, int(os.environ.get("WORLD_SIZE", 1)))
    if getattr(ns, "cpu", False) and world > 1 and not _given("--ddp-backend", argv):
        from qknorm_fairseq.distributed import CPU_DDP_BACKENDS

        if ns.ddp_backend not in CPU_DDP_BACKENDS:
            logger.info(f"--cpu: --ddp-backend {CPU_DDP_BACKENDS[0]} (fairseq's {ns.ddp_backend} needs GPUs)")
            ns.ddp_backend = CPU_DDP_BACKENDS[0]
    return ns


def wrap_parser(parse, argv):
    def parse_args_and_arch(*args, **kwargs):
        out = parse(*args, **kwargs)
        ns = fix_args(out[0] if isinstance(out, tuple) else out, argv)
        # the train log's record of where each (re)start ran (study/records.py reads it)
        logger.info(f"{MACHINE}{hardware.machine(gpu=not getattr(ns, 'cpu', False))}")
        if getattr(ns, "cpu", False):
            logger.info("oneDNN's kernel cache: {}={} (docs/performance.md)".format(*onednn_cache()))
            line, warn = allocator.describe()
            (logger.warning if warn else logger.info)(line)
        return out

    return parse_args_and_arch


def ctrl_c_after(save):
    """SAVE with a Ctrl-C that arrives during it raised once it has returned."""
    @functools.wraps(save)
    def saved(*args, **kwargs):
        caught = []
        old = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
        try:
            return save(*args, **kwargs)
        finally:
            signal.signal(signal.SIGINT, old)
            if caught:
                logger.info("Ctrl-C: stopped after writing the checkpoints")
                raise KeyboardInterrupt

    return saved


def within_budget(train_epoch):
    """fairseq_cli.train.train (one epoch), which does nothing where the checkpoint it starts from holds
    --max-update updates. Only its first call: a budget lowered during training (ValDecay's stop at the end of
    an epoch) keeps fairseq's one more update, validation and save, as before."""
    started = []

    @functools.wraps(train_epoch)
    def train(cfg, trainer, task, epoch_itr):
        done, budget = trainer.get_num_updates(), cfg.optimization.max_update
        if not started and budget and done >= budget:
            logger.info(f"the checkpoint holds {done} updates, --max-update {budget}: nothing left to train")
            return [None], True
        started.append(True)
        return train_epoch(cfg, trainer, task, epoch_itr)
    return train


def chosen_help(argv):
    """The flags of the model, task, criterion, optimizer and scheduler ARGV chooses. fairseq prints
    --help before it adds them (it parses twice: the first pass, which knows none of them, answers
    --help), so `fairseq-train --arch X --help` never lists X's flags; this entry point prints them
    after fairseq's help."""
    import argparse

    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.optim import OPTIMIZER_REGISTRY
    from fairseq.optim.lr_scheduler import LR_SCHEDULER_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    def given(*flags):
        return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in flags), None)

    if given("--arch", "-a") is None:
        print("\n(add --arch ARCH to list that model's flags too; --task, --criterion, --optimizer and "
              "--lr-scheduler likewise)")
    for flags, registry, kind in ((("--arch", "-a"), ARCH_MODEL_REGISTRY, "model"), (("--task",), TASK_REGISTRY, "task"),
                                  (("--criterion",), CRITERION_REGISTRY, "criterion"),
                                  (("--optimizer",), OPTIMIZER_REGISTRY, "optimizer"),
                                  (("--lr-scheduler",), LR_SCHEDULER_REGISTRY, "scheduler")):
        name = given(*flags)
        if name not in registry:
            continue
        cls = registry[name]
        p = argparse.ArgumentParser(prog=f"{flags[0]} {name}", add_help=False, usage=argparse.SUPPRESS)
        cls.add_args(p)
        print(f"\nflags of {flags[0]} {name} ({kind} {cls.__name__}" + ("; the preset sets some of them):"
                                                                         if kind == "model" else "):"))
        print(p.format_help())


def main(argv=None):
    if argv is None:  # started as a program: it may start again with another allocator (allocator.py)
        try:
            allocator.restart_with_allocator(sys.argv[1:])
        except ValueError as e:
            sys.exit(f"[fairseq_train] error: {e}")
    silence_noise()
    keep_onednn_kernels()
    # isort: off
    import qknorm_fairseq  # noqa: F401  (first: it imports fairseq quietly; --user-dir then finds it imported)
    from fairseq_cli import train  # sets fairseq's log format: our import left the root logger as it was
    from fairseq import checkpoint_utils, options
    from qknorm_fairseq.trainer import FastTrainer
    # isort: on

    train.Trainer = FastTrainer
    train.train = within_budget(train.train)
    checkpoint_utils.save_checkpoint = ctrl_c_after(checkpoint_utils.save_checkpoint)

    argv = sys.argv[1:] if argv is None else argv
    options.parse_args_and_arch = wrap_parser(options.parse_args_and_arch, argv)
    try:
        train.cli_main()
    except SystemExit as e:
        if e.code in (0, None) and any(a in ("-h", "--help") for a in argv):
            chosen_help(argv)
        raise


if __name__ == "__main__":
    main()
