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
    "W8A8 card, one TPU v5e chip: output tok/s at 1 / 4 / 16 concurrent requests. The notes do not "
    "say which input length, the vLLM version or the spread; those are null."
)
TPU_ROWS = [
    ("tpu-v5e-bf16", "bf16", "The bf16 reference checkpoint", (144, 560, 2008)),
    ("tpu-v5e-w4a16", "w4a16", "W4A16 (as the W8A8 card names it)", (136, 532, 1906)),
    (
        "tpu-v5e-w8a8-qat",
        "w8a8",
        "W8A8 from QAT (int8 per output channel, step amax/127 per row)",
        (220, 841, 2872),
    ),
]
ACCURACY = {
    "a": "bf16",
    "b": "w8a8 (from QAT)",
    "dataset": "3,880-record multiple-choice suite, read by label probability",
    "records": 3880,
    "acc_a": 68.3,
    "acc_b": 68.6,
    "diff": 0.3,
    "ci_low": -0.7,
    "ci_high": 1.3,
    "seed": None,
    "n_boot": None,
}


def _empty_memory(gib: float | None, tokens: int | None) -> dict[str, Any]:
    return {
        "model_loading_gib": gib,
        "kv_cache_memory_gib": None,
        "kv_cache_tokens": tokens,
        "max_concurrency": None,
    }


def _empty_startup() -> dict[str, Any]:
    return {"model_loading_s": None, "engine_init_s": None, "compile_s": None, "linear_kernel": None}


def _cell(concurrency: int, tok_s: float, input_len: int | None) -> dict[str, Any]:
    return {
        "input_len": input_len,
        "output_len": 128,
        "concurrency": concurrency,
        "num_prompts": max(8, 4 * concurrency),
        "status": "ok",
        "reason": None,
        "repeats": [],
        "median": {"output_tok_s": float(tok_s)},
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
    """The TPU v5e sweep (1/4/16), with the paired accuracy figure on the W8A8 run."""
    runs = []
    for run_id, key, desc, (c1, c4, c16) in TPU_ROWS:
        run = {
            "schema_version": 1,
            "run_id": run_id,
            "date": "before 2026-11-29 (not recorded)",
            "provenance": {"kind": "imported", "source": SOURCE, "notes": TPU_NOTES},
            "hardware": {"platform": "tpu", "accelerator": "Google TPU v5e (1 chip)"},
            "software": {"vllm_version": None},
            "model": {"key": key, "description": desc},
            "memory": _empty_memory(None, None),
            "startup": _empty_startup(),
            "bench": {
                "method": "vllm bench serve (reference rig)",
                "prefix_caching": False,
                "settings": {"output_len": 128},
                "cells": [_cell(1, c1, None), _cell(4, c4, None), _cell(16, c16, None)],
                "decode": None,
            },
        }
        if key == "w8a8":
            run["accuracy"] = [ACCURACY]
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
