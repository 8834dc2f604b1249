# What every script shares: the project's environment, and `door`, which hands the script's
# arguments to its Python command in qknorm_pipeline/ (that command's --help is the manual).
# Source it; do not run it. Every output folder can be moved with an environment variable:
#   DATA_DIR (data/), DATA_BIN (data-bin/), CKPT_DIR (checkpoints/), LOG_DIR (logs/),
#   RESULTS_DIR (results/), VENV (.venv/). VERBOSE=1 shows every tool's whole output.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}

# Creates or reuses .venv (scripts/install.sh is idempotent) and puts it first on PATH.
# QKNORM_USE_ENV=1 uses the Python environment already on PATH instead (a cluster's module, a
# container with no internet): nothing is installed; that fairseq and sacrebleu are there is checked
# by finding them, not importing them (an import of fairseq takes seconds, at every script's start).
activate_env() {
  if [[ ${QKNORM_USE_ENV:-0} == 1 ]]; then
    python -c 'import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ("fairseq", "sacrebleu")))' 2>/dev/null || {
      printf '[%s] error: QKNORM_USE_ENV=1 but %s cannot import fairseq and sacrebleu: install them, or unset QKNORM_USE_ENV to build .venv/\n' \
        "$(basename "$0" .sh)" "$(command -v python || echo python)" >&2
      exit 1
    }
    return 0
  fi
  VENV=$VENV bash "$ROOT/scripts/install.sh"
  # shellcheck disable=SC1091
  source "$VENV/bin/activate"
}

# door MODULE ARGS...: run `python -m MODULE ARGS...` from this checkout, in the project's
# environment; its errors and --help name the script the user typed.
door() {
  local module=$1
  shift
  activate_env
  export QKNORM_DOOR="scripts/$(basename "$0")" PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  exec python -m "$module" "$@"
}
