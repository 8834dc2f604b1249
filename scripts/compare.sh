#!/usr/bin/env bash
# Compare every evaluated system of a pair (or of all pairs) with the papers' numbers.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
usage() {
  cat <<'USAGE'
usage: bash scripts/compare.sh [PAIR|--pair PAIR|all] [flags for python -m qknorm_pipeline.scoring.compare...]

  PAIR         a configs/PAIR.yaml with results; all (the default): every pair that has results
  -h, --help   this help; the flags passed on (--baseline NAME, --metric M, --detok D, --n-samples N,
               --seed S, --published CSV, --treebank-detok T, --runs RUN...) are listed by
               python -m qknorm_pipeline.scoring.compare --help

For each pair: reads $RESULTS_DIR/PAIR/<system>/{hyp.txt,scores.json} (scripts/evaluate.sh),
scores every system under every metric, tests each against the baseline (postnorm, else
scalenorm, else prenorm; override with --baseline NAME) with paired bootstrap resampling,
places the published numbers of results/published.csv beside them, prints the table and
writes $RESULTS_DIR/PAIR/compare.{md,csv,json}. Nothing is reused: the table is computed from the
current hypotheses every time (evaluate.sh keeps those in step with the checkpoints).
Exit status: 0 ok, 2 a usage error, 1 a failure.
USAGE
}
TARGET=all
case ${1:-} in
  -h|--help) usage; exit 0 ;;
  --pair) need "$@"; TARGET=$2; shift 2 ;;
  -*|"") ;;
  *) TARGET=$1; shift ;;
esac
activate_env
cd "$ROOT"
[[ $TARGET == all ]] || check_pair "$TARGET"

if [[ $TARGET == all ]]; then
  PAIRS=()
  for d in "$RESULTS_DIR"/*/; do
    p=$(basename "$d")
    [[ -f $ROOT/configs/$p.yaml || -f $DATA_BIN/$p/stats.json ]] && PAIRS+=("$p")
  done
  [[ ${#PAIRS[@]} -gt 0 ]] || die "no evaluated pairs under $(short "$RESULTS_DIR"): run bash scripts/evaluate.sh PAIR SYSTEM first"
else
  PAIRS=("$TARGET")
fi
for PAIR in "${PAIRS[@]}"; do
  python -m qknorm_pipeline.scoring.compare --pair "$PAIR" --results-dir "$RESULTS_DIR" \
    --lang "$(recipe "$PAIR" tgt)" "$@"
done
