#!/usr/bin/env bash
# Trains one system on one language pair with the papers' recipe.
# The command is `python -m qknorm_pipeline.train`; bash scripts/train.sh --help lists its options.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
door qknorm_pipeline.train "$@"
