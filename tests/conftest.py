"""Shared pytest set-up: repository paths and the environment every test runs in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# torch before anything imports ansible: ansible-core's module_utils patch sys.intern when they
# are imported, and torch._dynamo (which vLLM imports) then refuses it at its own import
# ("substitute_in_graph expects a function"). Collection order decides which comes first, so
# `pytest tests/unit` alone failed to collect; importing torch._dynamo here fixes the order.
import torch._dynamo  # noqa: F401  # isort: skip

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = ROOT / ".venv" / "bin"

# Ansible and podman read these; set them once so every subprocess a test starts agrees.
os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "files" / "containers.conf"))
os.environ["PATH"] = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root."""
    return ROOT


@pytest.fixture
def figure(capsys: pytest.CaptureFixture[str]):
    """Print a measured figure straight to the terminal, so every run's output shows it."""

    def _print(label: str, value: str) -> None:
        with capsys.disabled():
            print(f"\n[figure] {label}: {value}", flush=True)

    return _print


# Every skip a run may show, with the reason it is allowed. Any other skip fails the run: a green
# run must not hide a claim that was never checked (a missing file, a tool not installed).
ALLOWED_SKIPS: dict[str, str] = {
    "this machine has an NVIDIA GPU: the role would install a driver": (
        "tests/unit/test_nvidia_driver.py proves the no-GPU path; on a GPU host it would install a driver"
    ),
}


def _skip_reason(report: pytest.TestReport) -> str:
    """The text after 'Skipped: ' in a skipped report's longrepr tuple (path, line, message)."""
    message = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return message.removeprefix("Skipped: ")


def _unexpected_skips(config: pytest.Config) -> list[str]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    return [f"{r.nodeid}: {_skip_reason(r)}" for r in skipped if _skip_reason(r) not in ALLOWED_SKIPS]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the selected molecule scenarios now, in the background (tests/molecule_run.py)."""
    names = [m.args[0] for item in session.items for m in item.iter_markers("molecule") if m.args]
    if names and not session.config.option.collectonly and os.environ.get("RIG_MOLECULE_EARLY") != "0":
        from tests.molecule_run import start_early

        e2e = any(item.path.parent.name == "e2e" for item in session.items)
        start_early(list(dict.fromkeys(names)), now=not e2e)  # with e2e: after its cold site.yml


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the run on a skip that ALLOWED_SKIPS does not list; stop a molecule run still going."""
    from tests.molecule_run import stop_early

    stop_early()
    if _unexpected_skips(session.config) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config) -> None:
    """Name each unexpected skip, so a red run says why."""
    unexpected = _unexpected_skips(config)
    if unexpected:
        terminalreporter.write_line("unexpected skips (not in tests/conftest.py ALLOWED_SKIPS):", red=True)
        for line in unexpected:
            terminalreporter.write_line(f"  {line}", red=True)
