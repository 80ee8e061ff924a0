"""requirements.yml pins the collections the playbooks use, at the versions the venv bundles."""

from __future__ import annotations

import json
import re
import subprocess

import yaml

from tests.conftest import ROOT, VENV_BIN

# FQCNs of collection content (modules, callbacks, filters) in the project's own files.
_FQCN = re.compile(r"\b((?!ansible\.builtin\b)[a-z_]+\.[a-z_]+)\.[a-z_]+\b")
_SOURCES = ("site.yml", "swap.yml", "teardown.yml", "ansible.cfg", "playbooks", "roles", "molecule")


def _pins() -> dict[str, str]:
    data = yaml.safe_load((ROOT / "requirements.yml").read_text())
    return {c["name"]: str(c["version"]) for c in data["collections"]}


def _installed() -> dict[str, str]:
    out = subprocess.run(
        [str(VENV_BIN / "ansible-galaxy"), "collection", "list", "--format", "json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found: dict[str, str] = {}
    for collections in json.loads(out).values():
        for name, info in collections.items():
            found.setdefault(name, info["version"])
    return found


def _used() -> set[str]:
    used: set[str] = set()
    for source in _SOURCES:
        path = ROOT / source
        files = (
            [path] if path.is_file() else [p for p in path.rglob("*") if p.suffix in {".yml", ".j2", ".cfg"}]
        )
        for file in files:
            used |= {m for m in _FQCN.findall(file.read_text()) if m.count(".") == 1}
    return used


def test_every_pinned_collection_is_the_version_installed() -> None:
    installed = _installed()
    for name, version in _pins().items():
        assert installed.get(name) == version, (
            f"{name}: requirements.yml {version}, venv {installed.get(name)}"
        )


def test_every_collection_used_is_pinned() -> None:
    installed = set(_installed())
    used = {name for name in _used() if name in installed}
    assert used, "found no collection content at all: the scan is broken"
    assert used <= set(_pins()), f"used but not in requirements.yml: {sorted(used - set(_pins()))}"


def test_pyproject_and_lock_agree_on_ansible() -> None:
    lock = re.search(r"^ansible==(\S+)$", (ROOT / "requirements.lock").read_text(), re.M)
    pyproject = re.search(r'"ansible([<>=!~]=?[^"]*)"', (ROOT / "pyproject.toml").read_text())
    assert lock and pyproject
    assert pyproject[1] == f"=={lock[1]}", (pyproject[1], lock[1])


def test_lock_pins_the_cloud_clients_the_modules_import() -> None:
    """library/gce_*.py and tpu_node.py import these; the lock is installed with --no-deps."""
    lock = (ROOT / "requirements.lock").read_text()
    for name in (
        "google-cloud-compute", "google-cloud-tpu", "google-api-core", "google-auth", "proto-plus",
        # library/gce_iam_*.py: service accounts and roles, a project's policy, IAM's Policy type
        "google-cloud-iam", "google-cloud-resource-manager", "grpc-google-iam-v1",
    ):  # fmt: skip
        assert re.search(rf"^{re.escape(name)}==\S+$", lock, re.M), (
            f"{name} is not pinned in requirements.lock"
        )
