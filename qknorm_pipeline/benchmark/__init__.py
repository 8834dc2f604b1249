"""Speed benchmarks, one module per tool, run as `python -m qknorm_pipeline.benchmark TOOL`:

    speed.py         training/decoding speed and memory of every preset against fairseq's
                     `transformer` (scripts/benchmark.sh runs it)
    kernels.py       each norm and l_p normalisation against its reference implementation (CPU)
    throughput.py    real fairseq-train updates per second, ours against stock fairseq (`fairseq-train`)
    step_profile.py  what one training update costs the host (throughput.py's host columns)
    validation.py    fairseq-train's validation (dev-set decoding) at several --max-tokens-valid values
    __main__.py      the command line they share: one sub-command per tool, --threads, checks

Convergence on real data is the study's (qknorm_pipeline/study/, scripts/study.sh).
"""
