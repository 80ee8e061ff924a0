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
os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "roles/local_rig/files/containers.conf"))
os.environ["PATH"] = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root."""
    return ROOT


# Under pytest-xdist (scripts/test.sh runs two lanes) a test runs in a worker process, whose output
# never reaches the terminal: each figure also travels with the test's report (user_properties), and
# the run's summary lists them all.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_FIGURES: list[str] = []


@pytest.fixture
def figure(capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest):
    """Print a measured figure straight to the terminal, so every run's output shows it; the
    summary lists every figure of the run again."""

    def _print(label: str, value: str) -> None:
        request.node.user_properties.append(("figure", f"{label}: {value}"))
        if not WORKER:
            with capsys.disabled():
                print(f"\n[figure] {label}: {value}", flush=True)

    return _print


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the figures of each test, from this process or a worker's."""
    if report.when == "call":
        _FIGURES.extend(
            f"{report.nodeid}: {value}" for key, value in report.user_properties if key == "figure"
        )


# --- lanes (pytest-xdist) ---------------------------------------------------------------------------
# scripts/test.sh runs the suite in two worker processes. One takes the e2e tests, which share one
# rig and run in name order; the other takes everything else, the molecule scenarios last, so that
# they do not download and install while the e2e's cold site.yml does. Tests that share an expensive
# fixture (a package's vLLM servers, the session's tiny builds, a module's fixtures) stay together.
# The lanes are the project's own scheduler, not xdist_group marks: xdist 3.8 names a mark's group in
# the node id (`item._nodeid`), which pytest 9.2 no longer reads, so with it every test ran alone.
LANE_RANK = {"e2e": 0, "molecule": 2}  # the rest: 1, between them, in collection order


def lane_of(nodeid: str) -> str:
    """The group a test runs in, from its node id: one worker takes a whole group."""
    path = nodeid.split("::")[0].removeprefix("tests/")
    top = path.split("/")[0]
    if top in ("e2e", "controller", "repack"):
        return top
    if top.startswith("test_molecule_"):
        return "molecule"
    return path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker: the e2e tests first, the molecule scenarios last (a stable sort)."""
    if WORKER:
        items.sort(key=lambda item: LANE_RANK.get(lane_of(item.nodeid), 1))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's (-p no:xdist runs without it)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadgroup` with the project's lanes: each group goes to one worker, whole, in order."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane_of(nodeid)

    return Lanes(config, log)


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
    # In a worker the molecule tests are a lane's last group (above), each running its own scenario.
    early = os.environ.get("RIG_MOLECULE_EARLY") != "0" and not WORKER
    if names and not session.config.option.collectonly and early:
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
    """List the run's figures; name each unexpected skip, so a red run says why."""
    if _FIGURES:
        terminalreporter.section("figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)
    unexpected = _unexpected_skips(config)
    if unexpected:
        terminalreporter.write_line("unexpected skips (not in tests/conftest.py ALLOWED_SKIPS):", red=True)
        for line in unexpected:
            terminalreporter.write_line(f"  {line}", red=True)
