# Shared bash helpers for the qknorm-fairseq pipelines. Source it; do not run it.
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# Every path can be moved with an environment variable:
#   DATA_DIR (data/), DATA_BIN (data-bin/), CKPT_DIR (checkpoints/), LOG_DIR (logs/),
#   RESULTS_DIR (results/), VENV (.venv/).
# The command-line grammar of every script: --help lists every option; exit 0 ok, 2 usage error
# (usage_error), 1 failure (die); an error is one line that names the fix. VERBOSE=1 (or a script's
# --verbose) shows the full output of every tool instead of one line per stage.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATA_DIR=${DATA_DIR:-$ROOT/data}
export DATA_BIN=${DATA_BIN:-$ROOT/data-bin}  # also read by qknorm_pipeline.recipes
CKPT_DIR=${CKPT_DIR:-$ROOT/checkpoints}
LOG_DIR=${LOG_DIR:-$ROOT/logs}
RESULTS_DIR=${RESULTS_DIR:-$ROOT/results}
VENV=${VENV:-$ROOT/.venv}
USER_DIR=$ROOT/qknorm_fairseq
# `python -m qknorm_fairseq.<tool>` runs this checkout's code, whatever is installed in the venv
# (the tools skip fairseq's import, see qknorm_fairseq/__init__.py).
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

VERBOSE=${VERBOSE:-0}
export VERBOSE

# usage: the script's help, the comment block at its top (a script with a usage() of its own
# defines it after sourcing this file).
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$ROOT/scripts/$(basename "$0")"; }
log() { printf '[%s %s] %s\n' "$(basename "$0" .sh)" "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[%s] error: %s\n' "$(basename "$0" .sh)" "$*" >&2; exit 1; }
# usage_error MSG: a mistake on the command line (exit 2), pointing at --help.
usage_error() { printf '[%s] error: %s (see bash scripts/%s --help)\n' "$(basename "$0" .sh)" "$*" "$(basename "$0")" >&2; exit 2; }
# need OPTION "$@" (inside the option loop): OPTION must be followed by a value.
need() { [[ $# -ge 2 && -n $2 && $2 != --* ]] || usage_error "$1 needs a value"; }
# positive OPTION VALUE: a usage error unless VALUE is a positive integer.
positive() { [[ $2 =~ ^[1-9][0-9]*$ ]] || usage_error "$1 must be a positive integer, got '$2'"; }
# pair_arg VALUE (the option loop's positional argument): VALUE is the pair, given once; need_pair
# after the loop: a usage error when there was none.
pair_arg() { [[ -z $pair ]] || usage_error "one pair at a time (got '$pair' and '$1')"; pair=$1; }
need_pair() { [[ -n $pair ]] || usage_error "name a pair: PAIR or --pair PAIR"; }
# check_pair PAIR: a usage error unless configs/ defines PAIR (the message of recipes.py, which knows them).
check_pair() { local err; err=$(python -m qknorm_pipeline.recipes get "$1" src 2>&1 >/dev/null) || usage_error "${err#*error: }"; }
# short PATH: PATH relative to the current folder when inside it (for the lines a user reads).
short() { local p=$1; [[ $p == "$PWD/"* ]] && p=${p#"$PWD/"}; printf '%s' "$p"; }
# quietly LOGFILE CMD [ARGS...]: runs CMD with its output appended to LOGFILE (and shown too with
# VERBOSE=1); on failure shows the last lines of LOGFILE and returns CMD's status.
quietly() {
  local logfile=$1 rc=0
  shift
  mkdir -p "$(dirname "$logfile")"
  if [[ $VERBOSE == 1 ]]; then
    "$@" 2>&1 | tee -a "$logfile" >&2 || rc=${PIPESTATUS[0]}
  else
    "$@" >>"$logfile" 2>&1 || rc=$?
  fi
  if [[ $rc != 0 && $VERBOSE != 1 ]]; then tail -n 15 "$logfile" >&2; fi
  return $rc
}

# Creates or reuses .venv (scripts/install.sh is idempotent) and puts it first on PATH.
# QKNORM_USE_ENV=1 uses the Python environment already on PATH instead (a cluster's module, a
# container with no internet): nothing is installed, the imports are checked.
activate_env() {
  if [[ ${QKNORM_USE_ENV:-0} == 1 ]]; then
    python -c 'import fairseq, sacrebleu' 2>/dev/null \
      || die "QKNORM_USE_ENV=1 but $(command -v python || echo python) cannot import fairseq and sacrebleu: install them, or unset QKNORM_USE_ENV to build .venv/"
    command -v fairseq-train >/dev/null || die "QKNORM_USE_ENV=1 but fairseq-train is not on PATH"
    return 0
  fi
  VENV=$VENV bash "$ROOT/scripts/install.sh"
  # shellcheck disable=SC1091
  source "$VENV/bin/activate"
}

# atomic_write DEST CMD [ARGS...]: runs CMD with stdout to DEST.tmp.$$ and renames it into
# place only when CMD succeeded, so a later stage never sees a half-written file.
atomic_write() {
  local dest=$1 tmp="$1.tmp.$$"
  shift
  mkdir -p "$(dirname "$dest")"
  if "$@" >"$tmp"; then mv -f "$tmp" "$dest"; else local rc=$?; rm -f "$tmp"; return $rc; fi
}

# mark_done DIR [KEY]: records (atomically, in DIR/.done) that the stage in DIR finished, with the
# settings KEY (a command's hash, a fingerprint) when given; is_done DIR [KEY]: it finished (with KEY).
mark_done() { atomic_write "$1/.done" printf '%s\n' ${2:+"$2"} "$(date -u +%FT%TZ)"; }
is_done() { [[ -f $1/.done ]] && { [[ $# -lt 2 ]] || [[ $(head -n1 "$1/.done") == "$2" ]]; }; }

# run_training LABEL LOG MAX_UPDATE [PROGRESS FLAGS...] -- COMMAND...: a training command's whole
# output appended to LOG after a "# DATE COMMAND" line (one per start: the wall-time segments of
# qknorm_pipeline/study.py), shown through the progress display (qknorm_pipeline/progress.py). A
# usage error when fairseq's argument parser refused a flag (exit 2), a failure on any other exit.
run_training() {
  local label=$1 log_file=$2 max_update=$3 flags=() status msg
  shift 3
  while [[ $1 != -- ]]; do flags+=("$1"); shift; done
  shift
  mkdir -p "$(dirname "$log_file")"
  printf '# %s %s\n' "$(date -u +%FT%TZ)" "$(printf '%q ' "$@")" >>"$log_file"
  set +e
  "$@" 2>&1 | python -m qknorm_pipeline.progress train --log "$log_file" --max-update "$max_update" \
    --label "$label" --tag train "${flags[@]}"
  status=("${PIPESTATUS[@]}")
  set -e
  if [[ ${status[0]} == 2 ]]; then
    # fairseq's argument parser refused a flag: its own one-line message, not the usage block
    msg=$(grep -E '(^|: )error: ' "$log_file" | tail -n 1)
    usage_error "fairseq-train: ${msg#*error: } (full output: $(short "$log_file"))"
  fi
  if [[ ${status[0]} != 0 ]]; then
    [[ $VERBOSE == 1 ]] || tail -n 15 "$log_file" >&2
    die "training $label failed (exit ${status[0]}); full log: $(short "$log_file")"
  fi
  [[ ${status[1]} == 0 ]] || die "the progress display failed (exit ${status[1]}); training finished, log: $(short "$log_file")"
}

# has_gpu: true when torch sees a CUDA device.
has_gpu() { python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

# recipe PAIR KEY: one value of PAIR's recipe, configs/base.yaml + configs/PAIR.yaml (qknorm_pipeline/recipes.py).
recipe() { python -m qknorm_pipeline.recipes get "$1" "$2"; }
