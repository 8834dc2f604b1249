#!/usr/bin/env bash
# Compare every evaluated system of a pair (or of all pairs) with the papers' numbers.
usage() {
  cat <<'USAGE'
usage: scripts/compare.sh [PAIR|all] [extra flags for python -m qknorm_fairseq.scoring.compare]

For each pair: reads $RESULTS_DIR/PAIR/<system>/{hyp.txt,scores.json} (scripts/evaluate.sh),
scores every system under every metric, tests each against the baseline (postnorm, else
scalenorm, else prenorm; override with --baseline NAME) with paired bootstrap resampling,
places the published numbers of results/published.csv beside them, prints the table and
writes $RESULTS_DIR/PAIR/compare.{md,csv,json}. Default: all pairs that have results.
USAGE
}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
TARGET=${1:-all}
[[ $# -gt 0 ]] && shift
activate_env
cd "$ROOT"

if [[ $TARGET == all ]]; then
  PAIRS=()
  for d in "$RESULTS_DIR"/*/; do
    p=$(basename "$d")
    [[ -f $ROOT/configs/$p.yaml || -f $DATA_BIN/$p/stats.json ]] && PAIRS+=("$p")
  done
  [[ ${#PAIRS[@]} -gt 0 ]] || die "no evaluated pairs under $RESULTS_DIR: run scripts/evaluate.sh PAIR SYSTEM first"
else
  PAIRS=("$TARGET")
fi
for PAIR in "${PAIRS[@]}"; do
  log "comparing $PAIR"
  python -m qknorm_fairseq.scoring.compare --pair "$PAIR" --results-dir "$RESULTS_DIR" \
    --lang "$(recipe "$PAIR" tgt)" "$@"
done
