#!/usr/bin/env bash
# Installs (or reuses) .venv and runs the default test suite: tests/unit and tests/integration.
#   bash scripts/run_tests.sh [pytest args...]
# One tier: tests/unit, tests/integration, or tests/system (a user's pipelines end to end, minutes
# each, left out by default): e.g. bash scripts/run_tests.sh tests/system -k demo.
# Every argument goes to pytest (python -m pytest --help lists them), e.g. -k NAME, -x, -q.
case ${1:-} in -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
activate_env
cd "$ROOT"
set +e
python -m pytest "$@"
rc=$?
# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
if [[ $rc == 5 ]]; then echo "[run_tests] error: pytest collected no tests" >&2; exit 1; fi
exit $rc
