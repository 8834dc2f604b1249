#!/usr/bin/env bash
# Speed benchmarks: the presets against stock fairseq, their kernels, fairseq-train updates, fairseq-train's validation.
# The command is `python -m qknorm_pipeline.benchmark`; bash scripts/benchmark.sh --help lists its options.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
door qknorm_pipeline.benchmark "$@"
