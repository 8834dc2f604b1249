#!/usr/bin/env bash
# Decodes the test set with a trained run's checkpoint and scores it.
# The command is `python -m qknorm_pipeline.evaluate`; bash scripts/evaluate.sh --help lists its options.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
door qknorm_pipeline.evaluate "$@"
