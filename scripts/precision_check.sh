#!/usr/bin/env bash
# GPU only: every system in fp32, bf16 and fp16, loss curves compared with fp32.
# The command is `python -m qknorm_pipeline.precision_check`; bash scripts/precision_check.sh --help lists its options.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
door qknorm_pipeline.precision_check "$@"
