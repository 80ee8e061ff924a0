"""Non-finite values: what the kernels refuse, described in words a user can act on.

The compiled kernels already test every value's magnitude bits (their peak pass); when one is
NaN or Inf they stop, and only then is the block looked at again here to say which and where.
The happy path pays nothing. A QAT checkpoint holds no NaN or Inf: one means a damaged file or
a broken export, and writing it out (a NaN row as all-zero codes with scale 1, an Inf row with
scale inf) would hide that, so the converters refuse it.
"""

from __future__ import annotations

import numpy as np


class NonFiniteError(ValueError):
    """A block holds NaN or Inf: ``kind`` says which, ``row`` the first row of the block with one.

    The caller names the file and tensor and turns ``row`` into the tensor's row (it knows
    both; the kernels do not): see ``describe``.
    """

    def __init__(self, kind: str, row: int):
        self.kind, self.row = kind, row
        super().__init__(f"holds {kind} (first in row {row})")

    def describe(self, where: str, first_row: int) -> str:
        """One line: ``where`` (file: tensor) holds NaN/Inf, at which row of the tensor."""
        return (
            f"{where} holds {self.kind} (first in row {first_row + self.row}); non-finite weights are refused"
        )


def _masks(block: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(is NaN, is Inf) per value of ``block`` in ``dtype``'s storage (bf16 as uint16 bits)."""
    if dtype == "BF16":
        mag = block & np.uint16(0x7FFF)
        return mag > 0x7F80, mag == 0x7F80
    return np.isnan(block), np.isinf(block)


def check(block: np.ndarray, dtype: str) -> None:
    """Raise NonFiniteError if ``block`` (float storage, not bf16) holds NaN or Inf: one
    vectorized pass, for the dtypes that the compiled kernels do not take."""
    if not np.isfinite(block).all():
        raise error(block, dtype)


def error(block: np.ndarray, dtype: str) -> NonFiniteError:
    """The error for a block known to hold NaN or Inf (rows on the first axis)."""
    nan, inf = _masks(block, dtype)
    bad = (nan | inf).reshape(block.shape[0], -1).any(axis=1) if block.ndim > 1 else (nan | inf)
    where = np.flatnonzero(bad)
    kind = " and ".join(k for k, m in (("NaN", nan), ("Inf", inf)) if m.any()) or "NaN or Inf"
    return NonFiniteError(kind, int(where[0]) if where.size and block.ndim > 1 else 0)
