"""Tensors written as they are (block-copied, renamed, hard-linked): checked for NaN and Inf.

The quantizing kernels refuse non-finite values in their own pass (repack.finite). A float
tensor that a target writes byte for byte (the bf16 embedding tables of the text and w8a8
targets, the norms, the towers) goes through no kernel, so a NaN in it would be served
silently. Each such tensor gets a check unit: a unit with no outputs whose row chunks the
pipeline's workers read (pread into the thread's reused buffer) and test by their bits, with
two integer maxima and no temporary array. The copy itself stays inside the kernel
(copy_file_range) or is a hard link; the check costs one memory-bound read of the copied bytes,
and looks for the row only when a chunk holds a bad value.

One exception: the clip bounds of Gemma 4's clippable linears (the towers' ``input_min``,
``input_max``, ``output_min``, ``output_max`` scalars, applied with torch.clamp) are -Inf/+Inf
where a linear is not clipped; transformers initializes them so. Those may be infinite, never NaN.
"""

from __future__ import annotations

import re

import numpy as np

from repack import finite
from repack.st_io import FLOATS
from repack.units import Unit

# float dtype -> (its bits as signed and unsigned integers, +Inf's bits, the sign bit). Bits at or
# above +Inf's are an all-ones exponent: +Inf (mantissa 0) or NaN; the same with the sign bit set,
# -Inf or NaN. As signed integers the positive ones are the largest values, as unsigned the
# negative ones: the two maxima say whether any value is not finite. numpy reduces both with SIMD
# code and no temporary (measured as fast as a compiled loop over the masked bits, without
# numba's import, which text_only.py does not pay).
_BITS = {
    "BF16": (np.int16, np.uint16, 0x7F80, 0x8000),
    "F16": (np.int16, np.uint16, 0x7C00, 0x8000),
    "F32": (np.int32, np.uint32, 0x7F80_0000, 0x8000_0000),
    "F64": (np.int64, np.uint64, 0x7FF0_0000_0000_0000, 0x8000_0000_0000_0000),
}
assert set(_BITS) == set(FLOATS)
CLIP_BOUND = re.compile(r"\.(?:input|output)_(?:min|max)$")


def check(block: np.ndarray, dtype: str, inf_ok: bool = False) -> None:
    """Raise finite.NonFiniteError if ``block`` (``dtype``'s storage, rows on the first axis)
    holds NaN, or Inf unless ``inf_ok``."""
    signed, unsigned, inf, sign = _BITS[dtype]
    flat = block.reshape(-1)
    if not flat.size:
        return
    limit = inf + inf_ok  # NaN: above Inf's bits
    if int(flat.view(signed).max()) >= limit or int(flat.view(unsigned).max()) >= sign | limit:
        raise finite.error(block, dtype)


def check_unit(u: Unit) -> Unit | None:
    """A unit that writes nothing and checks the rows of passthrough unit ``u`` (None unless ``u``
    is a float tensor written as it is)."""
    if not u.passthrough or u.outs[0].dtype not in FLOATS:
        return None
    dtype, inner = u.outs[0].dtype, u.produce
    inf_ok = bool(CLIP_BOUND.search(u.src or ""))

    def produce(start: int, stop: int) -> list[np.ndarray | None]:
        check(inner(start, stop)[0], dtype, inf_ok)
        return []

    return Unit([], u.nrows, produce, u.shard, u.src, u.src_bytes, u.row_bytes)
