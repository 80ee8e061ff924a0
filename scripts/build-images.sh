#!/usr/bin/env bash
# Build the systemd base images the local rig and the molecule scenarios run in, from
# debootstrap (no container registry needed). Images that exist are reused.
#   scripts/build-images.sh [SUITE...]     default: bookworm trixie noble (noble: Ubuntu 24.04, whose
#                                          own archive has Python 3.12, for the tpu scenario and the
#                                          tests that run tpu-inference's JAX)
# RIG_DEBIAN_MIRROR overrides debootstrap's default Debian mirror, RIG_UBUNTU_MIRROR its Ubuntu one.
# The build itself is the local_rig role's (roles/local_rig/files/build-images.sh), which
# provisioning runs for its own suite.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
exec "$ROOT/roles/local_rig/files/build-images.sh" "$BUILD" "$@"
