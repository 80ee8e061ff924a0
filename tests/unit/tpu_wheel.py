"""The released tpu-inference wheel and a CPU JAX of the version it pins, cached under build/.

Both are keyed by version: ``build/wheels-tpu/`` holds the wheel as pip downloaded it,
``build/tpu-inference-<version>/`` its unpacked ``tpu_inference`` package (every file checked
against the wheel's RECORD), ``build/jax-cpu-<version>/`` a virtualenv with the ``jax`` and
``jaxlib`` that the wheel's METADATA pins. A second run finds them and downloads nothing.
"""

from __future__ import annotations

import base64
import csv
import glob
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


def _runs(python: str) -> bool:
    """Whether ``python`` starts (a pyenv shim on PATH may name a version pyenv has not selected)."""
    try:
        return (
            subprocess.run([python, "-c", "pass"], capture_output=True, timeout=60, check=False).returncode
            == 0
        )
    except OSError:
        return False


def _python_312() -> str:
    """An interpreter >= 3.12 that runs: jax 0.11 publishes wheels for those only (the controller
    has 3.11). pyenv's own builds first (this project's machines have them), then PATH."""
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[23]*/bin/python3")), reverse=True)
    candidates += [found for name in ("python3.13", "python3.12") if (found := shutil.which(name))]
    for candidate in candidates:
        if _runs(candidate):
            return candidate
    raise AssertionError(
        f"no Python 3.12 or newer that runs (tried {candidates or 'none'}; python3.12 on PATH or under "
        "~/.pyenv): jax 0.11 needs one"
    )


def jax_python() -> Path:
    """A virtualenv's python with the CPU jax/jaxlib that tpu-inference pins (made once, ~40 s)."""
    version = pinned_jax()
    venv = BUILD / f"jax-cpu-{version}"
    python = venv / "bin" / "python"
    stamp = venv / ".complete"
    if not stamp.exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([_python_312(), "-m", "venv", str(venv)], check=True, timeout=300)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"jax=={version}", f"jaxlib=={version}"],
            check=True,
            timeout=900,
        )
        stamp.write_text(version + "\n")
    return python
