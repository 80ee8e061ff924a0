#!/usr/bin/env bash
# Stand up the local rig from nothing: set-up (packages, virtualenv, images), then site.yml.
# Extra arguments go to ansible-playbook (for example -e rig_model=tiny-text).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
"$ROOT/scripts/setup.sh" bookworm
exec "$VENV/bin/ansible-playbook" site.yml "$@"
