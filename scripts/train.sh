#!/usr/bin/env bash
# Trains one system on one language pair with the papers' recipe from configs/PAIR.yaml.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<EOF
usage: bash scripts/train.sh [options] PAIR SYSTEM [extra fairseq-train flags...]

  PAIR     a configs/PAIR.yaml (gl-en sk-en en-vi en-he ar-en demo), or a pair prepared with
           scripts/prepare.sh --src-dir (the base recipe, sized from its training set)
  SYSTEM   one of the config's systems (each a preset of qknorm_fairseq/architectures.py):
           $(python -m qknorm_pipeline.recipes systems demo 2>/dev/null || echo "see configs/base.yaml systems:")
Options (before PAIR):
  --precision fp32|fp16|bf16   on a GPU (default fp32); a CPU run is always fp32
  --schedule NAME              LR schedule from the config's schedules: (valdecay, nowarmup,
                               invsqrtdecay, valdecay_2xlr, invsqrtdecay_2xlr); default: the config's
  --stopping NAME              stopping rule from the config's stopping: (twt, twt_paper, qknorm);
                               default: the system's (the original code's, docs/training.md)
  --paper-qknorm-length        QKNorm's L from the config (the papers' value) instead of the data
  --seed K                     fairseq's random seed (default: the recipe's, 1); K != 1 trains
                               the run SYSTEM_seedK, so each seed has its own checkpoints
  --name NAME                  run name (default SYSTEM, or SYSTEM_SCHEDULE with --schedule,
                               then _seedK)
  --gpus N                     data-parallel training on N GPUs of this machine: N processes
                               started by torchrun, fairseq's distributed engine (NCCL); the
                               recipe's tokens per update are kept (each process takes
                               max-tokens / N) unless --max-tokens-per-gpu says otherwise
  --max-tokens-per-gpu T       with --gpus: T tokens per process (an update is N x T tokens)
  --nodes M --node-rank R --master HOST:PORT
                               with --gpus N: M machines of N GPUs each (run the same command on
                               every machine, R = 0..M-1; HOST:PORT reachable from all of them);
                               the update is split over all M x N processes.
                               scripts/slurm_train.sbatch does this under Slurm
  --dry-run                    print the command and exit
  --verbose                    show fairseq's whole output instead of the progress display
                               (the same as VERBOSE=1)
  -h, --help                   this help
Extra flags go to fairseq-train unchanged and win over the recipe, e.g. --max-update 200 for a short
run.

Prints one line when training starts, then the progress (update / max update, loss, last dev BLEU,
LR, updates per second, ETA: a redrawn bar on a terminal, a line per validation otherwise), then a
summary. Writes checkpoints to \$CKPT_DIR/PAIR/NAME/ (checkpoint_best.pt by dev BLEU,
checkpoint_last.pt) and fairseq's whole output (JSON log records) to \$LOG_DIR/PAIR/NAME/train.log.
Re-running resumes from checkpoint_last.pt; a run that finished with the same command is skipped.
Exit status: 0 trained (or already trained), 2 a usage error (this script's or fairseq's), 1 a failure.
EOF
}

precision=fp32 schedule="" stop_rule=() paper_len=() name="" seed="" dry=0 gpus="" per_gpu="" nodes=1 node_rank="" master=""
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --precision) need "$@"; precision=$2; shift 2 ;;
    --schedule) need "$@"; schedule=$2; shift 2 ;;
    --stopping) need "$@"; stop_rule=(--stopping "$2"); shift 2 ;;
    --paper-qknorm-length) paper_len=(--paper-qknorm-length); shift ;;
    --name) need "$@"; name=$2; shift 2 ;;
    --seed) need "$@"; seed=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --verbose) VERBOSE=1; shift ;;
    --gpus) need "$@"; gpus=$2; shift 2 ;;
    --max-tokens-per-gpu) need "$@"; per_gpu=$2; shift 2 ;;
    --nodes) need "$@"; nodes=$2; shift 2 ;;
    --node-rank) need "$@"; node_rank=$2; shift 2 ;;
    --master) need "$@"; master=$2; shift 2 ;;
    --) shift; break ;;
    -*) usage_error "unknown option $1 before PAIR SYSTEM; fairseq flags go after PAIR SYSTEM" ;;
    *) break ;;
  esac
done
[[ $# -ge 2 ]] || usage_error "need PAIR and SYSTEM"
pair=$1 system=$2
shift 2
extra=("$@")
case $precision in fp32|fp16|bf16) ;; *) usage_error "--precision must be fp32, fp16 or bf16, got '$precision'" ;; esac
[[ -z $gpus ]] || positive --gpus "$gpus"
[[ -z $per_gpu ]] || positive --max-tokens-per-gpu "$per_gpu"
[[ -z $per_gpu || -n $gpus ]] || usage_error "--max-tokens-per-gpu goes with --gpus N"
positive --nodes "$nodes"
if (( nodes > 1 )); then
  [[ -n $gpus ]] || usage_error "--nodes $nodes goes with --gpus N (GPUs per machine)"
  [[ $node_rank =~ ^[0-9]+$ ]] && (( node_rank < nodes )) || usage_error "--nodes $nodes needs --node-rank 0..$((nodes - 1)), got '$node_rank'"
  [[ $master =~ ^[^:]+:[0-9]+$ ]] || usage_error "--nodes $nodes needs --master HOST:PORT (the machine of --node-rank 0), got '$master'"
fi
[[ -z $seed || $seed =~ ^[0-9]+$ ]] || usage_error "--seed must be a non-negative integer, got '$seed'"
seed_args=() seed_tag=""
if [[ -n $seed ]]; then seed_args=(--seed "$seed"); fi
if [[ -n $seed && $seed != 1 ]]; then seed_tag=_seed$seed; fi
[[ -n $name ]] || name=$system${schedule:+_$schedule}$seed_tag

if [[ $dry == 1 && -x $VENV/bin/python ]]; then source "$VENV/bin/activate"; else activate_env; fi
cd "$ROOT"

save_dir=$CKPT_DIR/$pair/$name
log_dir=$LOG_DIR/$pair/$name
sched_args=()
[[ -n $schedule ]] && sched_args=(--schedule "$schedule")
err=$(mktemp)
if ! recipe_line=$(python -m qknorm_pipeline.recipes train-args "$pair" "$system" "${sched_args[@]}" \
    "${stop_rule[@]}" "${paper_len[@]}" --data-bin "$DATA_BIN/$pair" --save-dir "$save_dir" 2>"$err"); then
  msg=$(grep -v tensorboardX "$err" | tail -n 1); rm -f "$err"
  usage_error "${msg#*error: }"
fi
grep -v tensorboardX "$err" >&2 || true
rm -f "$err"
eval "args=($recipe_line)"  # recipes.py prints one shell-quoted line

launcher=() dist=()
if [[ -n $gpus ]]; then
  # N processes on this machine through torchrun; fairseq reads RANK/WORLD_SIZE/LOCAL_RANK from
  # its environment. --max-tokens is per process in fairseq, so the recipe's update size (the
  # papers': 4,096 tokens) is split over the N processes.
  total=$(python -m qknorm_pipeline.recipes get "$pair" train.max_tokens)
  world=$((gpus * nodes))
  if [[ -n $per_gpu ]]; then
    tokens=$per_gpu
  else
    (( total % world == 0 )) || die "$world GPU processes do not divide the recipe's $total tokens per update: pass --max-tokens-per-gpu T (an update is then $world x T tokens)"
    tokens=$((total / world))
  fi
  if (( nodes > 1 )); then
    launcher=(torchrun --nnodes "$nodes" --node_rank "$node_rank" --nproc_per_node "$gpus"
              --master_addr "${master%:*}" --master_port "${master##*:}")
  else
    launcher=(torchrun --standalone --nproc_per_node "$gpus")
  fi
  dist=(--distributed-world-size "$world" --max-tokens "$tokens")
  # fairseq skips its distributed set-up at world size 1 (infer_init_method returns early); name
  # the init method so that one GPU runs the same code path (NCCL process group) as eight.
  [[ $world == 1 ]] && dist+=(--distributed-init-method env:// --distributed-no-spawn)
  if [[ -z $per_gpu ]]; then
    log "$world GPU processes x $tokens tokens = $total tokens per update (the recipe's; --max-tokens-per-gpu to change)"
  else
    log "$world GPU processes x $tokens tokens = $((world * tokens)) tokens per update (the recipe has $total)"
  fi
fi

device=()
if [[ -n $gpus ]] || has_gpu; then  # --gpus: a dry run on a machine without GPUs prints the GPU command
  [[ $precision == fp32 ]] || device=(--"$precision")
  where="${gpus:-1} GPU(s) ($precision)"
else
  [[ $precision == fp32 ]] || die "--precision $precision needs a GPU; none is visible to torch (CPU runs are fp32)"
  device=(--cpu)
  where="CPU (fp32)"
fi

if [[ -n $gpus && $dry == 0 ]]; then
  have=$(python -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  (( have >= gpus )) || die "--gpus $gpus: torch sees $have CUDA device(s) on this machine"
fi
# python -m qknorm_pipeline.fairseq_train is fairseq-train with --bf16 usable on a GPU (see its docstring)
if [[ -n $gpus ]]; then
  cmd=("${launcher[@]}" -m qknorm_pipeline.fairseq_train "${args[@]}" "${seed_args[@]}" "${dist[@]}" "${device[@]}" "${extra[@]}")
else
  cmd=(python -m qknorm_pipeline.fairseq_train "${args[@]}" "${seed_args[@]}" "${device[@]}" "${extra[@]}")
fi
if [[ $dry == 1 ]]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi

[[ -f $DATA_BIN/$pair/dict.$(recipe "$pair" src).txt ]] \
  || die "no binarized data in $(short "$DATA_BIN/$pair"): run bash scripts/prepare.sh --pair $pair first"
signature=$(printf '%q ' "${cmd[@]}" | sha1sum | cut -d' ' -f1)
if is_done "$save_dir" "$signature"; then
  log "$pair/$name already trained with this command: $(short "$save_dir")/checkpoint_best.pt (delete $(short "$save_dir")/.done to retrain)"
  exit 0
fi

# the run's --max-update (the last one given wins, as in fairseq) for the progress display
max_update=0
for ((i = 0; i < ${#cmd[@]}; i++)); do
  case ${cmd[i]} in --max-update) max_update=${cmd[i + 1]} ;; --max-update=*) max_update=${cmd[i]#*=} ;; esac
done

mkdir -p "$save_dir"
log "training $pair/$name ($system) on $where; log $(short "$log_dir/train.log"), checkpoints $(short "$save_dir")/"
run_training "$pair/$name" "$log_dir/train.log" "$max_update" -- "${cmd[@]}"
mark_done "$save_dir" "$signature"
