"""Pull start-up facts out of vLLM's log (``journalctl -u vllm`` text or a plain log file).

Works on the CUDA build's lines (T4), the CPU build's and the TPU build's (vllm-tpu with
tpu-inference: device memory is HBM, reported in its own lines). Every field that no line reports
is ``None``: a missing line is never read as zero. When the text holds several starts (a journal
across restarts), only the last start counts, because that is the process now serving.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"

# Each pattern is searched anywhere in a line, so journald and `(EngineCore pid=N)` prefixes pass.
_PATTERNS: dict[str, re.Pattern[str]] = {
    "model_loading": re.compile(rf"Model loading took {_NUM} GiB memory and {_NUM} seconds"),
    "weights_loading": re.compile(rf"Loading weights took {_NUM} seconds"),
    "kv_memory_gpu": re.compile(rf"Available KV cache memory: {_NUM} GiB"),
    # CPU build: "Explicitly set (0.25/9.09) GiB for KV cache on node 0."
    "kv_memory_cpu": re.compile(rf"Explicitly set \({_NUM}/{_NUM}\) GiB for KV cache"),
    "kv_tokens": re.compile(rf"(?:GPU|CPU|TPU) KV cache size: {_NUM} tokens"),
    # TPU build: "Init model | hbm=[(6.88, 15.75)]GiB" (used, total per chip after loading the
    # weights) and "Memory statistics | ... | total_hbm_avail_gb=5.72GiB" (what is left for the KV cache).
    "hbm_after_model": re.compile(rf"Init model \| hbm=\[\({_NUM}, {_NUM}\)"),
    "hbm_available": re.compile(rf"Memory statistics \|.*\btotal_hbm_avail_gb={_NUM}GiB"),
    # TPU build: the token buckets it compiles for ("Prepared token paddings: [64, 128, 256, 512]").
    "token_paddings": re.compile(r"Prepared token paddings: \[([0-9, ]*)\]"),
    "max_concurrency": re.compile(rf"Maximum concurrency for {_NUM} tokens per request: {_NUM}x"),
    "engine_init": re.compile(rf"init engine \(profile, create kv cache, warmup model\) took {_NUM} s"),
    "compile_in_init": re.compile(rf"\(compilation: {_NUM} s\)"),
    "torch_compile": re.compile(rf"torch\.compile takes {_NUM} s in total"),
    # CUDA W4A16: "Using MarlinLinearKernel for CompressedTensorsWNA16"; CPU W8A8 (kernel chooser):
    # "Selected CPUInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8".
    "linear_kernel": re.compile(r"(?:Using|Selected) (\w+) for (\w+)"),
    "version_banner": re.compile(r"█\s+version (\d+\.\d+\.\d+\S*)"),
    "version_engine": re.compile(r"Initializing a V1 LLM engine \(v(\d+\.\d+\.\d+[^)]*)\)"),
    "non_default_args": re.compile(r"non-default args: (\{.*\})\s*$"),
    "aot_loaded": re.compile(r"Directly load AOT compilation"),
    # A cold start compiles and saves; a warm one loads (docs/facts.md: the KV pool differs between them).
    "aot_saved": re.compile(r"saved AOT compiled function"),
    # The engine's resolved config, not the CLI: vLLM turns prefix caching on unless told otherwise.
    "prefix_caching": re.compile(r"Initializing a V1 LLM engine .*\benable_prefix_caching=(True|False)\b"),
}

# vLLM's own timestamp ("INFO 11-29 21:51:19 [file.py:N]"), present on the CUDA and CPU builds alike.
_STAMP = re.compile(r"(?:INFO|WARNING|DEBUG|ERROR) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) \[")
_READY = re.compile(r"Starting vLLM server on ")

# Where a new start begins; everything before the last one belongs to an earlier process.
_START = re.compile(r"non-default args: \{")

FIELDS = (
    "vllm_version",
    "non_default_args",
    "model_loading_gib",
    "model_loading_s",
    "weights_loading_s",
    "kv_cache_memory_gib",
    "kv_cache_tokens",
    "max_concurrency",
    "max_concurrency_tokens_per_request",
    "engine_init_s",
    "compile_s",
    "linear_kernel",
    "linear_scheme",
    "aot_compile_loaded",
    "prefix_caching",
    "server_start_s",
    "token_paddings",
)


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _seconds(m: re.Match[str]) -> int:
    """Seconds since the start of the year-less month/day stamp (a start never spans New Year)."""
    month, day, h, mi, sec = (int(x) for x in m.groups())
    return ((month * 31 + day) * 24 + h) * 3600 + mi * 60 + sec


def _last_start(lines: list[str]) -> list[str]:
    starts = [i for i, line in enumerate(lines) if _START.search(line)]
    return lines[starts[-1] :] if starts else lines


def _parse_args_dict(text: str) -> dict[str, Any] | None:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, dict) else None


def parse_log(text: str) -> dict[str, Any]:
    """Return the start-up facts of the last vLLM start in ``text``, each ``None`` where absent."""
    facts: dict[str, Any] = dict.fromkeys(FIELDS)
    kernels: list[tuple[str, str]] = []
    first_stamp: int | None = None
    for line in _last_start(text.splitlines()):
        stamp = _STAMP.search(line)
        if stamp and first_stamp is None:
            first_stamp = _seconds(stamp)
        if stamp and first_stamp is not None and _READY.search(line):
            # From vLLM's first config line to the API server listening: whole seconds only.
            facts["server_start_s"] = float(_seconds(stamp) - first_stamp)
        if m := _PATTERNS["model_loading"].search(line):
            facts["model_loading_gib"], facts["model_loading_s"] = _num(m[1]), _num(m[2])
        if m := _PATTERNS["weights_loading"].search(line):
            facts["weights_loading_s"] = _num(m[1])
        if (m := _PATTERNS["kv_memory_gpu"].search(line)) or (m := _PATTERNS["kv_memory_cpu"].search(line)):
            facts["kv_cache_memory_gib"] = _num(m[1])
        if m := _PATTERNS["hbm_after_model"].search(line):
            facts["model_loading_gib"] = _num(m[1])
        if m := _PATTERNS["hbm_available"].search(line):
            facts["kv_cache_memory_gib"] = _num(m[1])
        if m := _PATTERNS["token_paddings"].search(line):
            facts["token_paddings"] = [_int(x) for x in m[1].split(",") if x.strip()]
        if m := _PATTERNS["kv_tokens"].search(line):
            facts["kv_cache_tokens"] = _int(m[1])
        if m := _PATTERNS["max_concurrency"].search(line):
            facts["max_concurrency_tokens_per_request"] = _int(m[1])
            facts["max_concurrency"] = _num(m[2])
        if m := _PATTERNS["engine_init"].search(line):
            facts["engine_init_s"] = _num(m[1])
            if c := _PATTERNS["compile_in_init"].search(line):
                facts["compile_s"] = _num(c[1])
        if (m := _PATTERNS["torch_compile"].search(line)) and facts["compile_s"] is None:
            facts["compile_s"] = _num(m[1])
        if (m := _PATTERNS["linear_kernel"].search(line)) and "Kernel" in m[1]:
            kernels.append((m[1], m[2]))
        if (m := _PATTERNS["version_banner"].search(line)) or (
            (m := _PATTERNS["version_engine"].search(line)) and facts["vllm_version"] is None
        ):
            facts["vllm_version"] = m[1]
        if m := _PATTERNS["non_default_args"].search(line):
            facts["non_default_args"] = _parse_args_dict(m[1])
        if m := _PATTERNS["prefix_caching"].search(line):
            facts["prefix_caching"] = m[1] == "True"
        if _PATTERNS["aot_loaded"].search(line):
            facts["aot_compile_loaded"] = True
        elif _PATTERNS["aot_saved"].search(line) and facts["aot_compile_loaded"] is None:
            facts["aot_compile_loaded"] = False
    if kernels:
        # The first kernel line is the one the model's linears got; later ones repeat it.
        facts["linear_kernel"], facts["linear_scheme"] = kernels[0]
    return facts


def main(argv: list[str] | None = None) -> int:
    """CLI: print the facts of a log file (or stdin) as JSON."""
    ap = argparse.ArgumentParser(
        prog="python -m evidence.logs",
        description="Read vLLM start-up facts (memory, KV cache, timings, kernel, version, args) from "
        "`journalctl -u vllm` output or a log file. Missing lines print as null.",
    )
    ap.add_argument("log", nargs="?", default="-", help="log file, or - for stdin (default)")
    ap.add_argument("--field", choices=FIELDS, help="print only this field")
    args = ap.parse_args(argv)
    if args.log == "-":
        text = sys.stdin.read()
    else:
        path = Path(args.log)
        if not path.is_file():
            ap.error(f"log file not found: {path}")
        text = path.read_text(errors="replace")
    facts = parse_log(text)
    print(json.dumps(facts[args.field] if args.field else facts, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
