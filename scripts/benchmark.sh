#!/usr/bin/env bash
# Speed/memory benchmark of every preset against fairseq's `transformer`, and a convergence run.
#   bash scripts/benchmark.sh [--reps N] [--dim D] [--layers L] [-- extra benchmark.py flags]
#       Interleaved runs of every preset and of stock fairseq `transformer` with the same
#       dimensions, data, batch and dropout: training target tokens/s (after warm-up), peak
#       memory, beam-4 decoding sentences/s; median and spread; ratios to the stock model.
#       CPU by default (small dimensions, a few minutes); with a CUDA device: GPU + bf16 and
#       fairseq's base size. Writes $RESULTS_DIR/benchmark.{md,json}.
#   bash scripts/benchmark.sh --convergence [--max-update N] [--interval N] [--systems "a b c"]
#       Trains postnorm (TwT baseline), scalenorm and qknorm on ../shared/data/ted-gl-en
#       (joint BPE 3000, gl->en recipe scaled down: see CONV_* below) for a fixed update budget,
#       dev BLEU every --interval updates; writes $RESULTS_DIR/convergence.{md,json,png}.
#       Resumable: a finished system is skipped; delete $DATA_DIR/bench-convergence to redo.
# -h, --help: this help. Exit status: 0 ok, 2 a usage error, 1 a failure.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
mode=speed reps="" dim="" layers="" max_update=400 interval=100 systems="postnorm scalenorm qknorm" extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --convergence) mode=convergence; shift ;;
    --reps) need "$@"; reps=$2; shift 2 ;;
    --dim) need "$@"; dim=$2; shift 2 ;;
    --layers) need "$@"; layers=$2; shift 2 ;;
    --max-update) need "$@"; max_update=$2; shift 2 ;;
    --interval) need "$@"; interval=$2; shift 2 ;;
    --systems) need "$@"; systems=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) usage_error "unknown argument $1" ;;
  esac
done
[[ -n ${VIRTUAL_ENV:-} ]] || activate_env
cd "$ROOT"
# One CPU thread per process unless told otherwise: on a shared, oversubscribed CPU, OpenMP threads
# spin-waiting for each other make every op many times slower (measured here: 6 ms layer norms).
has_gpu || export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

if [[ $mode == speed ]]; then
  args=(--out "$RESULTS_DIR/benchmark")
  [[ -n $reps ]] && args+=(--reps "$reps")
  [[ -n $dim ]] && args+=(--dim "$dim")
  [[ -n $layers ]] && args+=(--layers "$layers")
  if has_gpu; then args+=(--device cuda --dtype bf16); else args+=(--threads "$OMP_NUM_THREADS"); fi
  log "speed benchmark: python -m qknorm_fairseq.benchmark speed ${args[*]} ${extra[*]}"
  exec python -m qknorm_fairseq.benchmark speed "${args[@]}" "${extra[@]}"
fi

# ---- convergence on gl->en ----
[[ $max_update =~ ^[1-9][0-9]*$ ]] || die "--max-update must be a positive integer, got '$max_update'"
[[ $interval =~ ^[1-9][0-9]*$ ]] || die "--interval must be a positive integer, got '$interval'"
src_dir=$ROOT/../shared/data/ted-gl-en
for f in train dev test; do for l in gl en; do
  [[ -f $src_dir/$f.$l ]] || die "missing $src_dir/$f.$l: the convergence benchmark needs the shared TED gl-en corpus"
done; done
work=$DATA_DIR/bench-convergence
bin=$work/bin
# Scaled-down gl->en recipe (TwT: d=512, 4+4 layers, dropout 0.4, warmup 8k): small enough for a
# CPU to show a curve within minutes per system; on a GPU use fairseq's full gl->en size.
if has_gpu; then
  CONV_MODEL=(--encoder-embed-dim 512 --decoder-embed-dim 512 --encoder-ffn-embed-dim 2048
              --decoder-ffn-embed-dim 2048 --encoder-layers 4 --decoder-layers 4 --bf16)
  CONV_LR=(--lr 1e-3 --warmup-updates 1000)
else
  CONV_MODEL=(--encoder-embed-dim 128 --decoder-embed-dim 128 --encoder-ffn-embed-dim 512
              --decoder-ffn-embed-dim 512 --encoder-layers 2 --decoder-layers 2
              --encoder-attention-heads 4 --decoder-attention-heads 4)
  CONV_LR=(--lr 2e-3 --warmup-updates 100)
fi

if ! is_done "$bin"; then
  log "joint BPE (3000 merges) on $src_dir -> $bin"
  tmp=$work/prep.tmp.$$
  rm -rf "$tmp" && mkdir -p "$tmp"
  fast=$VENV/bin/fast
  [[ -x $fast ]] || die "$fast not found: run scripts/install.sh"
  "$fast" learnbpe 3000 "$src_dir/train.gl" "$src_dir/train.en" >"$tmp/codes"
  for f in train dev test; do for l in gl en; do
    "$fast" applybpe "$tmp/$f.$l" "$src_dir/$f.$l" "$tmp/codes" >/dev/null
  done; done
  fairseq-preprocess --source-lang gl --target-lang en --trainpref "$tmp/train" --validpref "$tmp/dev" \
    --testpref "$tmp/test" --destdir "$tmp/bin" --joined-dictionary --workers 2 >"$tmp/preprocess.log" 2>&1 \
    || die "fairseq-preprocess failed, see $tmp/preprocess.log"
  cp "$tmp/codes" "$tmp/bin/"
  rm -rf "$bin" && mv "$tmp/bin" "$bin" && rm -rf "$tmp"
  mark_done "$bin"
fi

for sys in $systems; do
  out=$work/$sys
  if is_done "$out"; then log "$sys: done already ($out)"; continue; fi
  rm -rf "$out" && mkdir -p "$out"
  eval "recipe_args=($(python -m qknorm_fairseq.recipes train-args gl-en "$sys" --data-bin "$bin" --save-dir "$out/ckpt"))"
  log "$sys: training $max_update updates, dev BLEU every $interval (log: $out/stdout.log)"
  start=$(date +%s.%N)
  echo "$start" >"$out/start_time"
  # Overrides after the recipe win: smaller model, short warmup, fixed budget, greedy dev BLEU
  # (beam 1 keeps validation cheap on a CPU), no checkpoint writing beyond the last one.
  fairseq-train "${recipe_args[@]}" "${CONV_MODEL[@]}" "${CONV_LR[@]}" --dropout 0.3 --attention-dropout 0.3 \
    --activation-dropout 0.3 --max-update "$max_update" --validate-interval-updates "$interval" \
    --save-interval-updates "$max_update" --no-save --patience -1 --decay-stop-lr 0 \
    --eval-bleu-args '{"beam": 1, "max_len_a": 1.2, "max_len_b": 10}' --log-interval 10 \
    --num-workers 0 --log-file "$out/train.log" >"$out/stdout.log" 2>&1 \
    || die "$sys: fairseq-train failed, see $out/stdout.log"
  mark_done "$out"
done
log "convergence report -> $RESULTS_DIR/convergence.{md,json,png}"
settings="ted-gl-en, joint fastBPE 3000 merges; fairseq-train with the gl-en recipe of configs/gl-en.yaml \
overridden by: ${CONV_MODEL[*]} ${CONV_LR[*]} (ValDecay), dropout 0.3, $max_update updates of max 4096 tokens, \
dev BLEU (tokenized, greedy) every $interval updates; OMP_NUM_THREADS=${OMP_NUM_THREADS:-default}; $(nproc) CPUs"
# shellcheck disable=SC2086
python -m qknorm_fairseq.benchmark convergence --work "$work" --systems $systems --settings "$settings" \
  --out "$RESULTS_DIR/convergence"
