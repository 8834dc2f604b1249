#!/usr/bin/env bash
# The real-data study of configs/studies/gl-en.yaml, resumable across sessions.
# The command is `python -m qknorm_pipeline.study`; bash scripts/study.sh --help lists its options.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
door qknorm_pipeline.study "$@"
