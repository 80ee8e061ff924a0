"""The released tpu-inference wheel and a CPU JAX of the version it pins, cached under build/.

Both are keyed by version: ``build/wheels-tpu/`` holds the wheel as pip downloaded it,
``build/tpu-inference-<version>/`` its unpacked ``tpu_inference`` package (every file checked
against the wheel's RECORD), ``build/jax-cpu-<version>-cp312/`` the CPython 3.12 wheels of the
``jax`` and ``jaxlib`` that the wheel's METADATA pins, and a command that runs them in the set-up's
Ubuntu 24.04 image. A second run finds them and downloads nothing.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

from tests.conftest import ROOT, VENV_BIN

VERSION = "0.29.0"
BUILD = ROOT / "build"
WHEELS = BUILD / "wheels-tpu"


def wheel() -> Path:
    """The tpu-inference wheel, downloaded from PyPI once (2 MB, no dependencies)."""
    found = sorted(WHEELS.glob(f"tpu_inference-{VERSION}-*.whl"))
    if not found:
        subprocess.run(
            [
                str(VENV_BIN / "pip"),
                "download",
                "-q",
                "--no-deps",
                f"tpu-inference=={VERSION}",
                "-d",
                str(WHEELS),
            ],
            check=True,
            timeout=300,
        )
        found = sorted(WHEELS.glob(f"tpu_inference-{VERSION}-*.whl"))
    assert found, f"pip download left no tpu_inference-{VERSION} wheel in {WHEELS}"
    return found[0]


def record() -> dict[str, str]:
    """The wheel's RECORD: path -> sha256 hex (RECORD stores urlsafe base64 without padding)."""
    with zipfile.ZipFile(wheel()) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        rows = csv.reader(io.StringIO(zf.read(name).decode()))
        out = {}
        for path, digest, _size in rows:
            if digest.startswith("sha256="):
                raw = base64.urlsafe_b64decode(digest[len("sha256=") :] + "==")
                out[path] = raw.hex()
        return out


def metadata() -> str:
    """The wheel's METADATA text."""
    with zipfile.ZipFile(wheel()) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode()


def released_package() -> Path:
    """The released ``tpu_inference`` package directory, unpacked once and never written to."""
    dest = BUILD / f"tpu-inference-{VERSION}"
    stamp = dest / ".complete"
    if not stamp.exists():
        tmp = BUILD / f".tpu-inference-{VERSION}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        with zipfile.ZipFile(wheel()) as zf:
            members = [n for n in zf.namelist() if n.startswith("tpu_inference/")]
            zf.extractall(tmp, members)
        digests = record()
        for member in members:
            got = hashlib.sha256((tmp / member).read_bytes()).hexdigest()
            assert got == digests[member], f"{member} differs from the wheel's RECORD"
        (tmp / ".complete").write_text(VERSION + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return dest / "tpu_inference"


def pinned_jax() -> str:
    """The jax version the wheel pins (``Requires-Dist: jax==X``), which jaxlib must match."""
    m = re.search(r"^Requires-Dist: jax==(\S+)$", metadata(), re.M)
    assert m, "tpu-inference's METADATA pins no jax version"
    return m.group(1)


# Where the pinned jax runs: jax 0.11 publishes wheels for CPython 3.12 and newer only, and the
# controller's Python is Debian 12's 3.11. The set-up's Ubuntu 24.04 image has 3.12 as its python3
# (scripts/build-images.sh noble), so nothing here depends on an interpreter only some machines have.
JAX_IMAGE = "localhost/gemma-rig-base:noble"
# The wheels noble's glibc (2.39) can load: pip takes each platform tag it is given, and no older.
_JAX_PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(39, 16, -1)] + ["manylinux2014_x86_64"]
_WRAPPER = """#!/usr/bin/env bash
# python3.12 in {image}, with the pinned CPU jax on its path: what tests/unit/tpu_wheel.py
# jax_python() returns. Each argument that names a file or directory is mounted read-only at the
# same path (its directory, for a file), so a script and what it reads can be given by path.
set -euo pipefail
mounts=()
declare -A seen=()
for arg in "$@"; do
  [ -e "$arg" ] || continue
  dir=$(realpath -- "$arg"); [ -d "$dir" ] || dir=$(dirname -- "$dir")
  [ -n "${{seen[$dir]:-}}" ] || {{ seen[$dir]=1; mounts+=(-v "$dir:$dir:ro"); }}
done
export CONTAINERS_CONF={containers_conf}
# podman reads its per-user files under HOME, which a caller's bare environment may leave out.
export HOME=${{HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}}
exec podman run --rm -i --network none --pull never -v {site}:{site}:ro "${{mounts[@]}}" \\
  -e PYTHONPATH={site} ${{JAX_PLATFORMS:+-e JAX_PLATFORMS}} {image} python3.12 -s "$@"
"""


def jax_python() -> Path:
    """A command that runs Python 3.12 with the CPU jax/jaxlib that tpu-inference pins, as a
    python would be run: the controller's pip installs the cp312 wheels into a directory once
    (~1 min), and the command runs the set-up's Ubuntu 24.04 image's python3.12 on it."""
    version = pinned_jax()
    home = BUILD / f"jax-cpu-{version}-cp312"
    site = home / "site-packages"
    python = home / "python"
    stamp = home / ".complete"
    probe = subprocess.run(
        ["podman", "image", "exists", JAX_IMAGE],
        env={**os.environ, "CONTAINERS_CONF": str(ROOT / "roles/local_rig/files/containers.conf")},
        check=False,
        timeout=60,
    )
    assert probe.returncode == 0, (
        f"no image {JAX_IMAGE}: run scripts/setup.sh (or scripts/build-images.sh noble)"
    )
    if not stamp.exists():
        shutil.rmtree(home, ignore_errors=True)
        subprocess.run(
            [
                str(VENV_BIN / "pip"),
                "install",
                "-q",
                "--target",
                str(site),
                "--only-binary=:all:",
                "--implementation",
                "cp",
                "--python-version",
                "3.12",
                *(arg for platform in _JAX_PLATFORMS for arg in ("--platform", platform)),
                "--no-warn-conflicts",  # pip checks the controller's venv, which --target leaves alone
                f"jax=={version}",
                f"jaxlib=={version}",
            ],
            check=True,
            timeout=900,
        )
        stamp.write_text(version + "\n")
    python.write_text(
        _WRAPPER.format(
            image=JAX_IMAGE, site=site, containers_conf=ROOT / "roles/local_rig/files/containers.conf"
        )
    )
    python.chmod(0o755)
    return python
