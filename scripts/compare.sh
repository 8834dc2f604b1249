#!/usr/bin/env bash
# One BLEU table per pair: every system, every metric, significance, the published numbers.
# The command is `python -m qknorm_pipeline.scoring.compare`; bash scripts/compare.sh --help lists its options.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
door qknorm_pipeline.scoring.compare "$@"
