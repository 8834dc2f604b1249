#!/usr/bin/env bash
# Downloads, verifies and extracts one pair's train/dev/test into $DATA_DIR/PAIR/raw/.
# The command is `python -m qknorm_pipeline.download`; bash scripts/download.sh --help lists its options.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
door qknorm_pipeline.download "$@"
