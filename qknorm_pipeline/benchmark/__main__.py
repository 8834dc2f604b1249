"""Speed benchmarks of the presets and of their kernels (see each tool's --help).

usage: bash scripts/benchmark.sh [speed] [--reps N] [--dim D] [--layers L] [speed flags...]
       bash scripts/benchmark.sh kernels [--dim 256 --heads 4 --p 2 4 3.5] [--out results/kernels]
       bash scripts/benchmark.sh fairseq-train [--pair gl-en] [--systems qknorm fairseq_transformer] [--label L]
       bash scripts/benchmark.sh validation [--pair gl-en] [--checkpoint PT] [--max-tokens-valid 4096 32768] [--profile]
       bash scripts/benchmark.sh --convergence [scripts/study.sh flags...]
       (python -m qknorm_pipeline.benchmark takes the same arguments)

speed (the default): interleaved runs of every preset and of stock fairseq `transformer` with the
same dimensions, data, batch and dropout: training target tokens/s (after warm-up), peak memory,
beam-4 decoding sentences/s; median and spread; ratios to the stock model. CPU by default (one
thread, small dimensions, a few minutes); with a CUDA device: GPU + bf16 at the same dimensions (--dim 512
--layers 6 --heads 8 for fairseq's base size). Writes $RESULTS_DIR/benchmark.{md,json}.
fairseq-train: real fairseq-train updates/s of a prepared pair's recipe against stock fairseq,
appended to results/gpu/throughput.json (results/throughput-cpu.json on a CPU).
validation: fairseq-train's dev-set decoding (its validation) at several --max-tokens-valid values:
batches, decoder calls, seconds, dev BLEU, sentences scored, BLEU's string time; appended to results/gpu/validation.json
(results/validation-cpu.json on a CPU).
--convergence: the real-data study on TED gl->en (scripts/study.sh; see its --help).
Exit status: 0 ok, 2 a usage error, 1 a failure.
"""
import os
import shlex
import sys

from ..cli import Parser, prog
from ..cli import main as run_main
from ..paths import folders

TOOLS = ("speed", "kernels", "fairseq-train", "validation")
POSITIVE = ("dim", "layers", "heads", "batch", "src_len", "tgt_len", "train_steps", "decode_batches", "beam", "reps",
            "vocab", "tokens", "iters", "updates", "log_interval", "threads")


def parser():
    from . import kernels, speed, throughput, validation

    p = Parser(prog=prog("qknorm_pipeline.benchmark"), tag="benchmark", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    for name, tool in (("speed", speed), ("kernels", kernels), ("fairseq-train", throughput),
                       ("validation", validation)):
        tool.add_arguments(sub.add_parser(name, help=tool.HELP, description=tool.__doc__))
    return p


def run(opts):
    import torch

    from . import kernels, speed, throughput, validation

    error = parser()._subparsers._group_actions[0].choices[opts.cmd].error
    for k in POSITIVE:
        if getattr(opts, k, 1) is not None and getattr(opts, k, 1) < 1:
            error(f"--{k.replace('_', '-')} must be >= 1")
    if opts.cmd == "fairseq-train":
        return throughput.run(opts)
    if opts.cmd == "validation":
        return validation.run(opts)
    if getattr(opts, "extra", None):
        error(f"{opts.cmd} takes no flags after --, so '{shlex.join(opts.extra)}' would be ignored: give them "
              "before --")
    if opts.dim % opts.heads:
        error(f"--dim {opts.dim} must be divisible by --heads {opts.heads}")
    if opts.cmd == "kernels" and min(opts.p) < 1:
        error(f"--p {min(opts.p):g}: an l_p norm needs p >= 1")
    for flag, value in (("--dropout", [getattr(opts, "dropout", 0)]), ("--stock-dropout", getattr(opts, "stock_dropout", None))):
        if value and not all(0 <= v < 1 for v in value):
            error(f"{flag} must lie in [0, 1), got {' '.join(f'{v:g}' for v in value)}")
    if getattr(opts, "device", None) and opts.device.split(":")[0] not in ("cpu", "cuda"):
        error(f"--device must be cpu or cuda (cuda:N), got {opts.device!r}")
    if opts.cmd == "speed":
        opts.device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
        opts.dtype = opts.dtype or ("bf16" if opts.device.startswith("cuda") else "fp32")
        opts.out = opts.out or os.path.join(folders().results, "benchmark")
    if getattr(opts, "device", "cpu") == "cpu" and not opts.threads:
        # One CPU thread: on a shared, oversubscribed CPU, OpenMP threads spin-waiting for each other
        # make every op many times slower (measured on a 2-core AMD EPYC: 6 ms layer norms).
        opts.threads = 1
    if opts.threads:
        torch.set_num_threads(opts.threads)
    return {"speed": speed, "kernels": kernels}[opts.cmd].run(opts)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--convergence"]:
        from ..study.__main__ import main as study_main

        if os.environ.get("QKNORM_DOOR"):  # its usage line names what the user typed
            os.environ["QKNORM_DOOR"] += " --convergence"
        return study_main(argv[1:])
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["speed", *argv]
    return run_main(run, parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
