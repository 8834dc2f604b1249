#!/usr/bin/env bash
# Creates (or reuses) the virtual environment .venv/ with everything qknorm-fairseq needs: what
# pyproject.toml declares, and the three things pip cannot express there:
#   - the torch wheel that fits the machine (an installed torch >= 2.1 is reused; else a local wheel;
#     else the CPU-only index on a machine without an NVIDIA driver; else PyPI);
#   - fairseq-fixed, built against that torch (--no-build-isolation) and without its declared
#     dependencies (--no-deps: they pull torchaudio, which text translation never uses);
#   - fastBPE, whose build imports Cython (--no-build-isolation), and its command-line tool `fast`
#     (learnbpe), compiled from the same sdist into .venv/bin/.
# The package is installed editable (its console scripts run this checkout's code and configs/),
# its plugin linked next to fairseq (for `--user-dir qknorm_fairseq` from any folder).
# Idempotent: a stamp file records what was installed.
#
# Environment:
#   PYTHON       interpreter for the venv (default: python3; must be >= 3.11)
#   VENV         venv location (default: <repo>/.venv)
#   TORCH_SPEC   pip requirement for torch when one must be installed (default: torch>=2.1)
#   TORCH_INDEX  index URL for that torch (default: see above)
# No options; -h/--help prints this. Exit status: 0 ok, 2 a usage error, 1 a failure.
case ${1:-} in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
[[ $# == 0 ]] || { printf '[install] error: unknown argument %s (see bash scripts/install.sh --help)\n' "$1" >&2; exit 2; }
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch>=2.1}
FAIRSEQ=fairseq-fixed==0.12.3.1  # fairseq==0.12.2 does not import on Python 3.11; this fork is the same code
FASTBPE=fastBPE==0.1.0
say() { printf '[install] %s\n' "$*" >&2; }
die() { printf '[install] error: %s\n' "$*" >&2; exit 1; }

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "$PYTHON is $("$PYTHON" -V 2>&1); qknorm-fairseq needs Python >= 3.11 (set PYTHON=python3.11 or newer)"

stamp=$VENV/.qknorm-stamp
want=$(cat "$ROOT/scripts/install.sh" "$ROOT/pyproject.toml" | sha1sum | cut -c1-16)

if [[ -f $stamp && $(head -n1 "$stamp") == "$want" && -x $VENV/bin/python ]]; then
  exit 0
fi

t0=$SECONDS
base_torch=$("$PYTHON" -c 'import torch; v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]); print(torch.__version__ if v >= (2, 1) else "")' 2>/dev/null || true)
if [[ ! -x $VENV/bin/python ]]; then
  say "creating $VENV${base_torch:+ (reusing the installed torch $base_torch)}"
  "$PYTHON" -m venv ${base_torch:+--system-site-packages} "$VENV"
fi
PY=$VENV/bin/python
pip() { "$PY" -m pip "$@"; }
pip install -q --upgrade "pip>=23" "setuptools>=68" wheel

if ! "$PY" -c 'import torch' 2>/dev/null; then
  tmp=$(mktemp -d)
  if pip download -q --no-index --no-deps -d "$tmp" "$TORCH_SPEC" 2>/dev/null; then
    say "installing torch from a local wheel: $(basename "$tmp"/torch-*.whl)"
    pip install -q "$tmp"/torch-*.whl
  elif [[ -n ${TORCH_INDEX:-} ]]; then
    pip install -q --index-url "$TORCH_INDEX" "$TORCH_SPEC"
  elif ! command -v nvidia-smi >/dev/null 2>&1 && [[ $(uname -s) == Linux ]]; then
    say "no NVIDIA driver found: installing the CPU build of torch"  # PyPI's pulls GBs of CUDA libraries
    pip install -q --index-url https://download.pytorch.org/whl/cpu "$TORCH_SPEC"
  else
    pip install -q "$TORCH_SPEC"
  fi
  rm -rf "$tmp"
fi
say "torch $("$PY" -c 'import torch; print(torch.__version__)')"

pip install -q --no-build-isolation -e "$ROOT[dev]"  # pyproject.toml's dependencies, and the package
if ! "$PY" -c 'import fairseq' 2>/dev/null; then
  say "building $FAIRSEQ (a few minutes)"
  pip install -q --no-deps --no-build-isolation "$FAIRSEQ"
fi
# fairseq looks for a relative --user-dir next to its own package: `--user-dir qknorm_fairseq` then
# works from any folder, and finds this checkout's plugin
site=$("$PY" -c 'import os, fairseq; print(os.path.dirname(os.path.dirname(fairseq.__file__)))')
rm -rf "$site/qknorm_fairseq" && ln -s "$ROOT/qknorm_fairseq" "$site/qknorm_fairseq"
"$PY" -c 'import fastBPE' 2>/dev/null || pip install -q --no-deps --no-build-isolation "$FASTBPE"
if [[ ! -x $VENV/bin/fast ]]; then
  tmp=$(mktemp -d)
  pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$tmp" "$FASTBPE"
  tar -xzf "$tmp"/fastBPE-*.tar.gz -C "$tmp"
  main=$(find "$tmp" -name main.cc | head -n1)
  [[ -n $main ]] || die "the $FASTBPE sdist has no main.cc"
  g++ -std=c++11 -pthread -O3 -I"$(dirname "$main")" "$main" -o "$VENV/bin/fast"
  rm -rf "$tmp"
fi
"$PY" -c 'import qknorm_fairseq, qknorm_pipeline, fairseq, fastBPE, sacrebleu, sentencepiece, sacremoses' \
  || die "the environment in $VENV is incomplete; remove it and run again"
printf '%s\n' "$want" >"$stamp"
say "environment ready in $((SECONDS - t0)) s: $VENV"
