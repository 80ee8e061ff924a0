"""Lazy tensors ("units") that the conversion steps rewrite and the writer materializes.

A unit is what one source tensor becomes: one or more output tensors produced together, row
chunk by row chunk, from a single read of the source rows. Steps wrap units (convert, rename,
drop, add) without reading anything, so a chain of steps reads the source once; that is how the
one-pass route and the step-by-step tools share every line of conversion code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

# produce(start, stop) -> one entry per output, in the output's storage dtype (st_io.STORAGE):
# rows [start, stop) for row-wise outputs, the whole tensor for the others when start == 0
# (None after that).
Producer = Callable[[int, int], list[np.ndarray | None]]


@dataclass
class Out:
    """One output tensor: its name, dtype, shape, and whether it is produced row chunk by row chunk."""

    name: str
    dtype: str  # safetensors' name: "BF16", "I32", ...
    shape: tuple[int, ...]
    rowwise: bool


@dataclass
class Unit:
    """Output tensors made from (at most) one source tensor, read once in row chunks."""

    outs: list[Out]
    nrows: int
    produce: Producer
    shard: str
    src: str | None = None
    src_bytes: int = 0
    row_bytes: int = 0
    converted: bool = False
    tags: set[str] = field(default_factory=set)

    @property
    def passthrough(self) -> bool:
        """True when this unit is its source tensor unchanged (possibly renamed)."""
        return self.src is not None and not self.converted and len(self.outs) == 1

    @property
    def unchanged(self) -> bool:
        """True when this unit is its source tensor unchanged and under the same name."""
        return self.passthrough and self.outs[0].name == self.src


def renamed(u: Unit, fn: Callable[[str], str]) -> Unit:
    """The same unit with every output renamed by ``fn``."""
    outs = [Out(fn(o.name), o.dtype, o.shape, o.rowwise) for o in u.outs]
    return Unit(outs, u.nrows, u.produce, u.shard, u.src, u.src_bytes, u.row_bytes, u.converted, set(u.tags))


def constant(name: str, value: np.ndarray, dtype: str, shard: str) -> Unit:
    """A unit with no source: a small tensor written whole (``value`` in ``dtype``'s storage dtype)."""

    def produce(start: int, stop: int) -> list[np.ndarray | None]:
        return [value if start == 0 else None]

    return Unit([Out(name, dtype, tuple(value.shape), False)], 0, produce, shard, converted=True)
