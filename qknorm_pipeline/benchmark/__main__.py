"""Speed benchmarks of the presets and of their kernels (see each tool's --help).

    python -m qknorm_pipeline.benchmark speed [--dim 256 --layers 3 --reps 15 ...] --out results/benchmark
    python -m qknorm_pipeline.benchmark kernels [--dim 256 --heads 4 --p 2 4 3.5] [--out results/kernels]
"""
from ..cli import Parser
from . import kernels, speed

TOOLS = {"speed": speed, "kernels": kernels}
POSITIVE = ("dim", "layers", "heads", "batch", "src_len", "tgt_len", "train_steps", "decode_batches", "beam", "reps",
            "vocab", "tokens", "iters")


def main(argv=None):
    p = Parser(prog="python -m qknorm_pipeline.benchmark", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, tool in TOOLS.items():
        tool.add_arguments(sub.add_parser(name, help=tool.HELP, description=tool.__doc__))
    opts = p.parse_args(argv)
    error = sub.choices[opts.cmd].error
    for k in POSITIVE:
        if getattr(opts, k, 1) is not None and getattr(opts, k, 1) < 1:
            error(f"--{k.replace('_', '-')} must be >= 1")
    if opts.dim % opts.heads:
        error(f"--dim {opts.dim} must be divisible by --heads {opts.heads}")
    if opts.threads:
        import torch

        torch.set_num_threads(opts.threads)
    return TOOLS[opts.cmd].run(opts)  # the results, for callers in Python


if __name__ == "__main__":
    main()
