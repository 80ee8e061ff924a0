"""How far the W8A8 build's int8 weights are from the QAT values they were made from.

Definition (the per-tensor relative error the W8A8 card reports, 0.6-1.7% per tensor, mean
about 0.8%): for each quantized linear, with w its source (QAT) values and q * s its int8
values times their stored bf16 per-row step,

    relative error = ||q * s - w||_2 / ||w||_2 * 100%

over the whole [out, in] tensor (Frobenius norms; w and q * s in float32, squares summed in
float64), 0 for an all-zero tensor. Overall: the minimum, the unweighted mean and the maximum of
the per-tensor figures, as a card lists them. Tensors are named by their source names.

The kernel (repack.int8_fast) hands back each row chunk's two sums; a tensor's figure adds its
chunks in row order, and chunks are cut the same whatever the worker count, so the figure does
not depend on which thread finished first.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

DEFINITION = "||q*s - w||_2 / ||w||_2 per tensor (w: the QAT values, q*s: int8 times the bf16 step), percent"
# Percent to 4 decimals: finer than any use of the figure, and coarse enough that the last
# bits of a float64 sum (which may differ between CPUs, see repack.int8_fast._sq_sum) vanish.
DECIMALS = 4


def percent(err_sq: float, ref_sq: float) -> float:
    """The relative error in percent from the sums of squares of the error and of the source."""
    if ref_sq <= 0.0:
        return 0.0  # an all-zero tensor: q is all zero, nothing is off
    return 100.0 * math.sqrt(err_sq / ref_sq)


@dataclass
class ErrorSums:
    """Per tensor, per row chunk (keyed by its first row): (sum of error^2, sum of source^2)."""

    chunks: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)  # chunks finish on several threads

    def add(self, name: str, start: int, err_sq: float, ref_sq: float) -> None:
        with self.lock:
            self.chunks.setdefault(name, {})[start] = (err_sq, ref_sq)

    def per_tensor(self) -> dict[str, float]:
        """Name -> relative error in percent (unrounded), names sorted."""
        out = {}
        for name in sorted(self.chunks):
            parts = [self.chunks[name][k] for k in sorted(self.chunks[name])]
            out[name] = percent(math.fsum(p[0] for p in parts), math.fsum(p[1] for p in parts))
        return out


def summarize(per_tensor: dict[str, float]) -> dict | None:
    """min / mean / max over tensors (and which tensors), every figure in percent; None if empty.

    What repack.json records under ``summary.int8_relative_error``.
    """
    if not per_tensor:
        return None
    lo = min(per_tensor, key=lambda n: (per_tensor[n], n))
    hi = max(per_tensor, key=lambda n: (per_tensor[n], n))
    return {
        "definition": DEFINITION,
        "tensors": len(per_tensor),
        "min_percent": round(per_tensor[lo], DECIMALS),
        "mean_percent": round(math.fsum(per_tensor.values()) / len(per_tensor), DECIMALS),
        "max_percent": round(per_tensor[hi], DECIMALS),
        "min_tensor": lo,
        "max_tensor": hi,
        "per_tensor_percent": {n: round(v, DECIMALS) for n, v in per_tensor.items()},
    }


def line(summary: dict) -> str:
    """The summary's words for the converter's closing line."""
    return (
        f"int8 vs QAT relative error (||q*s - w|| / ||w|| per tensor) min {summary['min_percent']:.2f}%, "
        f"mean {summary['mean_percent']:.2f}%, max {summary['max_percent']:.2f}% over "
        f"{summary['tensors']} tensors (max: {summary['max_tensor']})"
    )
