#!/usr/bin/env bash
# Mixed-precision check on a GPU: every system trains a few hundred updates in fp32, bf16 and fp16
# with the pair's recipe and the same seed; the loss curves are compared with fp32.
#   bash scripts/precision_check.sh [--pair gl-en] [--updates 300] [--warmup 100] [--jobs 6]
#                                   [--systems "postnorm qknorm ..."]
# The recipe's warmup is shortened (--warmup, default 100 updates) so that the short run reaches
# the recipe's peak learning rate; no validation, no checkpoints. Runs --jobs trainings at once
# on the one GPU. Needs data-bin/PAIR (scripts/prepare.sh). Writes $RESULTS_DIR/gpu/precision.{md,json};
# the fairseq logs are in $LOG_DIR/PAIR/SYSTEM_PRECISION/train.log.
# -h, --help: this help. Exit status: 0 ok, 2 a usage error, 1 a failure.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
pair=gl-en updates=300 warmup=100 jobs=6 systems=""
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --pair) need "$@"; pair=$2; shift 2 ;;
    --updates) need "$@"; updates=$2; shift 2 ;;
    --warmup) need "$@"; warmup=$2; shift 2 ;;
    --jobs) need "$@"; jobs=$2; shift 2 ;;
    --systems) need "$@"; systems=$2; shift 2 ;;
    *) usage_error "unknown argument $1" ;;
  esac
done
activate_env
cd "$ROOT"
has_gpu || die "the precision check needs a CUDA GPU (bf16/fp16 training); torch sees none"
[[ -n $systems ]] || systems=$(python -m qknorm_pipeline.recipes systems "$pair")
positive --updates "$updates"; positive --warmup "$warmup"; positive --jobs "$jobs"

run_one() {  # SYSTEM PRECISION
  local name=$1_$2
  rm -rf "${LOG_DIR:?}/$pair/$name" "${CKPT_DIR:?}/$pair/$name"
  if bash "$ROOT/scripts/train.sh" --precision "$2" --name "$name" "$pair" "$1" --max-update "$updates" \
      --warmup-updates "$warmup" --disable-validation --no-save --log-interval 10 --num-workers 0 \
      >"$LOG_DIR/$pair/$name.out" 2>&1; then
    log "$name: done"
  else
    log "$name: fairseq-train failed, see $LOG_DIR/$pair/$name.out"
  fi
}
export -f run_one log die
export pair updates warmup ROOT LOG_DIR CKPT_DIR
mkdir -p "$LOG_DIR/$pair"
log "$pair: $(wc -w <<<"$systems") systems x fp32 bf16 fp16, $updates updates each, $jobs at a time"
for s in $systems; do for p in fp32 bf16 fp16; do echo "$s $p"; done; done \
  | xargs -P "$jobs" -L 1 bash -c 'run_one "$0" "$1"'

gpu=$(python -c 'import torch; print(torch.cuda.get_device_name(0))')
settings="$pair recipe (configs/$pair.yaml), $updates updates, warmup shortened to $warmup updates, seed 1, \
no validation; $gpu, torch $(python -c 'import torch; print(torch.__version__)'); $jobs runs sharing the GPU. \
Command: bash scripts/precision_check.sh --pair $pair --updates $updates --warmup $warmup"
# shellcheck disable=SC2086
python -m qknorm_pipeline.precision_check --log-dir "$LOG_DIR/$pair" --systems $systems \
  --settings "$settings" --out "$RESULTS_DIR/gpu/precision"
