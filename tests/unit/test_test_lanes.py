"""The suite's lanes (tests/conftest.py): two pytest-xdist workers, each group whole on one.

scripts/test.sh runs two workers with `--dist loadgroup`, which the project's scheduler answers:
`lane_of` names each test's group (the e2e, the molecule scenarios, the controller's vLLM servers,
the session's tiny builds, else the test's file), and each worker's collection puts the e2e first
and the molecule scenarios last. These tests run that collection on real test files in a child
pytest that says it is a worker, and a real two-worker run, and read where each test went.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys

from tests.conftest import ROOT, VENV_BIN, lane_of

RECORDER = """
import json, sys, pytest

class Recorder:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        print("LANES " + json.dumps([i.nodeid for i in items]))

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[Recorder()]))
"""

FILES = (
    "tests/unit/test_rigctl.py",
    "tests/test_molecule_config.py",
    "tests/e2e/test_00_site.py",
    "tests/repack/test_routes.py",
    "tests/e2e/test_05_rig_contract.py",
    "tests/unit/test_rig_flags.py",
)


@functools.cache
def collected(worker: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    if worker:
        env["PYTEST_XDIST_WORKER"] = worker
    run = subprocess.run(
        [sys.executable, "-c", RECORDER, *FILES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("LANES "))
    return json.loads(line.removeprefix("LANES "))


def test_a_worker_takes_the_e2e_first_in_name_order_and_molecule_last() -> None:
    files = [nodeid.split("::")[0] for nodeid in collected("gw0")]
    kinds = [
        "e2e" if f.startswith("tests/e2e/") else "molecule" if "molecule" in f else "rest" for f in files
    ]
    assert kinds == sorted(kinds, key=["e2e", "rest", "molecule"].index), files
    e2e = [f for f in files if f.startswith("tests/e2e/")]
    assert e2e == sorted(e2e) and set(e2e) == {
        "tests/e2e/test_00_site.py",
        "tests/e2e/test_05_rig_contract.py",
    }
    rest = list(dict.fromkeys(f for f, k in zip(files, kinds, strict=True) if k == "rest"))
    assert rest == [f for f in FILES if not f.startswith("tests/e2e/") and "molecule" not in f]


def test_outside_a_worker_the_order_is_the_collections() -> None:
    files = list(dict.fromkeys(nodeid.split("::")[0] for nodeid in collected(None)))
    assert files == list(FILES)


def test_the_groups() -> None:
    groups = {lane_of(nodeid) for nodeid in collected("gw0")}
    assert groups == {"e2e", "molecule", "repack", "unit/test_rigctl.py", "unit/test_rig_flags.py"}
    assert lane_of("tests/controller/test_bench.py::test_x") == lane_of(
        "tests/controller/test_accuracy.py::t"
    )
    assert lane_of("tests/test_gce_playbooks.py::test_x[a]") == "test_gce_playbooks.py"


def test_two_workers_each_take_whole_groups() -> None:
    """What xdist's own loadgroup did not do here (see tests/conftest.py): a file split across both.
    Two files of quick tests: what is checked is where each test ran."""
    run = subprocess.run(
        [
            str(VENV_BIN / "pytest"), "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
            "--no-loadscope-reorder", "-v", "tests/unit/test_turing_clamp.py", "tests/unit/test_rig_flags.py",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:]
    ran = re.findall(r"^\[(gw\d)\] \[ *\d+%\] PASSED (\S+?)::", run.stdout, re.MULTILINE)
    assert len(ran) > 10, run.stdout[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, path in ran:
        workers.setdefault(path, set()).add(worker)
    assert set(workers) == {"tests/unit/test_turing_clamp.py", "tests/unit/test_rig_flags.py"}
    assert all(len(w) == 1 for w in workers.values()), workers
