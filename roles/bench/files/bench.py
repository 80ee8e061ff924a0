"""Serving benchmark against an OpenAI-compatible vLLM endpoint (standard library only).

It measures what ``vllm bench serve --dataset-name random --random-input-len I --random-output-len O
--ignore-eos --temperature 0`` measures: output and total token throughput, request throughput,
time to first token (TTFT), time per output token (TPOT), per cell of input length x concurrency,
``num_prompts = max(8, 4c)``. Prompts are random token ids sent as a token-id prompt to
``/v1/completions``, so each request carries exactly I input tokens with no tokenizer here.

Why not ``vllm bench serve`` itself: the CPU build's ``vllm`` command needs package metadata it
does not ship, and this file has to run with any rig's ``python3`` (the bench role copies it
there). One client on both platforms keeps the numbers comparable; every record
names the method.

Beside them, on request (``--tool-runs``), a tool-calling workload: streamed chat completions
offering tools, each run's tool call put together from the stream, and how many runs made one.

A cell that cannot run is recorded, not dropped: ``infeasible`` when it asks for more sequences
than the server's ``--max-num-seqs`` or more tokens than ``--max-model-len``, ``failed`` when the
requests error (out of memory, server gone).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

METHOD = "bench.yml client (own streaming client, /v1/completions with random token-id prompts)"


class BenchError(RuntimeError):
    """A request failed; the message says how."""


# Headers every request sends: the bearer token, when --api-key-env-file names a file holding one.
AUTH_HEADERS: dict[str, str] = {}


def api_key_from_env_file(path: Path) -> str:
    """VLLM_API_KEY from a systemd EnvironmentFile such as the rig's tpu.env ("" when absent).

    Read from the file rather than taken as an argument or from the environment that Ansible sets:
    both would put the key into a command line that `ps` shows.
    """
    for line in path.read_text().splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key.strip() == "VLLM_API_KEY":
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
            return value
    return ""


def _conn(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    u = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    return cls(u.hostname or "127.0.0.1", u.port, timeout=timeout), u.path.rstrip("/")


def get_json(url: str, path: str, timeout: float = 30.0) -> Any:
    """GET ``url + path`` and decode the JSON body."""
    conn, base = _conn(url, timeout)
    try:
        conn.request("GET", base + path, headers=AUTH_HEADERS)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise BenchError(f"GET {path}: HTTP {resp.status}: {body[:200]!r}")
        return json.loads(body)
    finally:
        conn.close()


def discover(url: str) -> dict[str, Any]:
    """The served model's name and max_model_len from /v1/models."""
    data = get_json(url, "/v1/models")["data"]
    if not data:
        raise BenchError("/v1/models lists no model")
    return {"model": data[0]["id"], "max_model_len": data[0].get("max_model_len")}


def stream_chunks(url: str, path: str, payload: dict, timeout: float) -> Iterator[dict]:
    """POST ``payload`` to ``url + path`` and yield each server-sent event's JSON until [DONE];
    an HTTP error, an error event or a broken connection raises BenchError."""
    conn, base = _conn(url, timeout)
    try:
        conn.request(
            "POST", base + path, json.dumps(payload), {"Content-Type": "application/json", **AUTH_HEADERS}
        )
        resp = conn.getresponse()
        if resp.status != 200:
            raise BenchError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise BenchError(f"stream error: {chunk['error']}")
            yield chunk
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise BenchError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()


def one_request(url: str, model: str, prompt: list[int], output_len: int, timeout: float) -> dict[str, float]:
    """Stream one completion; return latency, TTFT and token counts (times in seconds)."""
    payload = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        # Special and unused tokens would stream as empty text and hide when the first token came.
        "skip_special_tokens": False,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft = None
    usage: dict[str, int] = {}
    for chunk in stream_chunks(url, "/v1/completions", payload, timeout):
        if ttft is None and any(c.get("text") is not None for c in chunk.get("choices") or []):
            ttft = time.perf_counter() - start
        if chunk.get("usage"):
            usage = chunk["usage"]
    latency = time.perf_counter() - start
    out = int(usage.get("completion_tokens", 0))
    if out == 0 or ttft is None:
        raise BenchError("no tokens streamed")
    return {
        "latency_s": latency,
        "ttft_s": ttft,
        "output_tokens": out,
        "input_tokens": int(usage.get("prompt_tokens", len(prompt))),
        "tpot_s": (latency - ttft) / (out - 1) if out > 1 else 0.0,
    }


def run_batch(
    url: str, model: str, prompts: list[list[int]], output_len: int, concurrency: int, timeout: float
) -> dict[str, float]:
    """Send ``prompts`` with at most ``concurrency`` in flight; return the repeat's figures."""
    results: list[dict[str, float]] = []
    lock = threading.Lock()

    def work(p: list[int]) -> None:
        r = one_request(url, model, p, output_len, timeout)
        with lock:
            results.append(r)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for fut in [pool.submit(work, p) for p in prompts]:
            fut.result()  # the first error ends the repeat as failed
    duration = time.perf_counter() - start
    out = sum(r["output_tokens"] for r in results)
    inp = sum(r["input_tokens"] for r in results)
    return {
        "duration_s": duration,
        "completed": len(results),
        "output_tok_s": out / duration,
        "total_tok_s": (out + inp) / duration,
        "request_per_s": len(results) / duration,
        "ttft_ms": statistics.median(r["ttft_s"] for r in results) * 1000,
        "ttft_ms_p99": _pct([r["ttft_s"] for r in results], 99) * 1000,
        "tpot_ms": statistics.median(r["tpot_s"] for r in results) * 1000,
        "output_tokens": out,
        "input_tokens": inp,
    }


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def random_prompts(rng: random.Random, n: int, input_len: int, vocab_size: int) -> list[list[int]]:
    """``n`` prompts of exactly ``input_len`` random token ids (ids below 10 are specials; skip them)."""
    return [[rng.randrange(10, vocab_size) for _ in range(input_len)] for _ in range(n)]


def summarize(repeats: list[dict[str, float]], keys: tuple[str, ...]) -> tuple[dict, dict]:
    """Median and min/max spread of each key over the repeats."""
    median = {k: statistics.median(r[k] for r in repeats) for k in keys}
    spread = {k: {"min": min(r[k] for r in repeats), "max": max(r[k] for r in repeats)} for k in keys}
    return median, spread


SWEEP_KEYS = ("output_tok_s", "total_tok_s", "request_per_s", "ttft_ms", "tpot_ms")


def feasibility(input_len: int, output_len: int, concurrency: int, limits: dict[str, Any]) -> str | None:
    """Why this cell cannot run on this server, or None when it can."""
    mml, seqs = limits.get("max_model_len"), limits.get("max_num_seqs")
    if mml is not None and input_len + output_len > mml:
        return f"input {input_len} + output {output_len} tokens exceed max-model-len {mml}"
    if seqs is not None and concurrency > seqs:
        return f"concurrency {concurrency} exceeds max-num-seqs {seqs}"
    return None


def run_cell(
    url: str,
    model: str,
    input_len: int,
    concurrency: int,
    *,
    output_len: int,
    repeats: int,
    limits: dict[str, Any],
    vocab_size: int,
    seed: int,
    timeout: float,
    progress: Any = None,
) -> dict[str, Any]:
    """One sweep cell: ``repeats`` batches of ``max(8, 4c)`` prompts, or the reason it could not run."""
    num_prompts = max(8, 4 * concurrency)
    cell: dict[str, Any] = {
        "input_len": input_len,
        "output_len": output_len,
        "concurrency": concurrency,
        "num_prompts": num_prompts,
        "status": "ok",
        "reason": None,
        "repeats": [],
        "median": None,
        "spread": None,
    }
    why = feasibility(input_len, output_len, concurrency, limits)
    if why:
        cell.update(status="infeasible", reason=why)
        return cell
    # A fresh seed per repeat: with the prefix cache on, repeats of the same prompts would hit it.
    for rep in range(repeats):
        rng = random.Random(seed * 1_000_003 + input_len * 101 + concurrency * 7 + rep)
        prompts = random_prompts(rng, num_prompts, input_len, vocab_size)
        try:
            figures = run_batch(url, model, prompts, output_len, concurrency, timeout)
        except BenchError as exc:
            cell.update(status="failed", reason=f"repeat {rep + 1}: {exc}")
            break
        cell["repeats"].append(figures)
        if progress:
            progress(
                f"in={input_len} c={concurrency} repeat {rep + 1}/{repeats}: {figures['output_tok_s']:.1f} tok/s"
            )
    if cell["repeats"]:
        cell["median"], cell["spread"] = summarize(cell["repeats"], SWEEP_KEYS)
    return cell


def run_decode(
    url: str,
    model: str,
    *,
    input_len: int,
    output_len: int,
    runs: int,
    vocab_size: int,
    seed: int,
    timeout: float,
) -> dict[str, Any]:
    """Single-stream decode: ``runs`` requests one after another; the headline is the median of runs 2..N."""
    rec: dict[str, Any] = {
        "input_len": input_len,
        "output_len": output_len,
        "runs": [],
        "status": "ok",
        "reason": None,
        "output_tok_s": None,
        "decode_tok_s": None,
        "ttft_ms": None,
    }
    rng = random.Random(seed)
    for i in range(runs):
        prompt = random_prompts(rng, 1, input_len, vocab_size)[0]
        try:
            r = one_request(url, model, prompt, output_len, timeout)
        except BenchError as exc:
            rec.update(status="failed", reason=f"run {i + 1}: {exc}")
            break
        rec["runs"].append(
            {
                "output_tok_s": r["output_tokens"] / r["latency_s"],
                "decode_tok_s": (r["output_tokens"] - 1) / (r["latency_s"] - r["ttft_s"]),
                "ttft_ms": r["ttft_s"] * 1000,
                "output_tokens": r["output_tokens"],
            }
        )
    # Run 1 warms caches; the reference numbers are the median of runs 2-4.
    counted = rec["runs"][1:] if len(rec["runs"]) > 1 else []
    if counted:
        for k in ("output_tok_s", "decode_tok_s", "ttft_ms"):
            rec[k] = statistics.median(r[k] for r in counted)
    elif rec["status"] == "ok":
        rec.update(status="failed", reason="fewer than 2 runs completed")
    return rec


def one_tool_request(
    url: str, model: str, prompt: str, tools: list[dict], output_len: int, timeout: float
) -> dict:
    """Stream one chat completion that offers ``tools``; return its times, token counts and the
    tool calls reassembled from the stream's deltas (name and arguments text, as the server parsed them)."""
    payload = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "tools": tools,
        "max_tokens": output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft = None
    usage: dict[str, int] = {}
    calls: dict[int, dict[str, str]] = {}
    for chunk in stream_chunks(url, "/v1/chat/completions", payload, timeout):
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if ttft is None and any(delta.get(k) for k in ("content", "reasoning", "tool_calls")):
                ttft = time.perf_counter() - start
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(int(part.get("index") or 0), {"name": "", "arguments": ""})
                function = part.get("function") or {}
                call["name"] += function.get("name") or ""
                call["arguments"] += function.get("arguments") or ""
        if chunk.get("usage"):
            usage = chunk["usage"]
    if ttft is None:
        raise BenchError("nothing streamed")
    return {
        "latency_ms": (time.perf_counter() - start) * 1000,
        "ttft_ms": ttft * 1000,
        "output_tokens": int(usage.get("completion_tokens", 0)),
        "tool_calls": [calls[i] for i in sorted(calls)],
    }


def run_tools(
    url: str, model: str, *, prompt: str, tools: list[dict], runs: int, output_len: int, timeout: float
) -> dict[str, Any]:
    """The tool-calling workload: ``runs`` chat requests one after another, each offering ``tools``;
    the headline is the median of runs 2..N and how many runs answered with a tool call."""
    rec: dict[str, Any] = {"prompt": prompt, "tools": [t.get("function", {}).get("name") for t in tools],
                           "output_len": output_len, "runs": [], "status": "ok", "reason": None,
                           "with_tool_call": 0, "latency_ms": None, "ttft_ms": None}  # fmt: skip
    for i in range(runs):
        try:
            rec["runs"].append(one_tool_request(url, model, prompt, tools, output_len, timeout))
        except BenchError as exc:
            rec.update(status="failed", reason=f"run {i + 1}: {exc}")
            break
    rec["with_tool_call"] = sum(1 for r in rec["runs"] if r["tool_calls"])
    counted = rec["runs"][1:]
    if counted:
        for k in ("latency_ms", "ttft_ms"):
            rec[k] = statistics.median(r[k] for r in counted)
    elif rec["status"] == "ok":
        rec.update(status="failed", reason="fewer than 2 runs completed")
    return rec


def read_tools(path: Path) -> list[dict]:
    """--tools-file: a JSON list of OpenAI tool objects, sent as they are."""
    tools = json.loads(path.read_text())
    if not isinstance(tools, list) or not tools or not all(isinstance(t, dict) for t in tools):
        raise ValueError("want a non-empty JSON list of tool objects")
    return tools


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def vocab_from_model_dir(model_dir: Path) -> int | None:
    """vocab_size from a checkpoint's config.json (top level or text_config)."""
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        return None
    cfg = json.loads(cfg_path.read_text())
    return cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")


def main(argv: list[str] | None = None) -> int:
    """CLI: run a sweep and/or the decode check and write one JSON."""
    ap = argparse.ArgumentParser(
        prog="bench.py",
        description="Benchmark an OpenAI-compatible vLLM server the way the reference rigs were "
        "measured: input x concurrency sweep (num_prompts = max(8, 4c), ignore-eos, temperature 0, "
        "median of repeats and its spread) plus single-stream decode. Writes JSON; progress on stderr.",
    )
    ap.add_argument("--url", required=True, help="server base URL, e.g. http://HOST:PORT")
    ap.add_argument("--model", help="served model name (default: the first one /v1/models lists)")
    ap.add_argument("--input-lens", type=_ints, default=[512, 4096], help="comma list (default 512,4096)")
    ap.add_argument("--concurrency", type=_ints, default=[1, 4, 8, 16], help="comma list (default 1,4,8,16)")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-runs", type=int, default=4, help="0 skips the decode check (default 4)")
    ap.add_argument("--decode-output-len", type=int, default=256)
    ap.add_argument("--decode-input-len", type=int, default=512)
    ap.add_argument(
        "--max-num-seqs", type=int, help="the server's --max-num-seqs (cells above it are infeasible)"
    )
    ap.add_argument("--max-model-len", type=int, help="override the max_model_len /v1/models reports")
    ap.add_argument("--prefix-caching", choices=["on", "off", "unknown"], default="unknown",
                    help="the server's prefix-cache setting, recorded as given")  # fmt: skip
    ap.add_argument("--vocab-size", type=int, help="token ids are drawn below this")
    ap.add_argument("--model-dir", type=Path, help="read --vocab-size from this checkpoint's config.json")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800.0, help="per-request timeout in seconds")
    ap.add_argument("--no-sweep", action="store_true", help="only the decode check (and the tool workload)")
    ap.add_argument("--tool-runs", type=int, default=0,
                    help="the tool-calling workload: this many chat requests offering --tools-file's tools "
                    "(0 skips it, else at least 2: run 1 warms up)")  # fmt: skip
    ap.add_argument("--tools-file", type=Path, help="a JSON list of OpenAI tool objects")
    ap.add_argument("--tool-prompt", default="", help="the user message of the tool workload")
    ap.add_argument("--tool-output-len", type=int, default=64)
    ap.add_argument("--api-key-env-file", type=Path,
                    help="send VLLM_API_KEY from this EnvironmentFile (the rig's tpu.env) as a bearer token")  # fmt: skip
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    if args.api_key_env_file:
        try:
            key = api_key_from_env_file(args.api_key_env_file)
        except OSError as exc:
            ap.error(f"--api-key-env-file: {exc}")
        if key:
            AUTH_HEADERS["Authorization"] = f"Bearer {key}"

    tools: list[dict] = []
    if args.tool_runs:
        if args.tool_runs < 2 or not args.tools_file or not args.tool_prompt:
            ap.error("--tool-runs needs at least 2 runs, --tools-file and --tool-prompt")
        try:
            tools = read_tools(args.tools_file)
        except (OSError, ValueError) as exc:
            ap.error(f"--tools-file: {exc}")
    vocab = args.vocab_size or (vocab_from_model_dir(args.model_dir) if args.model_dir else None)
    if not vocab or vocab <= 10:
        ap.error("need the vocabulary size: --vocab-size N or --model-dir DIR with a config.json")
    try:
        found = discover(args.url)
    except (BenchError, OSError) as exc:
        print(f"error: cannot reach {args.url}/v1/models: {exc}", file=sys.stderr)
        return 1
    model = args.model or found["model"]
    limits = {
        "max_model_len": args.max_model_len or found["max_model_len"],
        "max_num_seqs": args.max_num_seqs,
    }

    def progress(msg: str) -> None:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)

    record: dict[str, Any] = {
        "method": METHOD,
        "url": args.url,
        "model": model,
        "server": {**limits, "prefix_caching": {"on": True, "off": False}.get(args.prefix_caching)},
        "settings": {
            "output_len": args.output_len,
            "repeats": args.repeats,
            "ignore_eos": True,
            "skip_special_tokens": False,
            "temperature": 0.0,
            "vocab_size": vocab,
            "seed": args.seed,
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cells": [],
        "decode": None,
        "tools": None,
    }
    grid = [] if args.no_sweep else [(i, c) for i in args.input_lens for c in args.concurrency]
    for n, (inp, conc) in enumerate(grid, 1):
        progress(f"cell {n}/{len(grid)}: input {inp}, concurrency {conc}")
        cell = run_cell(
            args.url, model, inp, conc, output_len=args.output_len, repeats=args.repeats, limits=limits,
            vocab_size=vocab, seed=args.seed, timeout=args.timeout, progress=progress,
        )  # fmt: skip
        if cell["status"] != "ok":
            progress(f"cell {n}/{len(grid)}: {cell['status']}: {cell['reason']}")
        record["cells"].append(cell)
    if args.decode_runs:
        progress(f"decode: {args.decode_runs} runs of {args.decode_output_len} tokens at concurrency 1")
        record["decode"] = run_decode(
            args.url, model, input_len=args.decode_input_len, output_len=args.decode_output_len,
            runs=args.decode_runs, vocab_size=vocab, seed=args.seed, timeout=args.timeout,
        )  # fmt: skip
    if args.tool_runs:
        progress(f"tools: {args.tool_runs} chat requests offering {len(tools)} tool(s) at concurrency 1")
        record["tools"] = run_tools(
            args.url, model, prompt=args.tool_prompt, tools=tools, runs=args.tool_runs,
            output_len=args.tool_output_len, timeout=args.timeout,
        )  # fmt: skip
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    progress(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
