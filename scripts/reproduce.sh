#!/usr/bin/env bash
# One command from nothing to a BLEU table: download -> prepare -> train -> evaluate -> plots -> compare.
#   bash scripts/reproduce.sh [PAIR] [--systems "S1 S2 ..."] [--seeds N] [--gpus N]
#                             [--precision fp32|fp16|bf16] [--verbose] [-- extra fairseq-train flags]
#   PAIR (or --pair PAIR)   gl-en sk-en ar-en en-he en-vi (downloads the data; needs internet),
#                           demo (the default: an offline synthetic task, systems postnorm and
#                           qknorm, minutes on a CPU), or your own pair once prepared:
#                           bash scripts/prepare.sh --pair xx-yy --src-dir DIR (no config needed)
#   --systems "S1 S2 ..."   systems to train and compare (SYSTEMS="..." in the environment works too);
#                           default for the real pairs: postnorm prenorm fixnorm scalenorm qknorm
#                           (TwT Table 3 and QKNorm Table 2)
#   --seeds N               every system with seeds 1..N (runs SYSTEM, SYSTEM_seed2, ...; each
#                           resumes on its own); the table gives mean ± sd over seeds, every seed's
#                           score and a significance test over seeds and sentences (docs/training.md)
#   --gpus N, --precision P go to scripts/train.sh (N GPU processes, the papers' update size kept)
#   --verbose               every tool's whole output instead of one line per stage (= VERBOSE=1)
#   -h, --help              this help
# Prints one line per stage (what, where, how long), the progress of each training and decoding,
# then the table; everything else goes to log files under $LOG_DIR/PAIR/, named once.
# Every stage is idempotent: re-running resumes where an interruption stopped it.
# Exit status: 0 ok, 2 a usage error, 1 a failure.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
pair="" systems=${SYSTEMS:-} seeds=1 train_extra=() train_opts=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --pair) need "$@"; set -- "$2" "${@:3}" ;;
    --systems) need "$@"; systems=$2; shift 2 ;;
    --seeds) need "$@"; seeds=$2; shift 2 ;;
    --gpus|--precision) need "$@"; train_opts+=("$1" "$2"); shift 2 ;;
    --verbose) VERBOSE=1; shift ;;
    --) shift; train_extra=("$@"); break ;;
    -*) usage_error "unknown option $1" ;;
    *) pair_arg "$1"; shift ;;
  esac
done
pair=${pair:-demo}
positive --seeds "$seeds"
if [[ -z $systems ]]; then
  if [[ $pair == demo ]]; then systems="postnorm qknorm"; else systems="postnorm prenorm fixnorm scalenorm qknorm"; fi
fi
for s in train evaluate compare; do
  [[ -f $ROOT/scripts/$s.sh ]] || die "scripts/$s.sh is missing from this checkout"
done

activate_env
cd "$ROOT"
check_pair "$pair"
t0=$SECONDS
logs=$LOG_DIR/$pair
results=$RESULTS_DIR/$pair
log "$pair: systems $systems; logs in $(short "$logs")/, results in $(short "$results")/"

t=$SECONDS
mkdir -p "$logs" && : >"$logs/data.log"  # each run's own output
if [[ ! -f $ROOT/configs/$pair.yaml ]]; then
  log "data: your own corpus, prepared in $(short "$DATA_BIN/$pair") (rerun scripts/prepare.sh --src-dir to change it)"
else
  quietly "$logs/data.log" bash scripts/download.sh --pair "$pair" || die "download of $pair failed; log: $(short "$logs/data.log")"
  quietly "$logs/data.log" bash scripts/prepare.sh --pair "$pair" || die "preparing $pair failed; log: $(short "$logs/data.log")"
  log "data: $(short "$DATA_BIN/$pair") ready in $(( SECONDS - t )) s (log $(short "$logs/data.log"))"
fi

for s in $systems; do
  for k in $(seq 1 "$seeds"); do
    run=$s seed_opt=()  # seed 1: the recipe's own run
    if [[ $k != 1 ]]; then run=${s}_seed$k seed_opt=(--seed "$k"); fi
    bash scripts/train.sh "${train_opts[@]}" "${seed_opt[@]}" "$pair" "$s" "${train_extra[@]}"
    bash scripts/evaluate.sh "$pair" "$run"
  done
done

# TwT Figures 1-4 and, with a softmax baseline beside qknorm, QKNorm Figures 1-2 (results/README.md)
t=$SECONDS
: >"$logs/plots.log"
plots=(dev_bleu grad_norm scales)
quietly "$logs/plots.log" python -m qknorm_pipeline.plots dev-bleu --pair "$pair" --log-dir "$LOG_DIR" --out "$results/dev_bleu.png" \
  && quietly "$logs/plots.log" python -m qknorm_pipeline.plots grad-norm --pair "$pair" --log-dir "$LOG_DIR" --out "$results/grad_norm.png" \
  && quietly "$logs/plots.log" python -m qknorm_pipeline.plots scales --pair "$pair" --ckpt-dir "$CKPT_DIR" --out "$results/scales.png" \
  || die "a plot failed; log: $(short "$logs/plots.log")"
if [[ " $systems " == *" qknorm "* ]]; then
  for base in postnorm prenorm fixnorm scalenorm; do
    [[ " $systems " == *" $base "* ]] || continue
    quietly "$logs/plots.log" python -m qknorm_pipeline.plots attention --ckpt "$base=$CKPT_DIR/$pair/$base/checkpoint_best.pt" \
      --ckpt "qknorm=$CKPT_DIR/$pair/qknorm/checkpoint_best.pt" --data-bin "$DATA_BIN/$pair" \
      --index 0 --layer 0 --out "$results/attention.png" || die "the attention plot failed; log: $(short "$logs/plots.log")"
    plots+=(attention)
    break
  done
fi
grep -h '^warning: ' "$logs/plots.log" >&2 || true  # ours (plots.py), e.g. a checkpoint without learned scales
log "plots: $(short "$results")/{$(IFS=,; echo "${plots[*]}")}.png in $(( SECONDS - t )) s (log $(short "$logs/plots.log"))"

bash scripts/compare.sh "$pair"
log "$pair: finished in $(( SECONDS - t0 )) s; table $(short "$results/compare.md")"
