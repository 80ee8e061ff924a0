"""`ansible-test sanity` on the project's modules, copied into a collection-shaped tree.

ansible-test only runs on a collection (ansible_collections/<ns>/<name>), so the test copies
library/ to plugins/modules and module_utils/ to plugins/module_utils, rewrites the
`ansible.module_utils.<ours>` imports to the collection's, adds the waivers from
tests/lint/sanity-ignore.txt (each line says why) and runs validate-modules, import, compile,
pep8 and pylint in local mode with this virtualenv's Python.

ansible-test builds one virtualenv per test under ~/.ansible/test/venv, with its own pinned tools
(pylint, pycodestyle, voluptuous...) from PyPI, and bootstraps pip in each from a get-pip script
it downloads from ci-files.testing.ansible.com. That host is outside what the project reaches, so
the set-up below puts a stand-in for that script in ansible-test's cache: it installs the same pip
version from PyPI's wheel. The first run takes about a minute (the installs); later runs ~15 s.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, VENV_BIN

NAMESPACE, NAME = "gemma_rig", "rig"
TESTS = ("validate-modules", "import", "compile", "pep8", "pylint")
IGNORE = ROOT / "tests" / "lint" / "sanity-ignore.txt"
# Ansible plugins of the project that ansible-test checks besides the modules: (source, target).
PLUGIN_DIRS = (
    ("library", "modules"),
    ("module_utils", "module_utils"),
    ("plugins/lookup", "lookup"),
    ("plugins/filter", "filter"),
    ("plugins/doc_fragments", "doc_fragments"),
)

GET_PIP_STANDIN = '''"""Stand-in for get-pip.py {version}, written by gemma-rig's tests/lint/test_ansible_sanity.py.

ansible-test runs it in a new, pip-less virtualenv with pip's own arguments; it installs pip
{version} from the wheel beside it, as the real script does from the copy it embeds.
"""
import os
import sys

WHEEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "{wheel}")
sys.path.insert(0, WHEEL)
from pip._internal.cli.main import main  # noqa: E402

ARGS = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(main(["install", "--no-index", "--find-links", os.path.dirname(WHEEL), *ARGS]))
'''


def build_tree(dest: Path) -> Path:
    """The collection-shaped copy under ``dest``; returns the collection's root."""
    root = dest / "ansible_collections" / NAMESPACE / NAME
    ours = sorted(p.stem for p in (ROOT / "module_utils").glob("*.py"))
    local_import = re.compile(rf"\bansible\.module_utils\.({'|'.join(ours)})\b")
    fragments = "|".join(p.stem for p in (ROOT / "plugins" / "doc_fragments").glob("*.py"))
    fragment_list = re.compile(r"^extends_documentation_fragment: \[.*\]$", re.M)
    # Each of ours in the list, by itself or with the variable it names (google_cloud.state).
    fragment_name = re.compile(rf"(?<=[\[ ])({fragments})\b")
    for source, target in PLUGIN_DIRS:
        for path in sorted((ROOT / source).glob("*.py")):
            out = root / "plugins" / target / path.name
            out.parent.mkdir(parents=True, exist_ok=True)
            text = local_import.sub(
                rf"ansible_collections.{NAMESPACE}.{NAME}.plugins.module_utils.\1", path.read_text()
            )
            text = fragment_list.sub(lambda line: fragment_name.sub(rf"{NAMESPACE}.{NAME}.\1", line[0]), text)
            out.write_text(text)
    (root / "galaxy.yml").write_text(
        f"namespace: {NAMESPACE}\nname: {NAME}\nversion: 0.1.0\nreadme: README.md\nauthors: [gemma-rig]\n"
    )
    (root / "README.md").write_text("A copy of gemma-rig's modules for ansible-test.\n")
    core = subprocess.run(
        [str(VENV_BIN / "python"), "-c", "import ansible; print(ansible.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    sanity = root / "tests" / "sanity"
    sanity.mkdir(parents=True)
    shutil.copy(IGNORE, sanity / f"ignore-{'.'.join(core.split('.')[:2])}.txt")
    return root


def pip_bootstrap_version() -> str:
    """The pip version ansible-test bootstraps into its virtualenvs."""
    from ansible_test._internal import python_requirements

    source = Path(python_requirements.__file__).read_text()
    found = re.search(r"default_packages = dict\(\s*pip='([^']+)'", source)
    assert found, "ansible-test no longer names its pip version where this test looks for it"
    return found[1]


def ensure_pip_bootstrap() -> None:
    """Put the get-pip stand-in (and the pip wheel it installs) in ansible-test's cache."""
    version = pip_bootstrap_version()
    cache = Path.home() / ".ansible" / "test" / "cache"
    script = cache / f"get_pip_{version.replace('.', '_')}.py"
    if script.exists():
        return
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(VENV_BIN / "pip"), "download", "-q", "--no-deps", "-d", str(cache), f"pip=={version}"],
        check=True,
    )
    wheel = next(cache.glob(f"pip-{version}-*.whl"))
    script.write_text(GET_PIP_STANDIN.format(version=version, wheel=wheel.name))


def run_sanity(root: Path) -> subprocess.CompletedProcess[str]:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    tests = [arg for test in TESTS for arg in ("--test", test)]
    return subprocess.run(
        [str(VENV_BIN / "ansible-test"), "sanity", *tests, "--python", python, "--color", "no"],
        cwd=root, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_ignore_file_says_why() -> None:
    """Each waiver names a path and a check, and gives its reason after '#'."""
    for line in IGNORE.read_text().splitlines():
        entry, _, why = line.partition(" # ")
        assert re.fullmatch(r"plugins/\S+\.py [a-z-]+:[a-z0-9-]+", entry), line
        assert len(why.split()) >= 4, f"no reason given: {line}"


def test_tree_imports_only_the_collections_module_utils(tmp_path: Path) -> None:
    """No copied plugin still imports our module_utils under the project-level name."""
    root = build_tree(tmp_path)
    texts = [p.read_text() for p in (root / "plugins").rglob("*.py")]
    assert any(f"ansible_collections.{NAMESPACE}.{NAME}.plugins.module_utils." in t for t in texts)
    assert not any(re.search(r"ansible\.module_utils\.(gce_|turing_clamp)", t) for t in texts)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ansible_test_sanity_is_clean(tmp_path: Path) -> None:
    ensure_pip_bootstrap()
    result = run_sanity(build_tree(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    for test in TESTS:
        assert re.search(rf'Running sanity test "{test}"', output), f"{test} did not run:\n{output[-3000:]}"
    assert "Skipping" not in output, output[-3000:]
