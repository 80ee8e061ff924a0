"""The log reader on real CPU-build excerpts and on the T4 lines docs/measurements.md lists."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from evidence.logs import FIELDS, parse_log

FIX = Path(__file__).parent / "evidence_fixtures"


def test_t4_journal_lines_with_separators_and_prefixes() -> None:
    facts = parse_log((FIX / "t4_emb4_journal.log").read_text())
    assert facts["model_loading_gib"] == 2.86
    assert facts["model_loading_s"] == 88.98
    assert facts["kv_cache_memory_gib"] == 4.66
    assert facts["kv_cache_tokens"] == 1_099_362
    assert facts["max_concurrency_tokens_per_request"] == 16_384
    assert facts["max_concurrency"] == 67.10
    assert facts["engine_init_s"] == 61.77
    assert facts["compile_s"] == 2.59
    assert facts["linear_kernel"] == "MarlinLinearKernel"
    assert facts["linear_scheme"] == "CompressedTensorsWNA16"
    assert facts["vllm_version"] == "0.29.0"
    assert facts["non_default_args"]["max_num_seqs"] == 8
    assert facts["non_default_args"]["enable_prefix_caching"] is False
    assert facts["aot_compile_loaded"] is True
    # The CUDA build reports model loading, not the CPU build's weights-only line.
    assert facts["weights_loading_s"] is None
    assert facts["prefix_caching"] is None  # the T4 notes keep no engine config line


def test_cpu_build_real_excerpt() -> None:
    facts = parse_log((FIX / "cpu_tiny_eager.log").read_text())
    assert facts["vllm_version"] == "0.29.0"
    assert facts["kv_cache_memory_gib"] == 0.25
    assert facts["kv_cache_tokens"] == 335_544
    assert facts["max_concurrency"] == 163.84
    assert facts["max_concurrency_tokens_per_request"] == 2048
    assert facts["engine_init_s"] == 0.16
    assert facts["weights_loading_s"] == 0.01
    assert facts["non_default_args"]["kv_cache_memory_bytes"] == 268435456
    assert facts["prefix_caching"] is False
    # Lines the CPU build does not print stay missing, not zero.
    for field in ("model_loading_gib", "model_loading_s", "compile_s", "linear_kernel", "aot_compile_loaded"):
        assert facts[field] is None, field


def test_empty_log_is_all_missing() -> None:
    assert parse_log("") == dict.fromkeys(FIELDS)
    assert all(v is None for v in parse_log("random noise\nnothing here 0 GiB").values())


def test_zero_values_are_read_as_zero_not_missing() -> None:
    facts = parse_log("Available KV cache memory: 0.00 GiB\nGPU KV cache size: 0 tokens\n")
    assert facts["kv_cache_memory_gib"] == 0.0
    assert facts["kv_cache_tokens"] == 0


def test_only_the_last_start_counts() -> None:
    cold = "non-default args: {'model': 'x'}\nGPU KV cache size: 980,210 tokens\n"
    warm = "non-default args: {'model': 'x'}\nGPU KV cache size: 1,099,362 tokens\n"
    facts = parse_log(cold + warm)
    assert facts["kv_cache_tokens"] == 1_099_362
    # A field printed only by the earlier start does not leak into the last one.
    facts = parse_log("Available KV cache memory: 4.20 GiB\n" + warm)
    assert facts["kv_cache_memory_gib"] is None


def test_unparseable_args_are_missing() -> None:
    assert parse_log("non-default args: {'a': <object at 0x1>}")["non_default_args"] is None


def test_cli_reads_file_and_stdin(repo_root: Path) -> None:
    log = FIX / "t4_emb4_journal.log"
    out = subprocess.run(
        [sys.executable, "-m", "evidence.logs", str(log)],
        cwd=repo_root,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout)["kv_cache_tokens"] == 1_099_362
    out = subprocess.run(
        [sys.executable, "-m", "evidence.logs", "--field", "model_loading_gib"],
        cwd=repo_root,
        input=log.read_text(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == 2.86
    bad = subprocess.run(
        [sys.executable, "-m", "evidence.logs", "/nonexistent.log"],
        cwd=repo_root,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "not found" in bad.stderr


def test_prefix_caching_is_the_engines_resolved_setting() -> None:
    line = "(EngineCore pid=1) INFO [core.py:123] Initializing a V1 LLM engine (v0.29.0) with config: a=1, "
    assert parse_log(line + "enable_prefix_caching=True, b=2")["prefix_caching"] is True
    assert parse_log(line + "enable_prefix_caching=False, b=2")["prefix_caching"] is False
    assert parse_log("enable_prefix_caching=True")["prefix_caching"] is None  # not the engine's line


def test_cpu_build_quantized_cold_start() -> None:
    facts = parse_log((FIX / "cpu_tiny_w8a8_cold.log").read_text())
    # The CPU build's kernel chooser says "Selected ... for ...", not the CUDA scheme's "Using".
    assert facts["linear_kernel"] == "CPUInt8ScaledMMLinearKernel"
    assert facts["linear_scheme"] == "CompressedTensorsW8A8Int8"
    assert facts["aot_compile_loaded"] is False  # compiled and saved: a cold start
    assert facts["engine_init_s"] == 100.00
    assert facts["weights_loading_s"] == 0.03
    assert facts["compile_s"] is None  # this build prints no compile time
    assert facts["prefix_caching"] is True  # not disabled on that server: vLLM's default
    assert "enforce_eager" not in facts["non_default_args"]


def test_cpu_build_restart_reports_the_second_start() -> None:
    facts = parse_log((FIX / "cpu_tiny_w8a8_restart.log").read_text())
    assert facts["engine_init_s"] == 60.53 and facts["weights_loading_s"] == 0.05
    # Its AOT cache failed to load, so it compiled again: still not a warm start.
    assert facts["aot_compile_loaded"] is False
    assert facts["linear_kernel"] == "CPUInt8ScaledMMLinearKernel"


def test_server_start_time_from_vllms_own_timestamps() -> None:
    # 21:51:19 (non-default args) to 21:51:43 (Starting vLLM server): eager tiny model.
    assert parse_log((FIX / "cpu_tiny_eager.log").read_text())["server_start_s"] == 24.0
    # Compiled cold start, 22:12:40 to 22:15:29; the restart is timed from its own first line.
    assert parse_log((FIX / "cpu_tiny_w8a8_cold.log").read_text())["server_start_s"] == 169.0
    assert parse_log((FIX / "cpu_tiny_w8a8_restart.log").read_text())["server_start_s"] == 129.0
    # Not listening yet (or the line is absent): missing, not zero.
    assert parse_log((FIX / "t4_emb4_journal.log").read_text())["server_start_s"] is None


def test_tpu_build_start_up_lines() -> None:
    """The TPU build reports device memory as HBM: the weights' share and what is left for the KV
    cache map to the same fields as the GPU's; its token buckets are a field of their own."""
    facts = parse_log((FIX / "tpu_w8a8_startup.log").read_text())
    assert facts["model_loading_gib"] == 6.88  # hbm used after the model, of 15.75 GiB
    assert facts["kv_cache_memory_gib"] == 5.72  # total_hbm_avail_gb
    assert facts["kv_cache_tokens"] == 333_344
    assert (facts["max_concurrency_tokens_per_request"], facts["max_concurrency"]) == (16_384, 20.35)
    assert (facts["engine_init_s"], facts["compile_s"]) == (308.11, 230.45)
    assert facts["token_paddings"] == [64, 128, 256, 512]
    assert facts["non_default_args"]["max_num_batched_tokens"] == 512
    assert facts["server_start_s"] == 313.0  # 21:40:01 to 21:45:14
    assert facts["linear_kernel"] is None  # the TPU build names no CUDA/CPU kernel
    # The GPU and CPU builds print no paddings line: None there, never an empty list.
    assert parse_log("INFO 11-29 21:40:09 [x.py:1] GPU KV cache size: 10 tokens")["token_paddings"] is None
