#!/usr/bin/env bash
# Trains one system on one language pair with the papers' recipe from configs/PAIR.yaml.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<EOF
usage: bash scripts/train.sh [options] PAIR SYSTEM [extra fairseq-train flags...]

  PAIR     a configs/PAIR.yaml (gl-en sk-en en-vi en-he ar-en demo)
  SYSTEM   one of the config's systems: (postnorm prenorm fixnorm scalenorm rmsnorm qknorm
           lpqknorm dnas hnas)
Options (before PAIR):
  --precision fp32|fp16|bf16   on a GPU (default fp32); a CPU run is always fp32
  --schedule NAME              LR schedule from the config's schedules: (valdecay, nowarmup,
                               invsqrtdecay, valdecay_2xlr, invsqrtdecay_2xlr); default: the config's
  --paper-qknorm-length        QKNorm's L from the config (the papers' value) instead of the data
  --name NAME                  run name (default SYSTEM, or SYSTEM_SCHEDULE with --schedule)
  --dry-run                    print the fairseq-train command and exit
Extra flags go to fairseq-train unchanged and win over the recipe, e.g. --max-update 200 for a short
run, or --distributed-world-size 4 for 4 GPUs.

Writes checkpoints to \$CKPT_DIR/PAIR/NAME/ (checkpoint_best.pt by dev BLEU, checkpoint_last.pt) and
the fairseq JSON log to \$LOG_DIR/PAIR/NAME/train.log. Re-running resumes from checkpoint_last.pt;
a run that finished with the same command is skipped.
EOF
}

precision=fp32 schedule="" paper_len=() name="" dry=0
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --precision) precision=${2:?--precision needs fp32, fp16 or bf16}; shift 2 ;;
    --schedule) schedule=${2:?--schedule needs a name}; shift 2 ;;
    --paper-qknorm-length) paper_len=(--paper-qknorm-length); shift ;;
    --name) name=${2:?--name needs a value}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --) shift; break ;;
    -*) die "unknown option $1 before PAIR SYSTEM (see --help); fairseq flags go after PAIR SYSTEM" ;;
    *) break ;;
  esac
done
[[ $# -ge 2 ]] || { usage >&2; die "need PAIR and SYSTEM"; }
pair=$1 system=$2
shift 2
extra=("$@")
case $precision in fp32|fp16|bf16) ;; *) die "--precision must be fp32, fp16 or bf16, got '$precision'" ;; esac
[[ -n $name ]] || name=$system${schedule:+_$schedule}

if [[ $dry == 1 && -x $VENV/bin/python ]]; then source "$VENV/bin/activate"; else activate_env; fi
cd "$ROOT"

save_dir=$CKPT_DIR/$pair/$name
log_dir=$LOG_DIR/$pair/$name
sched_args=()
[[ -n $schedule ]] && sched_args=(--schedule "$schedule")
err=$(mktemp)
if ! recipe_line=$(python -m qknorm_fairseq.recipes train-args "$pair" "$system" "${sched_args[@]}" \
    "${paper_len[@]}" --data-bin "$DATA_BIN/$pair" --save-dir "$save_dir" 2>"$err"); then
  grep -v tensorboardX "$err" >&2; rm -f "$err"
  die "no recipe for $pair $system (see the message above)"
fi
rm -f "$err"
eval "args=($recipe_line)"  # recipes.py prints one shell-quoted line

device=()
if has_gpu; then
  [[ $precision == fp32 ]] || device=(--"$precision")
  where="GPU ($precision)"
else
  [[ $precision == fp32 ]] || die "--precision $precision needs a GPU; none is visible to torch (CPU runs are fp32)"
  device=(--cpu)
  where="CPU (fp32)"
fi

cmd=(fairseq-train "${args[@]}" "${device[@]}" "${extra[@]}")
if [[ $dry == 1 ]]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi

[[ -f $DATA_BIN/$pair/dict.$(recipe "$pair" src).txt ]] \
  || die "no binarized data in $DATA_BIN/$pair: run bash scripts/prepare.sh --pair $pair first"
signature=$(printf '%q ' "${cmd[@]}" | sha1sum | cut -d' ' -f1)
if [[ -f $save_dir/.done && $(cat "$save_dir/.done") == "$signature" ]]; then
  log "$pair/$name already trained with this command; checkpoints in $save_dir (delete $save_dir/.done to retrain)"
  exit 0
fi

mkdir -p "$save_dir" "$log_dir"
log "training $pair/$name ($system) on $where"
log "checkpoints: $save_dir"
log "log:         $log_dir/train.log"
printf '# %s %s\n' "$(date -u +%FT%TZ)" "$(printf '%q ' "${cmd[@]}")" >>"$log_dir/train.log"
"${cmd[@]}" 2>&1 | tee -a "$log_dir/train.log"
printf '%s\n' "$signature" >"$save_dir/.done.tmp" && mv -f "$save_dir/.done.tmp" "$save_dir/.done"
log "done: $pair/$name"
log "checkpoints: $save_dir/checkpoint_best.pt (best dev BLEU), $save_dir/checkpoint_last.pt"
log "log:         $log_dir/train.log"
