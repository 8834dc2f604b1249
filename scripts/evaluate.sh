#!/usr/bin/env bash
# Decode the test set with a system's best-dev checkpoint and score it.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
usage() {
  cat <<'USAGE'
usage: bash scripts/evaluate.sh [--verbose] PAIR SYSTEM [extra fairseq-generate flags...]

  PAIR     a configs/PAIR.yaml (gl-en sk-en en-vi en-he ar-en demo), or your own pair
           prepared with scripts/prepare.sh --src-dir
  SYSTEM   a trained run: $CKPT_DIR/PAIR/SYSTEM/checkpoint_best.pt (scripts/train.sh PAIR SYSTEM)
Options (before PAIR):
  --verbose    show fairseq-generate's whole output (the same as VERBOSE=1)
  -h, --help   this help
Extra flags go to fairseq-generate and win over the recipe, e.g. --beam 8, or --decode-precision
bf16 (decoding under CUDA autocast on a GPU).

Decodes $DATA_BIN/PAIR (test split) with the pair's decoding recipe (beam 4, max length = source
length + 50, BPE or SentencePiece undone as $DATA_BIN/PAIR/stats.json says, the papers' length
normalisation and beam search), restores the original
sentence order and scores against $DATA_DIR/PAIR/tok/test.<tgt> with the pair's eval.metric /
eval.detok (configs/PAIR.yaml). Prints one line when decoding starts, the progress (sentences done /
total), and the score. Writes $RESULTS_DIR/PAIR/SYSTEM/{generate.out,generate.log,hyp.txt,scores.json}.
A stored result is reused only when the checkpoint, the test data, the whole decoding command, the
scorer and the package versions are unchanged (a fingerprint in the folder's .done, see
qknorm_pipeline/fingerprint.py); anything else decodes again.
Exit status: 0 scored, 2 a usage error, 1 a failure.
USAGE
}
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --verbose) VERBOSE=1; shift ;;
    --) shift; break ;;
    -*) usage_error "unknown option $1 before PAIR SYSTEM; fairseq-generate flags go after PAIR SYSTEM" ;;
    *) break ;;
  esac
done
[[ $# -ge 2 ]] || usage_error "need PAIR and SYSTEM"
PAIR=$1 SYSTEM=$2
shift 2
activate_env
cd "$ROOT"
check_pair "$PAIR"

TGT=$(recipe "$PAIR" tgt)
METRIC=$(recipe "$PAIR" eval.metric)
DETOK=$(recipe "$PAIR" eval.detok)
CKPT=$CKPT_DIR/$PAIR/$SYSTEM/checkpoint_best.pt
BIN=$DATA_BIN/$PAIR
REF=$DATA_DIR/$PAIR/tok/test.$TGT
OUT=$RESULTS_DIR/$PAIR/$SYSTEM
if [[ ! -f $CKPT ]]; then
  [[ -d $CKPT_DIR/$PAIR/$SYSTEM || " $(python -m qknorm_pipeline.recipes systems "$PAIR") " == *" $SYSTEM "* ]] \
    || usage_error "unknown system '$SYSTEM': no $(short "$CKPT_DIR/$PAIR/$SYSTEM")/ and not one of the systems of configs/$PAIR.yaml ($(python -m qknorm_pipeline.recipes systems "$PAIR"))"
  die "no checkpoint $(short "$CKPT"): train first (bash scripts/train.sh $PAIR $SYSTEM)"
fi
[[ -d $BIN ]] || die "no binarized data $(short "$BIN"): run bash scripts/prepare.sh --pair $PAIR"
[[ -f $REF ]] || die "no tokenized reference $(short "$REF"): run bash scripts/prepare.sh --pair $PAIR"

# The decoding recipe (beam 4, max length source + 50, the papers' GNMT length normalisation, and
# the undoing of the segmentation recorded in $BIN/stats.json), as one shell-quoted line.
line=$(python -m qknorm_pipeline.recipes generate-args "$PAIR" --data-bin "$BIN") || die "recipes generate-args $PAIR failed"
eval "GEN_ARGS=($line)"
# --required-batch-size-multiple 1: with fairseq's default of 8, fairseq-generate (fairseq-fixed
# 0.12.3.1) silently drops the sentences of an incomplete last batch (24 of 30 decoded).
gen=(fairseq-generate "$BIN" --path "$CKPT" --gen-subset test --max-tokens 8000 --required-batch-size-multiple 1
     "${GEN_ARGS[@]}" "$@")
score=(python -m qknorm_pipeline.scoring --ref "$REF" --sys "$SYSTEM=$OUT/hyp.txt" --metric "$METRIC"
       --detok "$DETOK" --lang "$TGT")
data_files=("$BIN"/dict.*.txt "$BIN"/test.*)
fingerprint=$(python -m qknorm_pipeline.fingerprint --file "$CKPT" --file "$REF" "${data_files[@]/#/--file=}" \
  -- "${gen[@]}" "${score[@]}")
score_line() {
  python -c 'import json, sys; d = json.load(open(sys.argv[1])); m = d["metric"]
print(", ".join(f"{m} {s[m]:.2f}" for s in d["systems"].values()))' "$OUT/scores.json"
}

if [[ -f $OUT/scores.json ]] && is_done "$OUT" "$fingerprint"; then
  log "$PAIR/$SYSTEM already evaluated with this checkpoint and decoding command: $(score_line) ($(short "$OUT/scores.json"))"
  exit 0
fi
rm -f "$OUT/.done"
mkdir -p "$OUT"

n_ref=$(wc -l <"$REF")
log "decoding $PAIR/$SYSTEM: $n_ref test sentences with $(short "$CKPT"); log $(short "$OUT/generate.log")"
tmp=$OUT/generate.out.tmp.$$
rm -f "$tmp"
set +e
if [[ $VERBOSE == 1 ]]; then
  "${gen[@]}" 2> >(tee "$OUT/generate.log" >&2) | python -m qknorm_pipeline.progress decode --log "$tmp" \
    --total "$n_ref" --label "$PAIR/$SYSTEM" --tag evaluate
else
  "${gen[@]}" 2>"$OUT/generate.log" | python -m qknorm_pipeline.progress decode --log "$tmp" \
    --total "$n_ref" --label "$PAIR/$SYSTEM" --tag evaluate
fi
status=("${PIPESTATUS[@]}")
set -e
if [[ ${status[0]} != 0 || ${status[1]} != 0 ]]; then
  rm -f "$tmp"
  if [[ ${status[0]} == 2 ]]; then
    msg=$(grep -E '(^|: )error: ' "$OUT/generate.log" | tail -n 1)
    usage_error "fairseq-generate: ${msg#*error: } (full output: $(short "$OUT/generate.log"))"
  fi
  [[ $VERBOSE == 1 ]] || tail -n 15 "$OUT/generate.log" >&2
  die "fairseq-generate failed (exit ${status[0]}); full log: $(short "$OUT/generate.log")"
fi
mv -f "$tmp" "$OUT/generate.out"

# fairseq prints hypotheses by length bucket: put them back in corpus order (H-<id>\tscore\ttext).
extract() { grep '^H-' "$OUT/generate.out" | sed 's/^H-//' | sort -t$'\t' -k1,1n | cut -f3-; }
atomic_write "$OUT/hyp.txt" extract
n_hyp=$(wc -l <"$OUT/hyp.txt")
[[ $n_hyp == "$n_ref" ]] || die "$(short "$OUT/hyp.txt") has $n_hyp lines but $(short "$REF") has $n_ref: fairseq-generate skipped sentences (see $(short "$OUT/generate.out"))"

if [[ $VERBOSE == 1 ]]; then
  "${score[@]}" --output "$OUT/scores.json" >&2
else
  "${score[@]}" --output "$OUT/scores.json" >/dev/null
fi
mark_done "$OUT" "$fingerprint"
log "$PAIR/$SYSTEM: test $(score_line) (detok $DETOK) -> $(short "$OUT/scores.json")"
