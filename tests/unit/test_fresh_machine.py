"""The suite runs on a fresh Debian 12 or Ubuntu 24.04 machine: nothing it runs names an interpreter
or a path that only some machines have (a pyenv build under a home directory), and every image a
test runs in is one the set-up builds (scripts/build-images.sh's default suites)."""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.conftest import ROOT
from tests.unit import tpu_wheel

# What the suite, the scenarios and the set-up run (docs and evidence only tell).
RUN_DIRS = (".ci/", "tests/", "molecule/", "scripts/", "roles/", "playbooks/", "inventory/", "library/")
# A home directory's interpreter manager: pyenv's root, or its variable (pieced, so this file
# does not name it itself).
MACHINE_ONLY = re.compile("|".join(("\\." + "pyenv", "PYENV" + "_ROOT", "MOLECULE_TPU_PYTHON" + "_PREFIX")))


def _files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *RUN_DIRS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [f for f in listed if (ROOT / f).is_file()]


def test_nothing_run_names_a_machine_only_interpreter() -> None:
    files = _files()
    assert "tests/unit/tpu_wheel.py" in files and "molecule/tpu/molecule.yml" in files, files[:20]
    found = []
    for name in files:
        try:
            text = (ROOT / name).read_text()
        except UnicodeDecodeError:
            continue
        found += [
            f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}"
            for m in MACHINE_ONLY.finditer(text)
        ]
    assert found == []


def _default_suites() -> set[str]:
    script = (ROOT / "roles" / "local_rig" / "files" / "build-images.sh").read_text()
    m = re.search(r'for suite in "\$\{@:-([a-z ]+)\}"', script)
    assert m, "build-images.sh's default suites not found"
    return set(m.group(1).split())


def test_every_image_a_test_runs_in_is_built_by_the_set_up() -> None:
    suites = _default_suites()
    images = {tpu_wheel.JAX_IMAGE}
    for scenario in sorted((ROOT / "molecule").glob("*/molecule.yml")):
        images |= {p["image"] for p in yaml.safe_load(scenario.read_text())["platforms"]}
    tags = {image.removeprefix("localhost/gemma-rig-base:") for image in images}
    assert all(image.startswith("localhost/gemma-rig-base:") for image in images), images
    assert tags <= suites, (
        f"images {sorted(tags - suites)} are not among build-images.sh's defaults {sorted(suites)}"
    )
    assert "noble" in tags  # the Python 3.12 the tpu scenario and tpu-inference's JAX run on
