#!/usr/bin/env bash
# Installs (or reuses) .venv and runs the default test suite.
#   bash scripts/run_tests.sh [pytest args...]
# Slow system runs are excluded by default; run them with: bash scripts/run_tests.sh -m slow
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
activate_env
cd "$ROOT"
set +e
python -m pytest "$@"
rc=$?
# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
if [[ $rc == 5 ]]; then die "pytest collected no tests"; fi
exit $rc
