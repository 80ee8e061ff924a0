"""The bench client's pure logic, and its HTTP handling against a minimal SSE server in a thread.

The stub server only speaks the wire format (it is not what is measured); the client runs against
real vLLM in tests/controller/test_bench.py.
"""

from __future__ import annotations

import json
import random
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "roles" / "bench" / "files"))
import bench  # the role's client, copied to the rig as a plain file


def test_feasibility_names_the_limit() -> None:
    limits = {"max_model_len": 4096, "max_num_seqs": 8}
    assert bench.feasibility(512, 128, 8, limits) is None
    assert "max-model-len 4096" in bench.feasibility(4096, 128, 1, limits)
    assert "max-num-seqs 8" in bench.feasibility(512, 128, 16, limits)
    assert bench.feasibility(10**6, 128, 99, {}) is None  # unknown limits: try it


def test_random_prompts_exact_length_and_range() -> None:
    prompts = bench.random_prompts(random.Random(1), 5, 300, 50)
    assert [len(p) for p in prompts] == [300] * 5
    assert min(min(p) for p in prompts) >= 10 and max(max(p) for p in prompts) < 50
    assert prompts == bench.random_prompts(random.Random(1), 5, 300, 50)


def test_summarize_median_and_spread() -> None:
    reps = [{"x": 3.0}, {"x": 1.0}, {"x": 2.0}]
    med, spread = bench.summarize(reps, ("x",))
    assert med == {"x": 2.0} and spread == {"x": {"min": 1.0, "max": 3.0}}


def test_percentile() -> None:
    assert bench._pct([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert bench._pct([1.0, 2.0], 100) == 2.0


class _Stub(BaseHTTPRequestHandler):
    fail_after = 10**9
    served = 0
    chats: ClassVar[list[dict]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "stub", "max_model_len": 1024}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).served += 1
        if self.path == "/v1/chat/completions":
            self._tool_call(req)
            return
        if type(self).served > type(self).fail_after:
            self.send_response(500)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"oops")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(req["max_tokens"]):
            self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
        usage = {"prompt_tokens": len(req["prompt"]), "completion_tokens": req["max_tokens"]}
        self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())

    def _tool_call(self, req: dict) -> None:
        """A call of the first tool offered, streamed in pieces as vLLM's parser streams it."""
        type(self).chats.append(req)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        name = req["tools"][0]["function"]["name"]
        parts = [{"index": 0, "id": "c1", "type": "function", "function": {"name": name, "arguments": ""}},
                 {"index": 0, "function": {"arguments": '{"country": '}},
                 {"index": 0, "function": {"arguments": '"France"}'}}]  # fmt: skip
        for part in parts:
            self.wfile.write(
                f"data: {json.dumps({'choices': [{'delta': {'tool_calls': [part]}}]})}\n\n".encode()
            )
        usage = {"prompt_tokens": 20, "completion_tokens": 12}
        self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())


@pytest.fixture()
def stub() -> Iterator[str]:
    _Stub.served, _Stub.fail_after, _Stub.chats = 0, 10**9, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_cell_counts_tokens_and_records_failure(stub: str) -> None:
    kw = {"output_len": 5, "repeats": 2, "limits": {"max_model_len": 1024}, "vocab_size": 100, "seed": 0,
          "timeout": 10}  # fmt: skip
    cell = bench.run_cell(stub, "stub", 20, 2, **kw)
    assert cell["status"] == "ok" and cell["num_prompts"] == 8 and len(cell["repeats"]) == 2
    assert cell["repeats"][0]["output_tokens"] == 40 and cell["repeats"][0]["input_tokens"] == 160
    _Stub.fail_after = _Stub.served + 3
    cell = bench.run_cell(stub, "stub", 20, 2, **kw)
    assert cell["status"] == "failed" and "HTTP 500" in cell["reason"]
    assert cell["repeats"] == [] and cell["median"] is None
    cell = bench.run_cell(stub, "stub", 2000, 2, **kw)
    assert cell["status"] == "infeasible" and cell["repeats"] == []


def test_cli_writes_every_cell_and_progress(stub: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "b.json"
    rc = bench.main(
        ["--url", stub, "--input-lens", "8,2000", "--concurrency", "1,4", "--output-len", "3", "--repeats", "1",
         "--decode-runs", "3", "--decode-output-len", "4", "--decode-input-len", "8", "--max-num-seqs", "2",
         "--vocab-size", "100", "--prefix-caching", "off", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    rec = json.loads(out.read_text())
    assert [(c["input_len"], c["concurrency"], c["status"]) for c in rec["cells"]] == [
        (8, 1, "ok"), (8, 4, "infeasible"), (2000, 1, "infeasible"), (2000, 4, "infeasible"),
    ]  # fmt: skip
    assert rec["server"] == {"max_model_len": 1024, "max_num_seqs": 2, "prefix_caching": False}
    assert rec["decode"]["status"] == "ok" and len(rec["decode"]["runs"]) == 3
    err = capsys.readouterr().err
    assert "cell 1/4" in err and "cell 4/4" in err and "decode" in err


def test_cli_needs_vocab_and_a_server(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path / "x.json")])
    assert "required: --url" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--url", "http://127.0.0.1:9", "--out", str(tmp_path / "x.json")])
    assert "vocabulary size" in capsys.readouterr().err
    rc = bench.main(["--url", "http://127.0.0.1:9", "--vocab-size", "100", "--out", str(tmp_path / "x.json")])
    assert rc == 1 and "cannot reach" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_vocab_from_model_dir(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 262144}}))
    assert bench.vocab_from_model_dir(tmp_path) == 262144
    assert bench.vocab_from_model_dir(tmp_path / "nope") is None


TOOLS = [{"type": "function", "function": {"name": "get_capital", "parameters": {"type": "object"}}}]


def test_tool_workload_reassembles_the_streamed_call_and_fits_the_run_schema(
    stub: str, tmp_path: Path
) -> None:
    """--tool-runs beside the decode check: each run's call put together from the stream's pieces,
    the prompt and tools sent as given, and the record a valid run.json's bench.tools."""
    from evidence.report import build_run, validate

    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps(TOOLS))
    out = tmp_path / "b.json"
    prompt = "-{{ x }} $(y) What is the capital of France?"
    rc = bench.main(
        ["--url", stub, "--no-sweep", "--decode-runs", "2", "--decode-output-len", "3", "--decode-input-len", "8",
         "--tool-runs", "3", "--tools-file", str(tools_file), f"--tool-prompt={prompt}", "--vocab-size", "100",
         "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    rec = json.loads(out.read_text())
    tools = rec["tools"]
    assert (tools["status"], tools["with_tool_call"], len(tools["runs"])) == ("ok", 3, 3)
    assert tools["runs"][0]["tool_calls"] == [{"name": "get_capital", "arguments": '{"country": "France"}'}]
    assert tools["latency_ms"] > 0 and tools["runs"][0]["output_tokens"] == 12
    assert [(c["messages"][0]["content"], c["tools"]) for c in _Stub.chats] == [(prompt, TOOLS)] * 3
    run = build_run({"run_id": "tools", "date": "2026-12-03", "hardware": {"platform": "controller",
                     "accelerator": "CPU"}, "model": {"key": "stub"}}, rec, None)  # fmt: skip
    validate(run)
    assert run["bench"]["tools"] == tools


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--tool-runs", "1"], "--tool-runs needs at least 2 runs, --tools-file and --tool-prompt"),
        (["--tool-runs", "2", "--tool-prompt", "hi"], "--tool-runs needs at least 2 runs"),
        (["--tool-runs", "2", "--tool-prompt", "hi", "--tools-file", "{dir}/bad.json"], "--tools-file: want"),
    ],
)
def test_tool_workload_arguments_are_checked(tmp_path: Path, capsys, argv: list[str], words: str) -> None:
    (tmp_path / "bad.json").write_text('{"not": "a list"}')
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit):
        bench.main(
            ["--url", "http://127.0.0.1:9", "--vocab-size", "100", "--out", str(tmp_path / "o"), *argv]
        )
    assert words in capsys.readouterr().err
