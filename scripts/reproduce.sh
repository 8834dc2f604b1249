#!/usr/bin/env bash
# From nothing to a BLEU table: download, prepare, train, evaluate, table, plots.
# The command is `python -m qknorm_pipeline.reproduce`; bash scripts/reproduce.sh --help lists its options.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
door qknorm_pipeline.reproduce "$@"
