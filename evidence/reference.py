"""Record the reference rigs' measured tables (docs/measurements.md) as schema-valid runs.

These numbers were measured before this project's tools existed, on the T4 rig and on one TPU v5e
chip; they are imported as they were written down, marked ``provenance.kind = imported``, with
every figure the notes do not give left null. ``python -m evidence.reference`` rewrites them.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from evidence import RUNS_DIR
from evidence.report import write_run

SOURCE = "docs/measurements.md (the reference rigs' notes), imported 2026-11-29"

T4_HW = {
    "platform": "gce",
    "accelerator": "NVIDIA Tesla T4 (15,360 MiB, compute capability 7.5)",
    "machine": "n1-standard-2 (2 vCPU, 7.8 GB RAM, 16 GB swapfile)",
    "cpu_count": 2,
    "gpu_memory_mib": 15360,
    "driver": "nvidia-driver 615.x (open kernel module, DKMS)",
}
T4_SW = {
    "vllm_version": "0.29.0",
    "os": "Debian 13 (trixie)",
    "server_settings": {
        "dtype": "float16",
        "kv_cache_dtype": "auto",
        "gpu_memory_utilization": 0.90,
        "max_model_len": 16384,
        "max_num_seqs": 8,
        "compile_cache": "warm",
    },
}
T4_NOTES = (
    "T4 table: model loading, KV cache tokens and decode at c=1 (256 output tokens, ignore_eos, "
    "median of runs 2-4), warm compile cache. Time to healthy ~227-362 s warm (a range, not one run)."
)

# (run_id, key, description, model loading GiB, KV tokens, decode tok/s, decode is from a sweep)
T4_ROWS = [
    (
        "t4-bf16-reference",
        "bf16",
        "The bf16 reference checkpoint, --language-model-only",
        9.8,
        315_974,
        37.0,
        True,
    ),
    ("t4-google-w4a16", "google-w4a16", "Google's -qat-w4a16-ct export", 8.02, 519_568, 62.3, True),
    (
        "t4-w4a16-multimodal-repack",
        "w4a16",
        "Multimodal repack, --language-model-only",
        6.37,
        707_617,
        None,
        False,
    ),
    ("t4-text-repack", "text", "Text-only repack, bf16 embeddings", 6.33, 711_539, 81.6, False),
    (
        "t4-emb4",
        "emb4",
        "Text-only repack, int4 embeddings + untied int4 lm_head",
        2.86,
        1_099_362,
        109.7,
        False,
    ),
]

TPU_NOTES = (
    "W8A8 card, one TPU v5e chip (max-model-len 2048, max-num-seqs 16): output tok/s at 1 / 4 / 16 "
    "concurrent requests and the median time to first token at 1. The notes do not say which input "
    "length, the vLLM version or the spread; those are null."
)
# (run id, key, description, output tok/s at 1 / 4 / 16 or None where the card gives none,
# median time to first token at c=1 in ms, the suite's accuracy in %).
TPU_ROWS = [
    ("tpu-v5e-bf16", "bf16", "The bf16 reference checkpoint", (144, 560, 2008), 12.6, 68.3),
    ("tpu-v5e-w4a16", "w4a16", "W4A16 (as the W8A8 card names it)", (136, 532, 1906), 16.2, 67.8),
    (
        "tpu-v5e-w8a8-rounded",
        "w8a8-rounded",
        "W8A8 rounded from the bf16 weights (int8 per output channel, not from QAT)",
        None,
        10.7,
        67.0,
    ),
    (
        "tpu-v5e-w8a8-qat",
        "w8a8",
        "W8A8 from QAT (int8 per output channel, step amax/127 per row)",
        (220, 841, 2872),
        10.4,
        68.6,
    ),
]
SUITE = "3,880-record multiple-choice suite (13 public subsets), read from top-32 log-probabilities"
# The card's paired comparisons (bootstrap paired by record id, 2,000 resamples, seed 0,
# 2.5/97.5 percentiles), on the run of build B; the card gives no interval for W4A16 vs bf16.
ACCURACY = {
    "tpu-v5e-w4a16": [("bf16", "w4a16", 68.3, 67.8, -0.5, None, None)],
    "tpu-v5e-w8a8-qat": [
        ("bf16", "w8a8 (from QAT)", 68.3, 68.6, 0.3, -0.7, 1.3),
        ("w8a8 (rounded from bf16)", "w8a8 (from QAT)", 67.0, 68.6, 1.5, 0.5, 2.6),
    ],
}


def _accuracy(
    a: str, b: str, acc_a: float, acc_b: float, diff: float, lo: float | None, hi: float | None
) -> dict:
    """One comparison as the card reports it: B - A in points, with its 95% interval."""
    return {
        "a": a, "b": b, "dataset": SUITE, "records": 3880, "acc_a": acc_a, "acc_b": acc_b,
        "diff": diff, "ci_low": lo, "ci_high": hi,
        "seed": 0 if lo is not None else None, "n_boot": 2000 if lo is not None else None,
    }  # fmt: skip


def _empty_memory(gib: float | None, tokens: int | None) -> dict[str, Any]:
    return {
        "model_loading_gib": gib,
        "kv_cache_memory_gib": None,
        "kv_cache_tokens": tokens,
        "max_concurrency": None,
    }


def _empty_startup() -> dict[str, Any]:
    return {"model_loading_s": None, "engine_init_s": None, "compile_s": None, "linear_kernel": None}


def _cell(concurrency: int, tok_s: float | None, input_len: int | None) -> dict[str, Any]:
    return {
        "input_len": input_len,
        "output_len": 128,
        "concurrency": concurrency,
        "num_prompts": max(8, 4 * concurrency),
        "status": "ok",
        "reason": None,
        "repeats": [],
        "median": {"output_tok_s": None if tok_s is None else float(tok_s)},
        "spread": None,
    }


def t4_runs() -> list[dict[str, Any]]:
    """The T4 table, one run per build; the emb4 row also carries its start-up log lines."""
    runs = []
    for run_id, key, desc, gib, tokens, decode, from_sweep in T4_ROWS:
        bench = None
        if decode is not None and from_sweep:
            bench = {"method": "vllm bench serve (reference rig)", "prefix_caching": False, "max_num_seqs": 8,
                     "max_model_len": 16384, "settings": {"output_len": 128},
                     "cells": [_cell(1, decode, None)], "decode": None}  # fmt: skip
        elif decode is not None:
            bench = {
                "method": "vllm bench serve (reference rig)", "prefix_caching": False, "max_num_seqs": 8,
                "max_model_len": 16384, "cells": [],
                "decode": {"input_len": None, "output_len": 256, "status": "ok", "output_tok_s": decode},
            }  # fmt: skip
        run = {
            "schema_version": 1,
            "run_id": run_id,
            "date": "before 2026-11-29 (not recorded)",
            "provenance": {
                "kind": "imported",
                "source": SOURCE,
                "notes": T4_NOTES
                + (" Decode figure is the sweep's output tok/s at c=1." if from_sweep else ""),
            },
            "hardware": T4_HW,
            "software": T4_SW,
            "model": {"key": key, "description": desc},
            "memory": _empty_memory(gib, tokens),
            "startup": _empty_startup(),
            "bench": bench,
        }
        if key == "emb4":
            run["memory"].update(kv_cache_memory_gib=4.66, max_concurrency_tokens_per_request=16384)
            run["startup"].update(
                model_loading_s=88.98, engine_init_s=61.77, compile_s=2.59,
                linear_kernel="MarlinLinearKernel", linear_scheme="CompressedTensorsWNA16",
            )  # fmt: skip
            run["provenance"]["notes"] += (
                " Start-up figures from the log lines in docs/measurements.md. Cold start: 980,210 KV tokens. "
                "Prefill ~7.2 s to first token at 4,096 input tokens."
            )
        runs.append(run)
    return runs


def tpu_runs() -> list[dict[str, Any]]:
    """The W8A8 card's table: the v5e sweep (1/4/16), first-token latency, accuracy and comparisons."""
    runs = []
    for run_id, key, desc, sweep, ttft_ms, score in TPU_ROWS:
        cells = [_cell(c, t, None) for c, t in zip((1, 4, 16), sweep or (None,), strict=False)]
        cells[0]["median"]["ttft_ms"] = ttft_ms
        run = {
            "schema_version": 1,
            "run_id": run_id,
            "date": "before 2026-11-29 (not recorded)",
            "provenance": {
                "kind": "imported",
                "source": SOURCE,
                "notes": f"{TPU_NOTES} Suite accuracy {score}% ({SUITE})."
                + ("" if sweep else " The card gives no throughput for this build."),
            },
            "hardware": {"platform": "tpu", "accelerator": "Google TPU v5e (1 chip)"},
            "software": {"vllm_version": None},
            "model": {"key": key, "description": desc},
            "memory": _empty_memory(None, None),
            "startup": _empty_startup(),
            "bench": {
                "method": "vllm bench serve (reference rig)",
                "prefix_caching": False,
                "max_num_seqs": 16,
                "max_model_len": 2048,
                "settings": {"output_len": 128},
                "cells": cells,
                "decode": None,
            },
        }
        if run_id in ACCURACY:
            run["accuracy"] = [_accuracy(*row) for row in ACCURACY[run_id]]
        runs.append(run)
    return runs


def main(argv: list[str] | None = None) -> int:
    """CLI: (re)write the imported runs under evidence/runs/."""
    ap = argparse.ArgumentParser(prog="python -m evidence.reference", description=__doc__)
    ap.add_argument("--runs-dir", type=Path, default=RUNS_DIR)
    args = ap.parse_args(argv)
    for run in t4_runs() + tpu_runs():
        print(write_run(run, args.runs_dir / run["run_id"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
