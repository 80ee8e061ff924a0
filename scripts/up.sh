#!/usr/bin/env bash
# Stand up the local rig from nothing: set-up (packages, virtualenv, images), then site.yml.
# Extra arguments go to ansible-playbook (for example -e rig_model=tiny-text).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
# Three things run at once, each as soon as what it needs is there:
#   - the rig's base image (debootstrap), then provisioning and configuring the rig (its vLLM
#     install is the longest step), which need only the virtualenv's Ansible part;
#   - the rest of the controller virtualenv (torch, vLLM), then the served checkpoint (the tiny
#     model's training and the converters), the very play site.yml runs, so site.yml then finds
#     it up to date;
# and site.yml starts when both are done.
"$ROOT/scripts/setup.sh" --only packages
"$ROOT/scripts/setup.sh" --only images bookworm &
IMAGES_PID=$!
CONTROLLER_PID=
trap 'kill $IMAGES_PID $CONTROLLER_PID 2>/dev/null || true' EXIT
"$ROOT/scripts/setup.sh" --only ansible
say "filling the controller virtualenv, then building the served checkpoint, while the rig is set up (log: build/up-controller.log)"
{ "$ROOT/scripts/setup.sh" --only venv && "$VENV/bin/ansible-playbook" playbooks/checkpoint.yml "$@"; } >"$BUILD/up-controller.log" 2>&1 &
CONTROLLER_PID=$!
wait "$IMAGES_PID" || die "building the base image failed (see the lines marked [images] above)"
"$VENV/bin/ansible-playbook" playbooks/provision.yml playbooks/configure.yml "$@"
say "waiting for the controller virtualenv and the checkpoint build"
wait "$CONTROLLER_PID" || { tail -n 30 "$BUILD/up-controller.log" >&2; die "filling the virtualenv or building the checkpoint failed (build/up-controller.log)"; }
trap - EXIT
exec "$VENV/bin/ansible-playbook" site.yml "$@"
