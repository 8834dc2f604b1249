#!/usr/bin/env bash
# The original code's procedure, one item at a time, on one pair and system.
# The command is `python -m qknorm_pipeline.ablation`; bash scripts/ablate.sh --help lists its options.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
door qknorm_pipeline.ablation "$@"
