#!/usr/bin/env bash
# Build the systemd base images the local rig and the molecule scenarios run in, from
# debootstrap (no container registry needed). Images that exist are reused.
#   scripts/build-images.sh [SUITE...]     default: bookworm trixie
# RIG_DEBIAN_MIRROR overrides debootstrap's default Debian mirror.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

build_one() {
  local suite=$1 image="localhost/gemma-rig-base:$1" base="localhost/debian-minbase:$1"
  if podman image exists "$image"; then say "image $image exists, reused"; return; fi
  if ! podman image exists "$base"; then
    local rootfs="$BUILD/rootfs-$suite"
    as_root rm -rf "$rootfs"
    say "debootstrap $suite (minbase)"
    as_root debootstrap --variant=minbase "$suite" "$rootfs" ${RIG_DEBIAN_MIRROR:+"$RIG_DEBIAN_MIRROR"} >"$BUILD/debootstrap-$suite.log" 2>&1 \
      || die "debootstrap $suite failed; see $BUILD/debootstrap-$suite.log"
    as_root tar -C "$rootfs" -c . | podman import - "$base" >/dev/null
    as_root rm -rf "$rootfs"
  fi
  say "building $image"
  podman build --network host -q -f "$ROOT/files/Containerfile.systemd" --build-arg "BASE=$base" -t "$image" "$ROOT/files" >/dev/null
}

command -v podman >/dev/null || die "podman is not installed: run scripts/setup.sh first"
command -v debootstrap >/dev/null || die "debootstrap is not installed: run scripts/setup.sh first"
mkdir -p "$BUILD"
for suite in "${@:-bookworm trixie}"; do
  for s in $suite; do build_one "$s"; done
done
