"""`gateway-ctl metrics`: each rig's last N minutes, read from the real Prometheus over backfilled
samples; and everything from outside treated as data: --minutes, --port and --prometheus refused
in one line, and a hostile Prometheus (crafted JSON: labels with quotes and newlines, samples of
the wrong shape, NaN, a huge answer) yields only plain rig names and numbers, with notes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests import prometheus_backfill as pb

CTL = pb.ROOT / "roles" / "gateway" / "files" / "gateway-ctl"
BAD_RIG = 'rig"x\n{evil} 1'


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CTL), "metrics", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_each_rigs_figures_come_from_prometheus(tmp_path: Path) -> None:
    pb.require_binaries()
    text = pb.fleet_openmetrics(time.time(), rigs=(*pb.RIGS, BAD_RIG))
    pb.backfill(tmp_path / "tsdb", text, tmp_path)
    with pb.prometheus(tmp_path / "tsdb", tmp_path) as url:
        done = ctl("--port", url.rsplit(":", 1)[1], "--minutes", "5")
        lines = ctl("--prometheus", url, "--text")
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert view["minutes"] == 5
    # The rig label that is not a plain name is no key: left out, with a note.
    assert list(view["rigs"]) == ["rig-a", "rig-b"]
    assert any("not a plain name" in note for note in view["notes"]), view["notes"]
    a, b = view["rigs"]["rig-a"], view["rigs"]["rig-b"]
    # The backfill's rates: rig-a 40 generation tokens/s and 1 request/s, rig-b twice that.
    assert round(a["generation_tokens_per_s"]) == 40 and round(b["generation_tokens_per_s"]) == 80
    assert round(a["prompt_tokens_per_s"]) == 100
    assert round(a["requests_per_s"], 1) == 1.0
    # 20% of TTFTs are under 0.1 s and 60% under 0.25 s: the median lies between.
    assert 0.1 < a["ttft_p50_s"] < 0.25 < a["ttft_p95_s"] <= 2.5
    assert (a["running_now"], a["waiting_now"], b["running_now"], b["waiting_now"]) == (3, 0, 6, 1)
    assert (a["kv_cache_now"], b["kv_cache_max"]) == (0.25, 0.5)
    assert a["aborted"] == 0 and b["aborted"] > 0 and b["errored"] == 0
    assert view["gateway"]["errors_5xx"] > 0 and view["gateway"]["requests"] > view["gateway"]["errors_5xx"]
    assert view["lines"][1].startswith("rig-a: 1.00 req/s, 40.0 tok/s generated")
    assert lines.returncode == 0, lines.stderr
    assert lines.stdout.splitlines()[0] == "last 15 min:"
    assert lines.stdout.splitlines()[1].startswith("rig-a: 1.00 req/s, 40.0 tok/s generated")


def test_an_empty_prometheus_has_no_rigs(tmp_path: Path) -> None:
    pb.require_binaries()
    with pb.prometheus(tmp_path / "tsdb", tmp_path) as url:
        done = ctl("--prometheus", url)
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert view["rigs"] == {} and view["gateway"] == {"requests": None, "errors_5xx": None}


@pytest.mark.parametrize(
    "minutes", ["0", "-1", str(10**9), "1; rm -rf /", "1441", "", " 5", "5.0", "0x10", "١٥"]
)
def test_minutes_out_of_bounds_is_refused_in_one_line(minutes: str) -> None:
    done = ctl("--minutes", minutes, "--port", "1")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "--minutes must be a whole number from 1 to 1440" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--prometheus", "file:///etc/passwd"],
        ["--prometheus", "gopher://127.0.0.1:9090"],
        ["--prometheus", "http://user:pw@127.0.0.1:9090"],
        ["--prometheus", "http://127.0.0.1:9090/?query=x"],
        ["--prometheus", "http:///nohost"],
        ["--port", "99999"],
        ["--port", "80; id"],
    ],
)
def test_a_bad_address_is_refused_in_one_line(args: list[str]) -> None:
    done = ctl(*args)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("gateway-ctl: --")


def test_no_prometheus_is_exit_3() -> None:
    done = ctl("--port", str(pb.free_port()))
    assert done.returncode == 3 and done.stdout == ""
    assert "did not answer" in done.stderr


@contextmanager
def crafted(answer: Callable[[str], bytes]) -> Iterator[str]:
    """A tiny HTTP server answering every query with ``answer(query string)``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answer(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def vector(result: list) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


HOSTILE_RESULT = [
    {"metric": {"rig": "good-rig"}, "value": [1, "2.5"]},
    {"metric": {"rig": 'a"b'}, "value": [1, "1"]},
    {"metric": {"rig": "line\nbreak"}, "value": [1, "1"]},
    {"metric": {"rig": "</script><b>"}, "value": [1, "1"]},
    {"metric": {"rig": "x" * 200}, "value": [1, "1"]},
    {"metric": {"rig": ["list"]}, "value": [1, "1"]},
    {"metric": {"rig": "__proto__ x"}, "value": [1, "1"]},
    {"metric": {"rig": "nan-rig"}, "value": [1, "NaN"]},
    {"metric": {"rig": "inf-rig"}, "value": [1, "+Inf"]},
    {"metric": {"rig": "word-rig"}, "value": [1, "rm -rf /"]},
    {"metric": {"rig": "num-rig"}, "value": [1, 7]},
    {"metric": "not a dict", "value": [1, "1"]},
    "not an item",
    {"value": [1, "1"]},
]


def test_a_hostile_prometheus_yields_plain_names_and_numbers_only() -> None:
    with crafted(lambda _path: vector(HOSTILE_RESULT)) as url:
        done = ctl("--prometheus", url)
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert set(view["rigs"]) == {"good-rig", "nan-rig", "inf-rig"}
    assert all(v == 2.5 for v in view["rigs"]["good-rig"].values())
    assert all(v is None for v in view["rigs"]["nan-rig"].values())
    assert all(v is None for v in view["rigs"]["inf-rig"].values())
    assert any("not a plain name" in note for note in view["notes"])
    assert any("not shaped like Prometheus's" in note for note in view["notes"])
    # No note echoes what the server sent.
    assert "rm -rf" not in done.stdout and "script" not in done.stdout and "line\\nbreak" not in done.stdout


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"status": "error", "error": "x"}',
        b'{"status": "success", "data": {"result": "scalar"}}',
        b'{"status": "success", "data": null}',
        vector([{"metric": {"rig": "r"}, "value": [1, "1"]}]) + b" " * (5 << 20),
    ],
)
def test_an_answer_that_is_not_a_vector_is_left_out(body: bytes) -> None:
    with crafted(lambda _path: body) as url:
        done = ctl("--prometheus", url)
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert view["rigs"] == {} and len(view["notes"]) == 14, view["notes"]
