#!/usr/bin/env bash
# Run the project's tests: set-up first (idempotent), then pytest.
#   scripts/test.sh            everything: units, lint, converters in vLLM, molecule, the local rig
#   scripts/test.sh fast       units and lint only (the inner loop; needs set-up once)
#   scripts/test.sh ARGS...    anything else is passed to pytest
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
if [ "${1:-}" = fast ]; then
  shift
  exec "$VENV/bin/pytest" -m "not slow" "$@"
fi
"$ROOT/scripts/setup.sh"
exec "$VENV/bin/pytest" "$@"
