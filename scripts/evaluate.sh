#!/usr/bin/env bash
# Decode the test set with a system's best-dev checkpoint and score it.
usage() {
  cat <<'USAGE'
usage: scripts/evaluate.sh PAIR SYSTEM [extra fairseq-generate flags]

Decodes $DATA_BIN/PAIR (test split) with $CKPT_DIR/PAIR/SYSTEM/checkpoint_best.pt
(beam 4, max length = source length + 50, BPE or SentencePiece undone as data-bin/PAIR/stats.json
says, the papers' length normalisation),
restores the original sentence order and scores against $DATA_DIR/PAIR/tok/test.<tgt> with
the pair's eval.metric / eval.detok (configs/PAIR.yaml).
Writes $RESULTS_DIR/PAIR/SYSTEM/{generate.out,generate.log,hyp.txt,scores.json}. Re-running is a no-op
until the checkpoint changes (delete the folder's .done to force).
USAGE
}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -ge 2 ]] || { usage >&2; exit 2; }
PAIR=$1 SYSTEM=$2
shift 2
activate_env
cd "$ROOT"

TGT=$(recipe "$PAIR" tgt)
METRIC=$(recipe "$PAIR" eval.metric)
DETOK=$(recipe "$PAIR" eval.detok)
CKPT=$CKPT_DIR/$PAIR/$SYSTEM/checkpoint_best.pt
BIN=$DATA_BIN/$PAIR
REF=$DATA_DIR/$PAIR/tok/test.$TGT
OUT=$RESULTS_DIR/$PAIR/$SYSTEM
[[ -f $CKPT ]] || die "no checkpoint $CKPT: train first (scripts/train.sh $PAIR $SYSTEM)"
[[ -d $BIN ]] || die "no binarized data $BIN: run scripts/prepare.sh --pair $PAIR"
[[ -f $REF ]] || die "no tokenized reference $REF: run scripts/prepare.sh --pair $PAIR"

if is_done "$OUT" && [[ $OUT/.done -nt $CKPT ]]; then
  log "$PAIR/$SYSTEM already evaluated (remove $OUT/.done to redo)"
  python -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d["systems"], indent=2))' "$OUT/scores.json"
  exit 0
fi
rm -f "$OUT/.done"
mkdir -p "$OUT"

# The decoding recipe (beam 4, max length source + 50, the papers' GNMT length normalisation, and
# the undoing of the segmentation recorded in $BIN/stats.json), as one shell-quoted line.
line=$(python -m qknorm_fairseq.recipes generate-args "$PAIR" --data-bin "$BIN") || die "recipes generate-args $PAIR failed"
eval "GEN_ARGS=($line)"

# torch >= 2.6 refuses fairseq checkpoints under weights_only loading (see REFERENCE.md).
# --required-batch-size-multiple 1: with fairseq's default of 8, fairseq-generate (fairseq-fixed
# 0.12.3.1) silently drops the sentences of an incomplete last batch (24 of 30 decoded).
# fairseq's own log (its whole config, warnings) goes to generate.log; its last line is echoed.
log "decoding $PAIR test with $CKPT (fairseq log: $OUT/generate.log)"
if ! atomic_write "$OUT/generate.out" fairseq-generate "$BIN" --path "$CKPT" --gen-subset test \
  --max-tokens 8000 --required-batch-size-multiple 1 "${GEN_ARGS[@]}" "$@" 2>"$OUT/generate.log"; then
  tail -n 20 "$OUT/generate.log" >&2
  die "fairseq-generate failed (full log: $OUT/generate.log)"
fi
grep -h 'Translated' "$OUT/generate.log" "$OUT/generate.out" | sed 's/^.*| *//; s/^INFO:[^:]*://' | tail -n 1 >&2 || true

# fairseq prints hypotheses by length bucket: put them back in corpus order (H-<id>\tscore\ttext).
extract() { grep '^H-' "$OUT/generate.out" | sed 's/^H-//' | sort -t$'\t' -k1,1n | cut -f3-; }
atomic_write "$OUT/hyp.txt" extract
n_hyp=$(wc -l <"$OUT/hyp.txt")
n_ref=$(wc -l <"$REF")
[[ $n_hyp == "$n_ref" ]] || die "$OUT/hyp.txt has $n_hyp lines but $REF has $n_ref: fairseq-generate skipped sentences (see $OUT/generate.out)"

log "scoring with $METRIC (detok $DETOK)"
python -m qknorm_fairseq.scoring --ref "$REF" --sys "$SYSTEM=$OUT/hyp.txt" --metric "$METRIC" \
  --detok "$DETOK" --lang "$TGT" --output "$OUT/scores.json"
mark_done "$OUT"
