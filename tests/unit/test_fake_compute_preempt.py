"""A preemption on the local platform: the fake Compute API served with --podman (a podman stand-in).

The fake's control route preempts an instance as Compute Engine does: podman stops its container,
the instance is TERMINATED, and zoneOperations.list shows a `compute.instances.preempted`
operation by `system`; a container that stops by itself is the guest's poweroff.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT
from tests.unit.test_fake_compute_podman import free_port, podman, run

__all__ = ["podman"]  # the fixture, used by name

PERMISSIONS = ["compute.instances.get", "compute.instances.start", "compute.zoneOperations.get",
               "compute.zoneOperations.list"]  # fmt: skip


@pytest.fixture
def api(podman: Path) -> Iterator[str]:
    """The fake as the local platform serves it; its base URL."""
    table = podman / "permissions.json"
    table.write_text(json.dumps({"tok": PERMISSIONS, "no-list": PERMISSIONS[:3]}))
    port = free_port()
    env = {**os.environ, "PATH": f"{podman / 'bin'}:{os.environ['PATH']}", "STATE": str(podman)}
    cmd = [sys.executable, "-m", "tests.fake_compute", "--port", str(port), "--op-delay", "0",
           "--permissions", str(table), "--podman", "rig-1=ctr-1"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert "fake Compute API on" in (proc.stdout.readline() if proc.stdout else "")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_a_preemption_stops_the_container_and_is_listed_as_the_api_lists_it(api: str, podman: Path) -> None:
    zone = f"{api}/compute/v1/projects/local/zones/local-a"
    with httpx.Client(headers={"Authorization": "Bearer tok"}, timeout=10) as client:
        assert "error" not in run(client, f"{zone}/instances/rig-1", "start")
        ident = client.get(f"{zone}/instances/rig-1").json()["id"]
        preempted = httpx.post(f"{api}/fake-admin/zones/local-a/instances/rig-1/preempt")
        assert preempted.status_code == 200 and preempted.json()["status"] == "TERMINATED"
        assert not (podman / "ctr-1").exists()
        assert client.get(f"{zone}/instances/rig-1").json()["status"] == "TERMINATED"
        ops = client.get(f"{zone}/operations", params={"filter": f'targetId = "{ident}"'}).json()["items"]
        assert [op["operationType"] for op in ops] == ["start", "compute.instances.preempted"]
        event = ops[1]
        assert event["status"] == "DONE" and event["user"] == "system" and event["targetId"] == ident
        assert event["targetLink"].endswith("/projects/local/zones/local-a/instances/rig-1")
        assert event["insertTime"] <= event["endTime"] and event["progress"] == 100
        # Started again, then its container stops by itself: the guest's poweroff.
        assert "error" not in run(client, f"{zone}/instances/rig-1", "start")
        (podman / "ctr-1").unlink()
        assert client.get(f"{zone}/instances/rig-1").json()["status"] == "TERMINATED"
        ops = client.get(f"{zone}/operations", params={"filter": f'targetId = "{ident}"'}).json()["items"]
        assert ops[-1]["operationType"] == "compute.instances.guestTerminate"
        denied = client.get(f"{zone}/operations", headers={"Authorization": "Bearer no-list"})
        assert denied.status_code == 403 and "'compute.zoneOperations.list' permission" in denied.text
    calls = (podman / "calls").read_text().splitlines()
    assert calls.count("stop -- ctr-1") == 1  # the preemption's; the poweroff was the container's own
