#!/usr/bin/env bash
# One command from nothing to a BLEU table: download -> prepare -> train -> evaluate -> compare -> plots.
#   bash scripts/reproduce.sh                     the offline demo: a generated synthetic task,
#                                                 systems postnorm and qknorm (minutes on a CPU)
#   bash scripts/reproduce.sh PAIR [--systems "S1 S2 ..."] [--seeds N] [--gpus N] [--precision bf16]
#                             [-- extra fairseq-train flags]
# --seeds N trains and evaluates every system with seeds 1..N (runs SYSTEM, SYSTEM_seed2, ...;
# each resumes on its own); the table then gives mean ± sd over seeds, every seed's score and a
# significance test over seeds and sentences (docs/training.md, "Several seeds").
# --gpus N and --precision go to scripts/train.sh (N GPU processes, the papers' update size kept).
# PAIR: gl-en sk-en ar-en en-he en-vi (downloads the data; needs internet) or demo, or your own
# pair once prepared: bash scripts/prepare.sh --pair xx-yy --src-dir DIR (no config needed).
# Default systems for the real pairs: postnorm prenorm fixnorm scalenorm qknorm (TwT Table 3
# and QKNorm Table 2); SYSTEMS="..." in the environment works too.
# Every stage is idempotent: re-running resumes where an interruption stopped it.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
pair="" systems=${SYSTEMS:-} seeds=1 train_extra=() train_opts=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --systems) systems=${2:?--systems needs a value}; shift 2 ;;
    --seeds) seeds=${2:?--seeds needs a number}; shift 2 ;;
    --gpus|--precision) train_opts+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
    --) shift; train_extra=("$@"); break ;;
    -*) usage >&2; die "unknown option: $1" ;;
    *) [[ -z $pair ]] || die "one pair at a time (got '$pair' and '$1')"; pair=$1; shift ;;
  esac
done
pair=${pair:-demo}
[[ $seeds =~ ^[1-9][0-9]*$ ]] || die "--seeds must be a positive integer, got '$seeds'"
own_data=0
if [[ ! -f $ROOT/configs/$pair.yaml || $pair == base ]]; then
  [[ -f $DATA_BIN/$pair/stats.json ]] || die "unknown pair '$pair': choose one of $(cd "$ROOT/configs" && ls *.yaml | grep -vx base.yaml | sed 's/\.yaml$//' | tr '\n' ' ')or prepare your own corpus first: bash scripts/prepare.sh --pair $pair --src-dir DIR"
  own_data=1
fi
if [[ -z $systems ]]; then
  if [[ $pair == demo ]]; then systems="postnorm qknorm"; else systems="postnorm prenorm fixnorm scalenorm qknorm"; fi
fi
for s in train evaluate compare; do
  [[ -f $ROOT/scripts/$s.sh ]] || die "scripts/$s.sh is missing from this checkout"
done

activate_env
cd "$ROOT"
t0=$SECONDS
log "== $pair: data"
if [[ $own_data == 1 ]]; then
  log "$pair: your own corpus, prepared in $DATA_BIN/$pair (rerun scripts/prepare.sh --src-dir to change it)"
else
  bash scripts/download.sh --pair "$pair"
  bash scripts/prepare.sh --pair "$pair"
fi
for s in $systems; do
  for k in $(seq 1 "$seeds"); do
    run=$s seed_opt=()  # seed 1: the recipe's own run
    if [[ $k != 1 ]]; then run=${s}_seed$k seed_opt=(--seed "$k"); fi
    log "== $pair: training $run ($(( SECONDS - t0 )) s so far)"
    bash scripts/train.sh "${train_opts[@]}" "${seed_opt[@]}" "$pair" "$s" "${train_extra[@]}"
    log "== $pair: evaluating $run"
    bash scripts/evaluate.sh "$pair" "$run"
  done
done
log "== $pair: comparing $systems"
bash scripts/compare.sh "$pair"
log "== $pair: plots (results/README.md explains each)"
python -m qknorm_fairseq.plots dev-bleu --pair "$pair" --log-dir "$LOG_DIR" --out "$RESULTS_DIR/$pair/dev_bleu.png"
python -m qknorm_fairseq.plots grad-norm --pair "$pair" --log-dir "$LOG_DIR" --out "$RESULTS_DIR/$pair/grad_norm.png"
python -m qknorm_fairseq.plots scales --pair "$pair" --ckpt-dir "$CKPT_DIR" --out "$RESULTS_DIR/$pair/scales.png"
# QKNorm Figures 1-2: encoder self-attention of one test sentence, softmax baseline against QKNorm
if [[ " $systems " == *" qknorm "* ]]; then
  for base in postnorm prenorm fixnorm scalenorm; do
    [[ " $systems " == *" $base "* ]] || continue
    python -m qknorm_fairseq.plots attention --ckpt "$base=$CKPT_DIR/$pair/$base/checkpoint_best.pt" \
      --ckpt "qknorm=$CKPT_DIR/$pair/qknorm/checkpoint_best.pt" --data-bin "$DATA_BIN/$pair" \
      --index 0 --layer 0 --out "$RESULTS_DIR/$pair/attention.png"
    break
  done
fi
log "== $pair: finished in $(( SECONDS - t0 )) s; table: $RESULTS_DIR/$pair/compare.md, plots: $RESULTS_DIR/$pair/*.png"
