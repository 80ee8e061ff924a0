#!/usr/bin/env bash
# Build the systemd base images the local rig and the molecule scenarios run in, from
# debootstrap (no container registry needed). Images that exist are reused. The local_rig role
# runs it for its suite; scripts/build-images.sh (the user's command) for every default one.
#   build-images.sh BUILD_DIR [SUITE...]  BUILD_DIR: where rootfs, keyrings and logs go
# RIG_DEBIAN_MIRROR overrides debootstrap's default Debian mirror, RIG_UBUNTU_MIRROR its Ubuntu one.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=${1:?usage: build-images.sh BUILD_DIR [SUITE...]}
shift
export CONTAINERS_CONF=${CONTAINERS_CONF:-$HERE/containers.conf}
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
say() { printf '==> %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@" || die "this step needs root or passwordless sudo: $*"; fi; }

# The Ubuntu archive's signing key (2018), pinned: a Debian host ships no Ubuntu keyring.
UBUNTU_ARCHIVE_KEY=F6ECB3762474EDA9D21B7022871920D1991BC93C

# Ubuntu's keyring for debootstrap: apt fetches the ubuntu-keyring package without a check (there
# is nothing yet to check it with), and it is used only when its key is the pinned one; debootstrap
# then checks every package against it.
ubuntu_keyring() {  # ubuntu_keyring SUITE -> prints the keyring's path
  local suite=$1 dir="$BUILD/ubuntu-keyring-$1" mirror=${RIG_UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu}
  local keyring="$dir/usr/share/keyrings/ubuntu-archive-keyring.gpg"
  if [ ! -s "$keyring" ]; then
    rm -rf "$dir"; mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
    echo "deb [trusted=yes] $mirror $suite main" >"$dir/sources.list"
    local apt_opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=- -o "Dir::State::Lists=$dir/lists"
      -o "Dir::Cache=$dir/cache" -o APT::Architecture=amd64 -o Debug::NoLocking=1)
    apt-get "${apt_opts[@]}" update >"$dir/apt.log" 2>&1 || die "apt-get update for $suite failed; see $dir/apt.log"
    (cd "$dir" && apt-get "${apt_opts[@]}" download ubuntu-keyring >>"$dir/apt.log" 2>&1) || die "ubuntu-keyring download failed; see $dir/apt.log"
    dpkg-deb -x "$dir"/ubuntu-keyring_*.deb "$dir"
  fi
  gpg --show-keys --with-colons "$keyring" 2>/dev/null | grep -q "^fpr:.*:$UBUNTU_ARCHIVE_KEY:" \
    || die "the ubuntu-keyring package does not hold the Ubuntu archive key $UBUNTU_ARCHIVE_KEY; not used"
  echo "$keyring"
}

# debootstrap's script for an Ubuntu suite. Debian 12's debootstrap (1.0.128) has none for noble,
# which is released after it; every Ubuntu suite's script is a link to gutsy, which handles the
# suites it does not name as the newest (merged /usr), so gutsy stands in for one it lacks.
ubuntu_script() {  # ubuntu_script SUITE -> prints the script's path
  local dir=/usr/share/debootstrap/scripts
  if [ -e "$dir/$1" ]; then echo "$dir/$1"; else echo "$dir/gutsy"; fi
}

build_one() {
  local suite=$1 image="localhost/gemma-rig-base:$1" base="localhost/debian-minbase:$1"
  if podman image exists "$image"; then say "image $image exists, reused"; return; fi
  if ! podman image exists "$base"; then
    local rootfs="$BUILD/rootfs-$suite" extra=()
    case $suite in
      jammy|noble) extra=(--keyring="$(ubuntu_keyring "$suite")" --components=main,universe "$suite" "$rootfs"
        "${RIG_UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu}" "$(ubuntu_script "$suite")") ;;
      *) extra=("$suite" "$rootfs" ${RIG_DEBIAN_MIRROR:+"$RIG_DEBIAN_MIRROR"}) ;;
    esac
    as_root rm -rf "$rootfs"
    say "debootstrap $suite (minbase)"
    as_root debootstrap --variant=minbase "${extra[@]}" >"$BUILD/debootstrap-$suite.log" 2>&1 \
      || die "debootstrap $suite failed; see $BUILD/debootstrap-$suite.log"
    as_root tar -C "$rootfs" -c . | podman import - "$base" >/dev/null
    as_root rm -rf "$rootfs"
  fi
  say "building $image"
  podman build --network host -q -f "$HERE/Containerfile.systemd" --build-arg "BASE=$base" -t "$image" "$HERE" >/dev/null
}

command -v podman >/dev/null || die "podman is not installed: run scripts/setup.sh first"
command -v debootstrap >/dev/null || die "debootstrap is not installed: run scripts/setup.sh first"
mkdir -p "$BUILD"
for suite in "${@:-bookworm trixie noble}"; do
  for s in $suite; do build_one "$s"; done
done
