#!/usr/bin/env bash
# The real-data studies of configs/studies/ (default gl-en.yaml; --config FILE), resumable: re-run the same command to go on.
# The command is `python -m qknorm_pipeline.study`; bash scripts/study.sh --help lists its options.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
door qknorm_pipeline.study "$@"
