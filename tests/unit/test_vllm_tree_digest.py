"""The vllm role's plugin tree digest: the plugin is copied to the rig only when it differs.

The digest is the role's own code (roles/vllm/vars/main.yml, _vllm_tree_digest_code), run as the
role runs it on the controller: it must change with any byte, name or mode, and only then.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CODE = yaml.safe_load((ROOT / "roles/vllm/vars/main.yml").read_text())["_vllm_tree_digest_code"]


def digest(tree: Path) -> str:
    return subprocess.run(
        [sys.executable, "-I", "-c", CODE, str(tree)], capture_output=True, text=True, check=True
    ).stdout.strip()


def make(tree: Path) -> Path:
    (tree / "pkg").mkdir(parents=True)
    (tree / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tree / "pkg" / "__init__.py").write_text("x = 1\n")
    return tree


def test_same_tree_same_digest_anywhere(tmp_path: Path) -> None:
    a, b = make(tmp_path / "a"), make(tmp_path / "b")
    assert len(digest(a)) == 64
    assert digest(a) == digest(a) == digest(b)  # the path of the tree itself does not count


def test_a_byte_a_name_a_mode_or_a_new_file_changes_it(tmp_path: Path) -> None:
    base = digest(make(tmp_path / "base"))
    byte = make(tmp_path / "byte")
    (byte / "pkg" / "__init__.py").write_text("x = 2\n")
    name = make(tmp_path / "name")
    (name / "pkg" / "__init__.py").rename(name / "pkg" / "other.py")
    mode = make(tmp_path / "mode")
    (mode / "pyproject.toml").chmod(0o755)
    extra = make(tmp_path / "extra")
    (extra / "pkg" / "gather.py").write_text("")
    found = {digest(t) for t in (byte, name, mode, extra)}
    assert base not in found and len(found) == 4
