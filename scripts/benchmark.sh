#!/usr/bin/env bash
# Speed/memory benchmark of every preset against fairseq's `transformer`, and the gl->en study.
#   bash scripts/benchmark.sh [--reps N] [--dim D] [--layers L] [-- python -m qknorm_pipeline.benchmark speed flags]
#       Interleaved runs of every preset and of stock fairseq `transformer` with the same
#       dimensions, data, batch and dropout: training target tokens/s (after warm-up), peak
#       memory, beam-4 decoding sentences/s; median and spread; ratios to the stock model.
#       CPU by default (small dimensions, a few minutes); with a CUDA device: GPU + bf16 (fairseq's
#       base size: --dim 512 --layers 6 -- --heads 8). Writes $RESULTS_DIR/benchmark.{md,json}.
#   bash scripts/benchmark.sh --convergence [scripts/study.sh flags...]
#       The real-data study of issue #13 on TED gl->en: runs bash scripts/study.sh with the flags
#       that follow (--systems, --seeds, --max-update, --config; see its --help).
# -h, --help: this help. Exit status: 0 ok, 2 a usage error, 1 a failure.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
reps="" dim="" layers="" extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --convergence) shift; exec bash "$ROOT/scripts/study.sh" "$@" ;;
    --reps) need "$@"; reps=$2; shift 2 ;;
    --dim) need "$@"; dim=$2; shift 2 ;;
    --layers) need "$@"; layers=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) usage_error "unknown argument $1" ;;
  esac
done
[[ -n ${VIRTUAL_ENV:-} ]] || activate_env
cd "$ROOT"
# One CPU thread per process unless told otherwise: on a shared, oversubscribed CPU, OpenMP threads
# spin-waiting for each other make every op many times slower (measured here: 6 ms layer norms).
has_gpu || export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

args=(--out "$RESULTS_DIR/benchmark")
[[ -n $reps ]] && args+=(--reps "$reps")
[[ -n $dim ]] && args+=(--dim "$dim")
[[ -n $layers ]] && args+=(--layers "$layers")
if has_gpu; then args+=(--device cuda --dtype bf16); else args+=(--threads "$OMP_NUM_THREADS"); fi
log "speed benchmark: python -m qknorm_pipeline.benchmark speed ${args[*]} ${extra[*]}"
exec python -m qknorm_pipeline.benchmark speed "${args[@]}" "${extra[@]}"
