#!/usr/bin/env bash
# Prepares one pair for training: tokenize, length filter, joint BPE, binarize.
# The command is `python -m qknorm_pipeline.prepare`; bash scripts/prepare.sh --help lists its options.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
door qknorm_pipeline.prepare "$@"
