#!/usr/bin/env bash
# Downloads, verifies and extracts one pair's train/dev/test into $DATA_DIR/<pair>/raw/.
#   bash scripts/download.sh --pair PAIR [--source NAME] [--force]
# PAIR: gl-en sk-en ar-en en-he en-vi (from configs/), or demo (generated offline, seeded).
# Sources are tried in order until one passes every check (no HTML page, complete archive,
# published size + sha256 (+ md5) where known, aligned sides, expected line counts where the source reproduces the
# papers' split); each failure is reported. See data/README.md for the URLs and
# qknorm_pipeline/data/sources.py for the environment variables that point them at mirrors.
# Transfers retry network errors, resume an interrupted file over HTTP Range and show progress.
# Idempotent: a finished pair (raw/.done) is skipped; archives are cached in
# $DATA_DIR/downloads/ and reused, and are only ever stored complete and verified.
# -h, --help: this help. Exit status: 0 ok, 2 a usage error, 1 a failure.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
pair="" source_name="" force=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --pair) need "$@"; pair=$2; shift 2 ;;
    --source) need "$@"; source_name=$2; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) usage_error "unknown option $1" ;;
    *) pair_arg "$1"; shift ;;
  esac
done
need_pair
[[ -n ${VIRTUAL_ENV:-} ]] || activate_env

out=$DATA_DIR/$pair/raw
if [[ $force == 0 ]] && is_done "$out"; then
  log "$pair: already downloaded ($out); --force to fetch again"
  exit 0
fi
rm -f "$out/.done"
if [[ $pair == demo ]]; then
  eval "$(python -m qknorm_pipeline.corpora config --pair demo)"
  mkdir -p "$DATA_DIR/demo"
  tmp=$(mktemp -d "$DATA_DIR/demo/raw.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  python -m qknorm_pipeline.data.demo --out "$tmp" --seed 1 \
    --train "${expected_train:-4000}" --dev "${expected_dev:-300}" --test "${expected_test:-300}"
  rm -rf "$out"
  mv "$tmp" "$out"
else
  python -m qknorm_pipeline.corpora download --pair "$pair" --out "$out" --cache "$DATA_DIR/downloads" \
    ${source_name:+--source "$source_name"} || die "download of $pair failed (see the messages above)"
fi
mark_done "$out"
log "$pair: done -> $out"
