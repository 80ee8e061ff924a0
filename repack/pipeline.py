"""Run a chain of steps over a source checkpoint: plan, stream, write atomically, summarize."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from repack import __version__
from repack.outdir import atomic_dir, link_or_copy
from repack.st_io import ShardWriter, Source
from repack.steps import Context, Step
from repack.units import Out, Unit

CHUNK_BYTES = 32 * 1024 * 1024  # source bytes per row chunk: bounds memory, keeps reads large
STAMP = "repack.json"
WEIGHT_FILES = ("config.json", "model.safetensors.index.json", STAMP)


class OffGridError(Exception):
    """Some groups fit no Q4_0 grid: the input is not a QAT checkpoint (or is damaged)."""

    def __init__(self, off: dict[str, int]):
        self.off = off
        lines = [f"  {name}: {n} group(s) off the grid" for name, n in sorted(off.items())]
        super().__init__(
            f"{sum(off.values())} group(s) in {len(off)} tensor(s) fit no Q4_0 grid; nothing was written:\n"
            + "\n".join(lines)
        )


@dataclass
class Summary:
    tensors_converted: int = 0
    tensors_written: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    off_grid_groups: int = 0
    shards_linked: int = 0
    shards_copied: int = 0
    seconds: float = 0.0
    steps: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"{self.tensors_converted} tensors converted, {self.tensors_written} written; "
            f"{self.bytes_in / 1e6:.1f} MB in, {self.bytes_out / 1e6:.1f} MB out; "
            f"{self.off_grid_groups} off-grid groups; {self.shards_linked} shard(s) linked, "
            f"{self.shards_copied} copied; {self.seconds:.1f} s"
        )


def source_units(src: Source) -> list[Unit]:
    """One passthrough unit per source tensor, in on-disk order (sequential reads)."""
    units = []
    for info in sorted(src.tensors.values(), key=lambda t: (str(t.shard), t.start)):
        name = info.name

        def produce(start: int, stop: int, name: str = name) -> list[torch.Tensor | None]:
            return [src.rows(name, start, stop)]

        rowwise = len(info.shape) >= 2
        nrows = info.shape[0] if rowwise else 0
        row_bytes = info.nbytes // nrows if nrows else info.nbytes
        units.append(
            Unit(
                [Out(name, info.dtype, info.shape, rowwise)],
                nrows,
                produce,
                info.shard.name,
                src=name,
                src_bytes=info.nbytes,
                row_bytes=row_bytes,
            )
        )
    return units


def validate_quant_config(cfg: dict) -> None:
    """compressed-tensors' own models are the judge of a quantization_config."""
    qc = cfg.get("quantization_config")
    if qc is None:
        return
    try:
        from compressed_tensors.quantization import QuantizationConfig
    except ImportError:
        # A bare host (e.g. one converting without vLLM's virtualenv) can still convert; the
        # tests validate every target's config with compressed-tensors on the controller.
        print(
            "warning: compressed-tensors is not installed; quantization_config not validated", file=sys.stderr
        )
        return
    QuantizationConfig.model_validate(qc)


def _write_units(path: Path, units: list[Unit], bar: tqdm, summary: Summary) -> None:
    specs = [(o.name, o.dtype, o.shape) for u in units for o in u.outs]
    w = ShardWriter(path, specs)
    try:
        for u in units:
            if u.nrows == 0:
                for o, t in zip(u.outs, u.produce(0, 0), strict=True):
                    w.write(o.name, t.reshape(o.shape).to(o.dtype))
                bar.update(u.src_bytes)
                continue
            step = max(1, CHUNK_BYTES // max(1, u.row_bytes))
            for start in range(0, u.nrows, step):
                stop = min(u.nrows, start + step)
                for o, t in zip(u.outs, u.produce(start, stop), strict=True):
                    if t is None:
                        continue
                    w.write(o.name, t.to(o.dtype), start if o.rowwise else 0)
                bar.update(u.row_bytes * (stop - start))
            summary.tensors_converted += int(u.converted and u.src is not None)
    finally:
        w.close()


def _rename_copy(src: Source, shard: Path, units: list[Unit], dst: Path) -> None:
    """A shard whose tensors are only renamed: new header, data section copied as one block."""
    infos = [src.tensors[u.src] for u in units]  # type: ignore[index]
    specs = [(u.outs[0].name, i.dtype, i.shape) for u, i in zip(units, infos, strict=True)]
    w = ShardWriter(dst, specs)
    try:
        _, data = src.headers[shard]
        with open(shard, "rb") as f:
            length = shard.stat().st_size - data
            off_in, off_out = data, w.data_start
            while length > 0:
                n = os.copy_file_range(f.fileno(), w.fd, length, off_in, off_out)
                if n == 0:
                    raise OSError(f"short copy from {shard}")
                off_in, off_out, length = off_in + n, off_out + n, length - n
    finally:
        w.close()


def _plan_shards(src: Source, units: list[Unit]) -> list[tuple[str, list[Unit]]]:
    order = [s.name for s in src.shards]
    by: dict[str, list[Unit]] = {}
    for u in units:
        by.setdefault(u.shard, []).append(u)
    return [(s, by[s]) for s in order if s in by]


def _whole_shard(src: Source, shard: str, units: list[Unit]) -> bool:
    """True when ``units`` are exactly the shard's tensors, unconverted, in on-disk order."""
    path = src.path / shard
    names = [i.name for i in sorted(src.tensors.values(), key=lambda t: t.start) if i.shard == path]
    return all(u.passthrough for u in units) and [u.src for u in units] == names


def step_names(steps: list[Step]) -> list[str]:
    return [getattr(s, "__name__", "step") for s in steps]


def is_current(src_dir: Path | str, out: Path | str, steps: list[Step]) -> bool:
    """True when ``out`` was written by this version of the tools, with these steps, from this source."""
    stamp_path = Path(out) / STAMP
    try:
        stamp = json.loads(stamp_path.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    src = Source(src_dir)
    return (
        stamp.get("version") == __version__
        and stamp.get("steps") == step_names(steps)
        and stamp.get("source_fingerprint") == src.fingerprint()
    )


def run(
    src_dir: Path | str,
    out: Path | str,
    steps: list[Step],
    *,
    force: bool = False,
    quiet: bool = False,
    label: str = "",
) -> Summary:
    """Apply ``steps`` to the checkpoint in ``src_dir`` and write the result to ``out`` atomically."""
    t0 = time.monotonic()
    src = Source(src_dir)
    ctx = Context()
    units = source_units(src)
    cfg = src.config
    for step in steps:
        units, cfg = step(units, cfg, ctx)
    validate_quant_config(cfg)
    summary = Summary(steps=step_names(steps))
    shards = _plan_shards(src, units)
    total_in = sum(u.src_bytes for _, us in shards for u in us)
    with atomic_dir(out, force=force) as tmp:
        names = (
            ["model.safetensors"]
            if len(shards) == 1
            else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        )
        weight_map: dict[str, str] = {}
        with tqdm(
            total=total_in, unit="B", unit_scale=True, desc=label or "convert", disable=quiet, file=sys.stderr
        ) as bar:
            for (shard, us), fname in zip(shards, names, strict=True):
                dst = tmp / fname
                if _whole_shard(src, shard, us) and all(u.unchanged for u in us):
                    link_or_copy(src.path / shard, dst)
                    summary.shards_linked += 1
                    bar.update(sum(u.src_bytes for u in us))
                elif _whole_shard(src, shard, us):
                    _rename_copy(src, src.path / shard, us, dst)
                    summary.shards_copied += 1
                    bar.update(sum(u.src_bytes for u in us))
                else:
                    _write_units(dst, us, bar, summary)
                for u in us:
                    weight_map.update(dict.fromkeys((o.name for o in u.outs), fname))
                summary.bytes_out += dst.stat().st_size
        summary.bytes_in = total_in
        off = ctx.off_grid
        summary.off_grid_groups = sum(off.values())
        if off:
            raise OffGridError(off)
        summary.tensors_written = len(weight_map)
        if len(shards) > 1:
            index = {
                "metadata": {"total_size": summary.bytes_out},
                "weight_map": dict(sorted(weight_map.items())),
            }
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        for f in sorted(src.path.iterdir()):
            if f.is_file() and f.suffix != ".safetensors" and f.name not in WEIGHT_FILES:
                shutil.copyfile(f, tmp / f.name)
        summary.seconds = time.monotonic() - t0
        stamp = {
            "tool": "gemma-rig repack",
            "version": __version__,
            "steps": summary.steps,
            "source": str(src.path.resolve()),
            "source_fingerprint": src.fingerprint(),
            "summary": summary.__dict__,
        }
        (tmp / STAMP).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n")
    return summary
