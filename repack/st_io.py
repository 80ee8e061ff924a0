"""Streaming safetensors I/O: validated reading by tensor or row slice, and a pre-planned writer.

The writer knows every tensor's dtype and shape before the first byte, writes the header once
and then each tensor's rows at their final offsets, so no output tensor is ever held whole in
memory (the E2B per-layer table is 4.7 GB).

Data travels as numpy arrays and dtypes as safetensors' names ("BF16", "F16", ...): numpy has no
bfloat16, so a BF16 tensor is its bits as uint16. The converters never import torch: its
import alone would dominate a small run's time and resident memory.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from repack import scratch

# safetensors dtype name -> the numpy dtype that stores it (bf16: its bits, as uint16)
STORAGE = {
    "BF16": np.dtype(np.uint16),
    "F16": np.dtype(np.float16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
FLOATS = ("BF16", "F16", "F32", "F64")
# safetensors dtypes these tools do not read: named as unsupported, not as corrupt
KNOWN = (
    "F4", "F6_E2M3", "F6_E3M2", "F8_E4M3", "F8_E5M2", "F8_E8M0", "U16", "U32", "U64", "C64",
)  # fmt: skip
MAX_HEADER = 100 * 1024 * 1024


class CheckpointError(Exception):
    """A source checkpoint is missing, truncated, corrupt or not a Gemma 4."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies: shard path, dtype, shape, byte range in the shard's data section."""

    name: str
    shard: Path
    dtype: str  # safetensors' name: "BF16", "F32", ...
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def _show(value: object) -> str:
    """A JSON value for a one-line message (a string in Python's quotes), cut short."""
    text = repr(value) if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Duplicate(Exception):
    """A JSON object names one key twice."""


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    """json object hook: a key given twice is refused (json.loads would keep the last silently)."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


def _count(v: object) -> bool:
    """A JSON integer >= 0 (not a bool, which Python counts as an int)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _entry(path: Path, name: str, info: object, size: int, data: int) -> tuple[int, int]:
    """Validate one tensor's header entry; return its (begin, end) in the data section."""
    if not isinstance(info, dict):
        raise CheckpointError(f"{path}: header entry of tensor {name} is not an object: {_show(info)}")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in info:
            raise CheckpointError(f"{path}: header entry of tensor {name} has no {key!r}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str):
        raise CheckpointError(f"{path}: tensor {name}: dtype must be a string, got {_show(dtype)}")
    if dtype in KNOWN:
        raise CheckpointError(
            f"{path}: unsupported dtype {dtype} for tensor {name} (these tools read {', '.join(STORAGE)})"
        )
    if dtype not in STORAGE:
        raise CheckpointError(
            f"{path}: unknown dtype {_show(dtype)} for tensor {name} (not a safetensors dtype)"
        )
    if not isinstance(shape, list) or not all(_count(d) for d in shape):
        raise CheckpointError(
            f"{path}: tensor {name}: shape must be a list of non-negative integers, got {_show(shape)}"
        )
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(o) for o in offsets)):
        raise CheckpointError(
            f"{path}: tensor {name}: invalid data_offsets {_show(offsets)} "
            "(want [begin, end], non-negative integers)"
        )
    lo, hi = offsets
    if hi < lo:
        raise CheckpointError(
            f"{path}: tensor {name}: invalid data_offsets {_show(offsets)} (end before begin)"
        )
    need = _nbytes(dtype, tuple(shape))
    if hi - lo != need:
        raise CheckpointError(
            f"{path}: tensor {name}: data_offsets {_show(offsets)} hold {hi - lo} bytes "
            f"but dtype {dtype} and shape {_show(shape)} need {need}"
        )
    if data + hi > size:
        raise CheckpointError(
            f"{path}: truncated: {name} ends at byte {data + hi} but the file has {size} bytes"
        )
    return lo, hi


def read_header(path: Path) -> tuple[dict, int]:
    """Parse and validate a safetensors header; return (header, data offset). Raises CheckpointError.

    Every entry is checked for type, dtype, shape, offsets in range and of the size that dtype
    and shape need, and no two tensors may share bytes: what is refused here is named for what
    it is, not found later as a wrong value.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise CheckpointError(f"{path}: corrupt or truncated safetensors header (claims {n} bytes)")
            header = json.loads(f.read(n), object_pairs_hook=_no_duplicates)
    except _Duplicate as exc:
        raise CheckpointError(
            f"{path}: {str(exc)!r} appears twice in the header (a tensor or key named twice)"
        ) from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{path}: unreadable safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise CheckpointError(
            f"{path}: corrupt safetensors header (a JSON {type(header).__name__}, not an object)"
        )
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CheckpointError(f"{path}: __metadata__ must be an object of strings, got {_show(meta)}")
    data = 8 + n
    spans = sorted(
        (*_entry(path, name, info, size, data), name)
        for name, info in header.items()
        if name != "__metadata__"
    )
    for (_, end, a), (begin, _, b) in itertools.pairwise(spans):
        if begin < end:
            raise CheckpointError(f"{path}: tensors {a} and {b} overlap (bytes {begin}..{end} of the data)")
    return header, data


def _plain_name(name: str) -> bool:
    """A file name with no directory part (an index must not point outside its checkpoint)."""
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")


def _check_config(path: Path, cfg: object) -> None:
    """config.json is a Gemma 4 config with what the steps read in the types they read."""
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: not a JSON object (a Gemma 4 config is one)")
    mt = cfg.get("model_type")
    if mt not in ("gemma4", "gemma4_text"):
        raise CheckpointError(
            f"{path}: model_type {_show(mt)} is not a Gemma 4 checkpoint (expected 'gemma4' or 'gemma4_text')"
        )
    if mt == "gemma4" and not isinstance(cfg.get("text_config"), dict):
        raise CheckpointError(
            f"{path}: model_type 'gemma4' needs a text_config object, got {_show(cfg.get('text_config'))}"
        )
    for where in (cfg, cfg.get("text_config")):
        qc = where.get("quantization_config") if isinstance(where, dict) else None
        if qc is not None and not (
            isinstance(qc, dict)
            and isinstance(qc.get("config_groups", {}), dict)
            and isinstance(qc.get("ignore", []), list)
        ):
            raise CheckpointError(
                f"{path}: quantization_config must be an object with a config_groups object and an ignore list"
            )


class Source:
    """A checkpoint directory read tensor by tensor (config.json + one or more safetensors)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        if not self.path.exists():
            raise CheckpointError(f"{self.path}: no such directory")
        if not self.path.is_dir():
            raise CheckpointError(f"{self.path}: not a directory (a checkpoint is a directory)")
        cfg_path = self.path / "config.json"
        if not cfg_path.is_file():
            raise CheckpointError(f"{self.path}: no config.json (not a checkpoint directory?)")
        try:
            self.config = json.loads(cfg_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise CheckpointError(f"{cfg_path}: not valid JSON: {exc}") from exc
        _check_config(cfg_path, self.config)
        self.shards, index = self._shard_files()
        self.tensors: dict[str, TensorInfo] = {}
        self.headers: dict[Path, tuple[dict, int]] = {}
        for shard in self.shards:
            header, data = read_header(shard)
            self.headers[shard] = (header, data)
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                if name in self.tensors:
                    raise CheckpointError(
                        f"{self.path}: tensor {name} is in two shards, {self.tensors[name].shard.name} and "
                        f"{shard.name}; which one is meant is not clear, so neither is used"
                    )
                lo, hi = info["data_offsets"]
                self.tensors[name] = TensorInfo(
                    name, shard, info["dtype"], tuple(info["shape"]), data + lo, data + hi
                )
        if index is not None:
            self._check_index(index)
        self._fds: dict[Path, int] = {}
        self._lock = threading.Lock()  # the converters read from several threads

    def _shard_files(self) -> tuple[list[Path], dict[str, str] | None]:
        """The shard files and, when there is an index, its weight map (tensor -> shard name)."""
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            try:
                doc = json.loads(index.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
                raise CheckpointError(f"{index}: not valid JSON: {exc}") from exc
            wm = doc.get("weight_map") if isinstance(doc, dict) else None
            if not isinstance(wm, dict) or not wm:
                raise CheckpointError(
                    f"{index}: corrupt index: no weight_map object naming tensors and shards"
                )
            for name, shard in wm.items():
                if not isinstance(shard, str) or not _plain_name(shard):
                    raise CheckpointError(
                        f"{index}: corrupt index: tensor {name} maps to {_show(shard)}, not a file name in {self.path}"
                    )
            files = [self.path / n for n in sorted(set(wm.values()))]
            missing = [str(f) for f in files if not f.is_file()]
            if missing:
                raise CheckpointError(f"{index} names missing shards: {', '.join(missing)}")
            return files, wm
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{self.path}: no .safetensors files")
        odd = [str(f) for f in files if not f.is_file()]
        if odd:
            raise CheckpointError(f"{odd[0]}: not a regular file")
        return files, None

    def _check_index(self, wm: dict[str, str]) -> None:
        """The index and the shards' headers agree tensor by tensor."""
        index = self.path / "model.safetensors.index.json"
        for name, shard in wm.items():
            info = self.tensors.get(name)
            if info is None or info.shard.name != shard:
                raise CheckpointError(f"{index}: names tensor {name} in {shard}, which does not hold it")
        extra = sorted(set(self.tensors) - set(wm))
        if extra:
            raise CheckpointError(
                f"{index}: does not name tensor {extra[0]}, which {self.tensors[extra[0]].shard.name} holds"
                + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
            )

    def where(self, name: str) -> str:
        """``shard path: tensor name``: how the messages name a source tensor."""
        return f"{self.tensors[name].shard}: {name}"

    def rows(self, name: str, start: int, stop: int, reuse: bool = False) -> np.ndarray:
        """Rows [start, stop) of a tensor (the whole tensor for 0-d and 1-d ones), in its storage dtype.

        Read with pread into a private buffer rather than through safetensors' mmap: mapped
        pages stay resident in this process (the RSS of a full E2B pass grew to 9.6 GiB), while
        a buffer is freed with the chunk, so memory stays bounded by the chunk size. With
        ``reuse`` the buffer is this thread's scratch (see repack.scratch for the contract).
        """
        info = self.tensors[name]
        if len(info.shape) < 2:
            start, stop = 0, 1
            row_shape: tuple[int, ...] = ()
            row_bytes = info.nbytes
            out_shape: tuple[int, ...] = info.shape
        else:
            stop = min(stop, info.shape[0])
            row_shape = info.shape[1:]
            row_bytes = info.nbytes // info.shape[0] if info.shape[0] else 0
            out_shape = (stop - start, *row_shape)
        n = (stop - start) * row_bytes
        buf = scratch.fresh_or_reused(reuse, "rows", (n,), np.uint8)
        fd = self.fd(info.shard)
        got = os.preadv(fd, [memoryview(buf)], info.start + start * row_bytes) if n else 0
        if got != n:
            raise CheckpointError(f"{info.shard}: short read of {name} ({got} of {n} bytes)")
        return buf.view(STORAGE[info.dtype]).reshape(out_shape)

    def fd(self, shard: Path) -> int:
        """A read-only descriptor of ``shard``, opened once and shared (reads are positional)."""
        with self._lock:
            if shard not in self._fds:
                try:
                    self._fds[shard] = os.open(shard, os.O_RDONLY)
                except OSError as exc:
                    raise CheckpointError(f"{shard}: cannot open: {exc}") from exc
            return self._fds[shard]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def fingerprint(self) -> str:
        """A cheap identity of the source: config.json and every shard's name, size, header and
        modification time. Retrained weights keep every name, size and header (the tiny model
        does, trained again), so the time is what tells a rewritten shard from the one built from;
        a copy that resets it only costs a rebuild."""
        import hashlib

        h = hashlib.sha256((self.path / "config.json").read_bytes())
        for shard in self.shards:
            header, _ = self.headers[shard]
            h.update(shard.name.encode())
            st = shard.stat()
            h.update(f"{st.st_size} {st.st_mtime_ns}".encode())
            h.update(json.dumps(header, sort_keys=True).encode())
        return h.hexdigest()


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    n = STORAGE[dtype].itemsize
    for d in shape:
        n *= d
    return n


class ShardWriter:
    """Write one safetensors file whose tensors (name, dtype, shape) are known up front."""

    def __init__(self, path: Path, specs: list[tuple[str, str, tuple[int, ...]]]):
        self.path = path
        header: dict = {"__metadata__": {"format": "pt"}}
        self.offsets: dict[str, tuple[int, int]] = {}
        self.row_bytes: dict[str, int] = {}
        self.dtypes: dict[str, str] = {}
        pos = 0
        for name, dtype, shape in specs:
            nb = _nbytes(dtype, shape)
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + nb]}
            self.dtypes[name] = dtype
            self.offsets[name] = (pos, pos + nb)
            self.row_bytes[name] = nb // shape[0] if len(shape) >= 1 and shape[0] else nb
            pos += nb
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self.data_start = 8 + len(raw)
        self.size = self.data_start + pos
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.pwrite(self.fd, struct.pack("<Q", len(raw)) + raw, 0)
        os.ftruncate(self.fd, self.size)

    def write(self, name: str, array: np.ndarray, row: int = 0) -> None:
        """Write ``array`` as rows starting at ``row`` of tensor ``name`` (row 0 for whole tensors).

        ``array`` must be in the tensor's storage dtype. Positional writes to disjoint ranges:
        several threads may write to one shard at once.
        """
        lo, hi = self.offsets[name]
        if array.dtype != STORAGE[self.dtypes[name]]:
            raise TypeError(f"{name}: got {array.dtype} data for a {self.dtypes[name]} tensor")
        buf = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        at = lo + row * self.row_bytes[name]
        if at + buf.nbytes > hi:
            raise ValueError(f"{name}: write past the end of the tensor")
        view, pos = memoryview(buf), self.data_start + at
        while view.nbytes:  # pwrite may write less than asked (large buffers, signals)
            n = os.pwrite(self.fd, view, pos)
            view, pos = view[n:], pos + n

    def close(self) -> None:
        os.close(self.fd)
