#!/usr/bin/env bash
# Prepares one pair for training: tokenize -> length filter -> joint BPE -> fairseq binarization.
#   bash scripts/prepare.sh --pair PAIR [--src-dir DIR] [--tokenized | --raw]
#                           [--bpe fastbpe|sentencepiece] [--merges N] [--max-len N] [--force]
# Input: $DATA_DIR/<pair>/raw/ (written by scripts/download.sh), or --src-dir DIR holding
#   train.xx train.yy dev.xx dev.yy test.xx test.yy for --pair xx-yy (any pair: a pair without
#   configs/xx-yy.yaml needs --tokenized or --raw and takes configs/base.yaml's data settings:
#   fastbpe, 8000 merges, max length 250). train.sh, evaluate.sh and reproduce.sh then work on it
#   with the base recipe sized from its training set (docs/training.md).
# --tokenized: text is already Moses-tokenized (TED, IWSLT); --raw: tokenize with sacremoses
#   (escape=False, i.e. Moses -no-escape; see data/README.md). Default: data.tokenized of the config.
# Output:
#   $DATA_DIR/<pair>/tok/{train,valid,test}.{xx,yy}  tokenized text; train length-filtered
#                                                     (--max-len, default data.max_len = 250);
#                                                     valid/test complete = the scoring references
#   $DATA_DIR/<pair>/bpe/                            codes + vocab (or spm.model) + BPE'd text
#   $DATA_BIN/<pair>/                                fairseq-preprocess --joined-dictionary output,
#                                                     the BPE codes/vocab, and stats.json
# Idempotent and resumable: each stage is built in a temporary folder, renamed into place when
# complete, and skipped next time when its settings are unchanged (--force redoes all stages).
# -h, --help: this help. Exit status: 0 ok, 2 a usage error, 1 a failure.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
pair="" src_dir="" tok_flag="" bpe_flag="" merges_flag="" max_len_flag="" force=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --pair) need "$@"; pair=$2; shift 2 ;;
    --src-dir) need "$@"; src_dir=$2; shift 2 ;;
    --tokenized) tok_flag=true; shift ;;
    --raw) tok_flag=false; shift ;;
    --bpe) need "$@"; bpe_flag=$2; shift 2 ;;
    --merges) need "$@"; merges_flag=$2; shift 2 ;;
    --max-len) need "$@"; max_len_flag=$2; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) usage_error "unknown option $1" ;;
    *) pair_arg "$1"; shift ;;
  esac
done
need_pair
[[ -n ${VIRTUAL_ENV:-} ]] || activate_env

eval "$(python -m qknorm_pipeline.corpora config --pair "$pair")"
if [[ $known == 0 ]]; then
  [[ -n $src_dir ]] || die "unknown pair '$pair' (no configs/$pair.yaml): for your own corpus pass --src-dir DIR"
  [[ $pair =~ ^([A-Za-z_]+)-([A-Za-z_]+)$ ]] || die "--pair must look like xx-yy (source-target language codes), got '$pair'"
  src=${BASH_REMATCH[1]} tgt=${BASH_REMATCH[2]}
  [[ -n $tok_flag ]] || die "pair '$pair' has no config: say whether DIR holds Moses-tokenized text (--tokenized) or raw text (--raw)"
  tokenized=""
fi
tokenized=${tok_flag:-$tokenized}
bpe=${bpe_flag:-$bpe}
bpe_merges=${merges_flag:-$bpe_merges}
max_len=${max_len_flag:-$max_len}
[[ $bpe == fastbpe || $bpe == sentencepiece ]] || die "--bpe must be fastbpe or sentencepiece, got '$bpe'"
positive --merges "$bpe_merges"
positive --max-len "$max_len"

if [[ -n $src_dir ]]; then
  [[ -d $src_dir ]] || die "--src-dir $src_dir is not a folder"
  in_dir=$(cd "$src_dir" && pwd)
else
  in_dir=$DATA_DIR/$pair/raw
  is_done "$in_dir" || die "no downloaded data for $pair in $in_dir: run bash scripts/download.sh --pair $pair first (or pass --src-dir DIR)"
fi

work=$DATA_DIR/$pair
tok=$work/tok bpe_dir=$work/bpe out=$DATA_BIN/$pair
mkdir -p "$work" "$DATA_BIN"
raw_flag=--raw; [[ $tokenized == true ]] && raw_flag=--tokenized
key_tok="input=$in_dir $raw_flag max_len=$max_len"
key_bpe="$key_tok bpe=$bpe size=$bpe_merges"
# stage_ok DIR KEY: the stage in DIR finished with these settings.
stage_ok() { [[ $force == 0 ]] && is_done "$1" "$2"; }

# 1. tokenize (raw input only), check alignment, filter train by length
if stage_ok "$tok" "$key_tok"; then
  log "tokenized text up to date: $tok"
else
  log "tokenizing $in_dir ($raw_flag, train length filter $max_len tokens)"
  rm -rf "$bpe_dir" "$out"  # downstream stages depend on this one
  python -m qknorm_pipeline.corpora tokenize --in-dir "$in_dir" --out-dir "$tok" --src "$src" --tgt "$tgt" \
    "$raw_flag" --max-len "$max_len" || die "tokenization failed (see above)"
  mark_done "$tok" "$key_tok"
fi

# 2. joint BPE learned on train (both sides), applied to every split
if stage_ok "$bpe_dir" "$key_bpe"; then
  log "BPE up to date: $bpe_dir"
else
  rm -rf "$out"
  tmp=$(mktemp -d "$work/bpe.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  if [[ $bpe == fastbpe ]]; then
    command -v fast >/dev/null || die "fastBPE's 'fast' binary is not on PATH: run bash scripts/install.sh"
    log "learning $bpe_merges joint BPE merges with fastBPE"
    # When the corpus allows fewer merges than asked, learnbpe repeats its last pair and
    # applybpe then aborts on the duplicate: keep each pair's first occurrence.
    fast learnbpe "$bpe_merges" "$tok/train.$src" "$tok/train.$tgt" | awk '!seen[$1" "$2]++' >"$tmp/codes"
    log "$(wc -l <"$tmp/codes") merges learned"
    for split in train valid test; do
      for lang in "$src" "$tgt"; do
        fast applybpe "$tmp/$split.$lang" "$tok/$split.$lang" "$tmp/codes" >"$tmp/applybpe.log" 2>&1 \
          || { cat "$tmp/applybpe.log" >&2; die "fastBPE applybpe failed on $tok/$split.$lang"; }
      done
    done
    fast getvocab "$tmp/train.$src" "$tmp/train.$tgt" >"$tmp/vocab" 2>/dev/null
    rm -f "$tmp/applybpe.log"
  else
    log "training a joint SentencePiece BPE model (vocabulary $bpe_merges)"
    python -m qknorm_pipeline.corpora spm --tok-dir "$tok" --bpe-dir "$tmp" --src "$src" --tgt "$tgt" \
      --vocab-size "$bpe_merges" || die "SentencePiece failed (see above)"
  fi
  mark_done "$tmp" "$key_bpe"
  rm -rf "$bpe_dir"
  mv "$tmp" "$bpe_dir"
  trap - EXIT
fi

# 3. binarize with a joined dictionary, then stats.json
if stage_ok "$out" "$key_bpe"; then
  log "binarized data up to date: $out"
  exit 0
fi
tmp=$(mktemp -d "$DATA_BIN/$pair.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "binarizing with fairseq-preprocess --joined-dictionary"
workers=$(nproc 2>/dev/null || echo 1); (( workers > 8 )) && workers=8
fairseq-preprocess --source-lang "$src" --target-lang "$tgt" \
  --trainpref "$bpe_dir/train" --validpref "$bpe_dir/valid" --testpref "$bpe_dir/test" \
  --destdir "$tmp" --joined-dictionary --workers "$workers" >"$tmp/preprocess.out" 2>&1 \
  || { tail -n 20 "$tmp/preprocess.out" >&2; die "fairseq-preprocess failed"; }
if [[ $bpe == fastbpe ]]; then cp "$bpe_dir/codes" "$bpe_dir/vocab" "$tmp/"; else cp "$bpe_dir/spm.model" "$bpe_dir/spm.vocab" "$tmp/"; fi
python -m qknorm_pipeline.corpora stats --data-bin "$tmp" --tok-dir "$tok" --bpe-dir "$bpe_dir" \
  --src "$src" --tgt "$tgt" --pair "$pair" --bpe "$bpe" --bpe-size "$bpe_merges" || die "stats failed (see above)"
mark_done "$tmp" "$key_bpe"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
log "$pair: done -> $out"
