"""The fake Compute API's podman backing (tests/fake_compute/podman.py), with a fake podman on PATH.

``python -m tests.fake_compute --podman INSTANCE=CONTAINER`` serves an instance whose status
follows the container and whose start and stop run podman: checked over HTTP against the served
fake, with a podman stand-in that records its calls and keeps the container's state in a file.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT
from tests.fake_compute.podman import PodmanBacking, parse_pairs

FAKE_PODMAN = """#!/bin/sh
# podman stand-in: records each call; a container runs while $STATE/<name> exists.
echo "$*" >> "$STATE/calls"
case "$1" in
  inspect) [ -d "$STATE/known" ] || exit 125; [ -e "$STATE/$5" ] && echo true || echo false ;;
  start) [ "$3" = broken ] && { echo "no such container" >&2; exit 125; }; touch "$STATE/$3" ;;
  stop) rm -f "$STATE/$3" ;;
esac
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def podman(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "podman"
    script.write_text(FAKE_PODMAN)
    script.chmod(0o755)
    (tmp_path / "known").mkdir()
    return tmp_path


@pytest.fixture
def served(podman: Path) -> Iterator[str]:
    """The fake served as the local platform runs it: two backed instances, a permissions table."""
    table = podman / "permissions.json"
    table.write_text(json.dumps({"tok": ["compute.instances.get", "compute.instances.start",
                                         "compute.instances.stop", "compute.zoneOperations.get"]}))  # fmt: skip
    port = free_port()
    env = {**os.environ, "PATH": f"{podman / 'bin'}:{os.environ['PATH']}", "STATE": str(podman)}
    cmd = [sys.executable, "-m", "tests.fake_compute", "--port", str(port), "--op-delay", "0",
           "--permissions", str(table), "--podman", "rig-1=ctr-1", "--podman", "rig-2=broken"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert "fake Compute API on" in (proc.stdout.readline() if proc.stdout else "")
        yield f"http://127.0.0.1:{port}/compute/v1/projects/local/zones/local-a/instances"
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def run(client: httpx.Client, url: str, verb: str) -> dict:
    op = client.post(f"{url}/{verb}").json()
    base = url.rsplit("/instances/", 1)[0]
    for _ in range(100):
        if op.get("status") == "DONE":
            return op
        time.sleep(0.02)
        op = client.get(f"{base}/operations/{op['name']}").json()
    raise AssertionError(op)


def test_the_instance_follows_its_container_and_start_stop_run_podman(served: str, podman: Path) -> None:
    with httpx.Client(headers={"Authorization": "Bearer tok"}, timeout=10) as client:
        assert client.get(f"{served}/rig-1").json()["status"] == "TERMINATED"
        assert "error" not in run(client, f"{served}/rig-1", "start")
        assert (podman / "ctr-1").exists()
        assert client.get(f"{served}/rig-1").json()["status"] == "RUNNING"
        (podman / "ctr-1").unlink()  # stopped behind the API's back (the rig's idle stop)
        assert client.get(f"{served}/rig-1").json()["status"] == "TERMINATED"
        assert "error" not in run(client, f"{served}/rig-1", "start")
        assert "error" not in run(client, f"{served}/rig-1", "stop")
        assert not (podman / "ctr-1").exists()
        # A container podman cannot start: the operation ends in an error, the instance stays stopped.
        op = run(client, f"{served}/rig-2", "start")
        assert "no such container" in op["error"]["errors"][0]["message"]
        assert client.get(f"{served}/rig-2").json()["status"] == "TERMINATED"
        assert client.get(f"{served}/rig-1", headers={"Authorization": "Bearer nope"}).status_code == 401
    calls = (podman / "calls").read_text().splitlines()
    assert "start -- ctr-1" in calls and "stop -- ctr-1" in calls and "start -- broken" in calls


def test_a_missing_container_is_not_running(podman: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (podman / "known").rmdir()  # podman inspect fails: no such container
    monkeypatch.setenv("STATE", str(podman))
    assert PodmanBacking("ctr-9", podman=str(podman / "bin" / "podman")).running() is False


@pytest.mark.parametrize("pair", ["rig-1", "=ctr", "rig-1=", ""])
def test_a_malformed_podman_pair_is_refused(pair: str) -> None:
    with pytest.raises(ValueError, match="INSTANCE=CONTAINER"):
        parse_pairs([pair])


@pytest.mark.parametrize("container", ["--rm", "-a", ""])
def test_a_container_name_podman_would_read_as_an_option_is_refused(container: str) -> None:
    with pytest.raises(ValueError, match="not a container name"):
        PodmanBacking(container)
