"""The swap's silence (roles/swap/tasks/silence.yml, unsilence.yml) against a real Alertmanager.

Debian's alertmanager from build/prometheus (scripts/setup.sh) runs on a free loopback port; the
role's tasks run on a "rig" host of a local inventory and reach it as they reach a gateway's.
While a rig swaps, its alerts are silenced, matched exactly by its name; once the swap has ended
the silence is replaced by one that ends after the grace. A rig name that spells a matcher or a
regex is matched literally, an Alertmanager that does not answer never fails the swap, and a
silence id Alertmanager answers with that is not a UUID never goes back into a request.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.ansible_run import PlaybookRun, run_playbook
from tests.conftest import ROOT, VENV_BIN
from tests.prometheus_backfill import free_port, wait_ready

ALERTMANAGER = ROOT / "build" / "prometheus" / "usr" / "bin" / "prometheus-alertmanager"
AUTHOR = "gemma-rig swap.yml"
MINUTES, GRACE = 30, 120

pytestmark = [
    pytest.mark.skipif(
        not ALERTMANAGER.exists(), reason="build/prometheus has no alertmanager (scripts/setup.sh unpacks it)"
    ),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="Alertmanager runs in a mount namespace of its own: root only"
    ),
]


@contextmanager
def alertmanager(scratch: Path, deadline_s: float = 60) -> Iterator[int]:
    """Alertmanager on a free loopback port, alone (no cluster), sending nowhere; yields its port
    once /-/ready answers."""
    config = scratch / "alertmanager.yml"
    config.write_text("route:\n  receiver: none\nreceivers:\n  - name: none\n")
    port = free_port()
    log = (scratch / "alertmanager.log").open("w")
    # Debian's build reads its default template from /usr/share/prometheus/alertmanager, a path
    # compiled in: in a mount namespace of its own, /usr/share is the unpacked package's.
    share = ALERTMANAGER.parents[1] / "share"
    proc = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount --bind "$0" /usr/share && exec "$@"',
            str(share),
            str(ALERTMANAGER),
            f"--config.file={config}",
            f"--storage.path={scratch / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}", scratch / "alertmanager.log", deadline_s)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def api(port: int, path: str, body: object | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v2/{path}", data, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read() or b"null")


def when(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def local_inventory(tmp: Path, rig: str) -> Path:
    """An inventory of ``rig`` and localhost, both this machine."""
    inventory = tmp / "inventory.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python")}
    inventory.write_text(json.dumps({"all": {"hosts": {rig: local, "localhost": local}}}))
    return inventory


def swap_silence(tmp: Path, rig: str, port: int) -> PlaybookRun:
    """silence.yml, then unsilence.yml, on ``rig`` (a local host), with a pause between them in
    which the test reads Alertmanager: the play waits for a file the test writes."""
    inventory = local_inventory(tmp, rig)
    role = "ansible.builtin.include_role"
    play = [
        {
            "hosts": "all:!localhost",
            "gather_facts": False,
            "vars": {
                "swap_silence_hosts": ["localhost"],
                "monitoring_alertmanager_port": port,
                "swap_silence_minutes": MINUTES,
                "swap_silence_grace_seconds": GRACE,
                "_swap_old_model": "tiny-emb4",
                "rig_model": "tiny-w8a8",
            },
            "tasks": [
                {"name": "Begin", role: {"name": "swap", "tasks_from": "silence"}},
                {"name": "Mark", "ansible.builtin.file": {"path": str(tmp / "begun"), "state": "touch", "mode": "0644"}},
                {"name": "Pause", "ansible.builtin.wait_for": {"path": str(tmp / "go"), "timeout": 120}},
                {"name": "End", role: {"name": "swap", "tasks_from": "unsilence"}},
            ],
        }
    ]  # fmt: skip
    (tmp / "play.yml").write_text(json.dumps(play))
    return run_playbook(str(tmp / "play.yml"), inventory=inventory, timeout=300)


def run_with_pause(tmp: Path, rig: str, port: int, during) -> PlaybookRun:
    """swap_silence in a thread; ``during()`` runs once the silence has begun, then the play ends."""
    result: list[PlaybookRun] = []
    thread = threading.Thread(target=lambda: result.append(swap_silence(tmp, rig, port)))
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not (tmp / "begun").exists() and thread.is_alive():
            assert time.monotonic() < deadline, "the play never began its silence"
            time.sleep(0.1)
        if thread.is_alive():
            during()
    finally:
        (tmp / "go").touch()
        thread.join(timeout=300)
    assert result, "the play did not finish"
    return result[0]


def ours(port: int) -> list[dict]:
    return [s for s in api(port, "silences") if s["createdBy"] == AUTHOR]


def test_the_rig_is_silenced_while_it_swaps_and_for_a_grace_after(tmp_path: Path) -> None:
    seen: dict[str, list[dict]] = {}
    with alertmanager(tmp_path) as port:
        run = run_with_pause(tmp_path, "rig-local", port, lambda: seen.setdefault("during", ours(port)))
        assert run.rc == 0, run.output[-3000:]
        after = ours(port)
    (during,) = seen["during"]
    assert during["status"]["state"] == "active"
    assert during["matchers"] == [{"name": "rig", "value": "rig-local", "isRegex": False, "isEqual": True}]
    assert "tiny-emb4 -> tiny-w8a8" in during["comment"]
    # Ends by itself MINUTES after it began: a controller that dies mid-swap leaves none for good.
    assert abs(when(during["endsAt"]) - when(during["startsAt"]) - MINUTES * 60) <= 5
    # After the swap: the long one expired, one active for the grace only, for the same rig.
    state = {s["id"]: s for s in after}
    assert state[during["id"]]["status"]["state"] == "expired"
    (grace,) = [s for s in after if s["status"]["state"] == "active"]
    assert grace["matchers"] == during["matchers"]
    assert 0 < when(grace["endsAt"]) - when(grace["startsAt"]) <= GRACE + 5


# Where the Jinja name's lookup would leave its mark, were the name ever templated.
JINJA_MARKER = Path("/tmp/gemma-rig-swap-silence-jinja-ran")


@pytest.mark.parametrize(
    "rig",
    [
        ".*",
        'rig-local", rig=~".*',
        "rig-local|rig-b",
        "{{ lookup('pipe', 'touch " + str(JINJA_MARKER) + "') }}",
    ],
)
def test_a_rig_name_that_spells_a_matcher_is_matched_literally(tmp_path: Path, rig: str) -> None:
    """Alerts of other rigs stay unsilenced whatever the name being swapped spells, and a name that
    spells Jinja is silenced as written, never run."""
    JINJA_MARKER.unlink(missing_ok=True)
    verdicts: dict[str, str] = {}

    def check() -> None:
        api(
            port,
            "alerts",
            [{"labels": {"alertname": "GemmaRigDown", "rig": name}} for name in ("rig-local", "rig-b", rig)],
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            verdicts.update({a["labels"]["rig"]: a["status"]["state"] for a in api(port, "alerts")})
            if len(verdicts) == 3 and "unprocessed" not in verdicts.values():
                break
            time.sleep(0.2)

    with alertmanager(tmp_path) as port:
        run = run_with_pause(tmp_path, rig, port, check)
    assert run.rc == 0, run.output[-3000:]
    assert verdicts == {rig: "suppressed", "rig-local": "active", "rig-b": "active"}
    assert not JINJA_MARKER.exists()


def test_an_alertmanager_that_does_not_answer_never_stops_the_swap(tmp_path: Path) -> None:
    run = run_with_pause(tmp_path, "rig-local", free_port(), lambda: None)
    assert run.rc == 0, run.output[-3000:]
    said = " ".join(run.output.split())
    assert "rig-local: no silence at the Alertmanager on localhost" in said
    assert "the swap goes on" in said


LIAR_BODIES: list[dict] = []


class _Liar(BaseHTTPRequestHandler):
    """An Alertmanager stand-in whose silence id is a path, not a UUID; it records every body."""

    def do_POST(self) -> None:
        LIAR_BODIES.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        payload = json.dumps({"silenceID": "../../api/v2/silence/all"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


def test_a_silence_id_that_is_not_a_uuid_never_goes_back(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Liar)
    LIAR_BODIES.clear()
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        run = run_with_pause(tmp_path, "rig-local", server.server_address[1], lambda: None)
    finally:
        server.shutdown()
    assert run.rc == 0, run.output[-3000:]
    # The begin request only: nothing was sent with the id it answered.
    assert len(LIAR_BODIES) == 1 and "id" not in LIAR_BODIES[0], LIAR_BODIES


def test_check_mode_makes_no_silence(tmp_path: Path) -> None:
    inventory = local_inventory(tmp_path, "rig-local")
    with alertmanager(tmp_path) as port:
        play = [
            {
                "hosts": "rig-local",
                "gather_facts": False,
                "vars": {"swap_silence_hosts": ["localhost"], "monitoring_alertmanager_port": port,
                         "swap_silence_minutes": MINUTES, "_swap_old_model": "a", "rig_model": "b"},
                "tasks": [{"name": "Begin", "ansible.builtin.include_role": {"name": "swap", "tasks_from": "silence"}}],
            }
        ]  # fmt: skip
        (tmp_path / "play.yml").write_text(json.dumps(play))
        run = run_playbook(str(tmp_path / "play.yml"), "--check", inventory=inventory, timeout=300)
        assert run.rc == 0, run.output[-3000:]
        assert api(port, "silences") == []
    assert "no silence" not in run.output  # nothing failed: nothing was tried
