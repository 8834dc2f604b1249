#!/usr/bin/env bash
# Trains one system on one language pair with the papers' recipe from configs/PAIR.yaml.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  cat <<EOF
usage: bash scripts/train.sh [options] PAIR SYSTEM [extra fairseq-train flags...]

  PAIR     a configs/PAIR.yaml (gl-en sk-en en-vi en-he ar-en demo), or a pair prepared with
           scripts/prepare.sh --src-dir (the base recipe, sized from its training set)
  SYSTEM   one of the config's systems: (postnorm prenorm fixnorm scalenorm rmsnorm qknorm
           lpqknorm dnas hnas)
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
Extra flags go to fairseq-train unchanged and win over the recipe, e.g. --max-update 200 for a short
run.

Writes checkpoints to \$CKPT_DIR/PAIR/NAME/ (checkpoint_best.pt by dev BLEU, checkpoint_last.pt) and
the fairseq JSON log to \$LOG_DIR/PAIR/NAME/train.log. Re-running resumes from checkpoint_last.pt;
a run that finished with the same command is skipped.
EOF
}

precision=fp32 schedule="" stop_rule=() paper_len=() name="" seed="" dry=0 gpus="" per_gpu="" nodes=1 node_rank="" master=""
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --precision) precision=${2:?--precision needs fp32, fp16 or bf16}; shift 2 ;;
    --schedule) schedule=${2:?--schedule needs a name}; shift 2 ;;
    --stopping) stop_rule=(--stopping "${2:?--stopping needs a name}"); shift 2 ;;
    --paper-qknorm-length) paper_len=(--paper-qknorm-length); shift ;;
    --name) name=${2:?--name needs a value}; shift 2 ;;
    --seed) seed=${2:?--seed needs a number}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --gpus) gpus=${2:?--gpus needs a number}; shift 2 ;;
    --max-tokens-per-gpu) per_gpu=${2:?--max-tokens-per-gpu needs a number}; shift 2 ;;
    --nodes) nodes=${2:?--nodes needs a number}; shift 2 ;;
    --node-rank) node_rank=${2:?--node-rank needs a number}; shift 2 ;;
    --master) master=${2:?--master needs HOST:PORT}; shift 2 ;;
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
[[ -z $gpus || $gpus =~ ^[1-9][0-9]*$ ]] || die "--gpus must be a positive integer, got '$gpus'"
[[ -z $per_gpu || $per_gpu =~ ^[1-9][0-9]*$ ]] || die "--max-tokens-per-gpu must be a positive integer, got '$per_gpu'"
[[ -z $per_gpu || -n $gpus ]] || die "--max-tokens-per-gpu goes with --gpus N"
[[ $nodes =~ ^[1-9][0-9]*$ ]] || die "--nodes must be a positive integer, got '$nodes'"
if (( nodes > 1 )); then
  [[ -n $gpus ]] || die "--nodes $nodes goes with --gpus N (GPUs per machine)"
  [[ $node_rank =~ ^[0-9]+$ ]] && (( node_rank < nodes )) || die "--nodes $nodes needs --node-rank 0..$((nodes - 1)), got '$node_rank'"
  [[ $master =~ ^[^:]+:[0-9]+$ ]] || die "--nodes $nodes needs --master HOST:PORT (the machine of --node-rank 0), got '$master'"
fi
[[ -z $seed || $seed =~ ^[0-9]+$ ]] || die "--seed must be a non-negative integer, got '$seed'"
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
if ! recipe_line=$(python -m qknorm_fairseq.recipes train-args "$pair" "$system" "${sched_args[@]}" \
    "${stop_rule[@]}" "${paper_len[@]}" --data-bin "$DATA_BIN/$pair" --save-dir "$save_dir" 2>"$err"); then
  grep -v tensorboardX "$err" >&2; rm -f "$err"
  die "no recipe for $pair $system (see the message above)"
fi
grep -v tensorboardX "$err" >&2 || true
rm -f "$err"
eval "args=($recipe_line)"  # recipes.py prints one shell-quoted line

launcher=() dist=()
if [[ -n $gpus ]]; then
  # N processes on this machine through torchrun; fairseq reads RANK/WORLD_SIZE/LOCAL_RANK from
  # its environment. --max-tokens is per process in fairseq, so the recipe's update size (the
  # papers': 4,096 tokens) is split over the N processes.
  total=$(python -m qknorm_fairseq.recipes get "$pair" train.max_tokens)
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
# python -m qknorm_fairseq.train is fairseq-train with --bf16 usable on a GPU (see its docstring)
if [[ -n $gpus ]]; then
  cmd=("${launcher[@]}" -m qknorm_fairseq.train "${args[@]}" "${seed_args[@]}" "${dist[@]}" "${device[@]}" "${extra[@]}")
else
  cmd=(python -m qknorm_fairseq.train "${args[@]}" "${seed_args[@]}" "${device[@]}" "${extra[@]}")
fi
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
