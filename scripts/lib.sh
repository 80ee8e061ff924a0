# Shared shell helpers for scripts/*.sh: sourced, never run.
# shellcheck shell=bash

die() { printf 'error: %s\n' "$*" >&2; exit 1; }
say() { printf '==> %s\n' "$*" >&2; }

# Run a command as root: directly when we are root, else through sudo.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo "$@"
  else die "this step needs root: run as root or give this user passwordless sudo (needed for: $*)"
  fi
}

# Fail early, with one clear line, when a prerequisite is missing.
need_free_gb() {  # need_free_gb DIR GB
  local avail_kb
  avail_kb=$(df -Pk "$1" | awk 'NR==2 {print $4}')
  [ "$avail_kb" -ge $(( $2 * 1024 * 1024 )) ] || die "$1 has $(( avail_kb / 1024 / 1024 )) GB free; the rig needs at least $2 GB (images, wheelhouse, models)"
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
BUILD="$ROOT/build"
export CONTAINERS_CONF="$ROOT/roles/local_rig/files/containers.conf"
export ANSIBLE_CONFIG="$ROOT/ansible.cfg"

# Background jobs, each in its own session (setsid), so that stopping one stops every process it
# started (debootstrap, pip, ansible-playbook's workers), not just its shell. After
# `in_background CMD...`, $! is the job's pid; stop_background stops every job started so.
BACKGROUND=()
in_background() { setsid "$@" & BACKGROUND+=("$!"); }
stop_background() { local pid; for pid in "${BACKGROUND[@]}"; do kill -- "-$pid" 2>/dev/null || true; done; }
# A step the script waits for, yet stops at once on a TERM or Ctrl-C: bash runs a trap only after
# its foreground command returns, but it interrupts `wait`.
in_foreground() { in_background "$@"; wait "$!"; }

# --help for every script: its leading comment block is its usage.
usage() { sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; }
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
