#!/usr/bin/env bash
# Stand up the local rig from nothing: set-up (packages, virtualenv, images), then site.yml.
#   scripts/up.sh [ARGS...]   ARGS go to ansible-playbook (for example -e rig_model=tiny-text)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
# Two paths run side by side, each step as soon as what it needs is there:
#   - the rig's base image (debootstrap), then provisioning and configuring the rig (its vLLM
#     install is the longest step), which need only the virtualenv's Ansible part;
#   - the rest of the controller virtualenv (torch, vLLM), then the served checkpoint (the tiny
#     model's training and the converters): the very play site.yml runs, so site.yml then finds
#     it up to date.
# site.yml starts when both are done.
# A failure, Ctrl-C or a kill of up.sh stops both paths, and the step it waits for, whole
# (in_background and in_foreground, scripts/lib.sh). apt alone runs as a plain step: a stop waits
# for it to finish rather than leave dpkg half done.
trap stop_background EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$ROOT/scripts/setup.sh" --only packages
in_background "$ROOT/scripts/setup.sh" --only images bookworm
IMAGES_PID=$!
in_foreground "$ROOT/scripts/setup.sh" --only ansible
say "filling the controller virtualenv, then building the served checkpoint, while the rig is set up (log: build/up-controller.log)"
in_background bash -c '"$1/scripts/setup.sh" --only venv && "$2/bin/ansible-playbook" playbooks/checkpoint.yml "${@:3}"' \
  up-controller "$ROOT" "$VENV" "$@" >"$BUILD/up-controller.log" 2>&1
CONTROLLER_PID=$!
wait "$IMAGES_PID" || die "building the base image failed (see the lines marked [images] above)"
in_foreground "$VENV/bin/ansible-playbook" playbooks/provision.yml playbooks/configure.yml "$@"
say "waiting for the controller virtualenv and the checkpoint build"
wait "$CONTROLLER_PID" || { tail -n 30 "$BUILD/up-controller.log" >&2; die "filling the virtualenv or building the checkpoint failed (build/up-controller.log)"; }
trap - EXIT INT TERM
exec "$VENV/bin/ansible-playbook" site.yml "$@"
