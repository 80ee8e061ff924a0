#!/usr/bin/env bash
# Run the project's tests: set-up first (idempotent), then pytest.
#   scripts/test.sh            everything: units, lint, converters in vLLM, molecule, the local rig
#   scripts/test.sh fast       units and lint only (the inner loop; needs set-up once)
#   scripts/test.sh ARGS...    anything else is passed to pytest
# Everything but `fast` runs in RIG_TEST_LANES worker processes (default 2, pytest-xdist): one lane
# takes the e2e tests on the shared rig, the other everything else (tests/conftest.py groups them).
# RIG_TEST_LANES=1 runs in one process, in collection order.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
if [ "${1:-}" = fast ]; then
  shift
  exec "$VENV/bin/pytest" -m "not slow" "$@"
fi
"$ROOT/scripts/setup.sh"
lanes=${RIG_TEST_LANES:-2}
if [ "$lanes" -gt 1 ]; then
  exec "$VENV/bin/pytest" -n "$lanes" --dist loadgroup --no-loadscope-reorder "$@"
fi
exec "$VENV/bin/pytest" "$@"
