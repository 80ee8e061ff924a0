#!/usr/bin/env bash
# Stand up the local rig from nothing: set-up (packages, virtualenv, images), then site.yml.
# Extra arguments go to ansible-playbook (for example -e rig_model=tiny-text).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
"$ROOT/scripts/setup.sh" bookworm
# The served checkpoint is built on the controller (CPU: the tiny model's training and the
# converters) while the rig is provisioned and installs vLLM (downloads and unpacking). It is the
# very play site.yml runs, so site.yml then finds the checkpoint up to date and the rig converged.
say "building the served checkpoint on the controller while the rig is set up (log: build/up-checkpoint.log)"
"$VENV/bin/ansible-playbook" playbooks/checkpoint.yml "$@" >"$BUILD/up-checkpoint.log" 2>&1 &
CHECKPOINT_PID=$!
trap 'kill "$CHECKPOINT_PID" 2>/dev/null || true' EXIT
"$VENV/bin/ansible-playbook" playbooks/provision.yml playbooks/configure.yml "$@"
say "waiting for the checkpoint build"
wait "$CHECKPOINT_PID" || { tail -n 30 "$BUILD/up-checkpoint.log" >&2; die "building the checkpoint failed (build/up-checkpoint.log)"; }
trap - EXIT
exec "$VENV/bin/ansible-playbook" site.yml "$@"
