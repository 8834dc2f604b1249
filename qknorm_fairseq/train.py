"""`fairseq-train` that can train in bf16 on a GPU.

    python -m qknorm_fairseq.train [fairseq-train arguments]      (what scripts/train.sh runs)

fairseq 0.12 ties `--bf16` to TPUs: `options.parse_args_and_arch` sets `args.tpu = True` whenever
`--bf16` is given, so a bf16 run on a CUDA GPU goes down the torch_xla path and fails
(`'NoneType' object has no attribute 'xrt_world_size'` under distributed training, no XLA device
otherwise). This entry point is fairseq-train with that one line undone when torch_xla is not
installed; everything else, bf16 included (model cast to bf16, fp32 master weights in fairseq's
FP16Optimizer), is fairseq's own.
"""


def untie_bf16_from_tpu(parse):
    def parse_args_and_arch(*args, **kwargs):
        out = parse(*args, **kwargs)
        ns = out[0] if isinstance(out, tuple) else out
        if getattr(ns, "bf16", False) and getattr(ns, "tpu", False):
            try:
                import torch_xla  # noqa: F401  (a real TPU machine keeps fairseq's behaviour)
            except ImportError:
                ns.tpu = False
        return out

    return parse_args_and_arch


def main():
    from fairseq import options
    from fairseq_cli import train

    from . import register

    register()  # `python -m` skipped it (see __init__.py); --user-dir then finds it registered

    options.parse_args_and_arch = untie_bf16_from_tpu(options.parse_args_and_arch)
    train.cli_main()


if __name__ == "__main__":
    main()
