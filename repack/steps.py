"""The conversion steps. Each maps (units, config) to (units, config) without reading data.

repack     language-model linears -> W4A16 pack-quantized (towers kept, ignored)
text_only  drop the vision/audio towers, rename to model.*, flatten the config
embed_int4 per-layer table (and embed_tokens + an untied lm_head) -> int4 group 32
w8a8       language-model linears -> int8 per output channel, int8 dynamic per-token activations
"""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from repack import grid, int8_error, scratch
from repack.st_io import FLOATS, STORAGE
from repack.units import Out, Unit, constant, renamed

LINEAR = re.compile(
    r"^model\.(?:language_model\.)?(?:layers\.\d+\.(?:self_attn\.[qkvo]_proj|mlp\.(?:gate|up|down)_proj"
    r"|per_layer_input_gate|per_layer_projection)|per_layer_model_projection)\.weight$"
)
EMBED = re.compile(r"^model\.(?:language_model\.)?(embed_tokens|embed_tokens_per_layer)\.weight$")
TOWERS = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")
TOWER_IGNORE = ["re:.*vision_tower.*", "re:.*audio_tower.*", "re:.*embed_vision.*", "re:.*embed_audio.*"]
SCALE_DTYPE = "F16"  # the T4 computes in float16; fp16 also keeps 3 more step bits than bf16 (repack.half)

W4 = {
    "num_bits": 4,
    "type": "int",
    "symmetric": True,
    "strategy": "group",
    "group_size": 32,
    "dynamic": False,
}
W8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}
A8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}


@dataclass
class TensorStats:
    groups: int = 0
    off_grid: int = 0
    max_abs_error: float = 0.0
    max_step_error: float = 0.0


@dataclass
class Context:
    """What the steps record while the writer pulls data through them."""

    stats: dict[str, TensorStats] = field(default_factory=dict)
    int8_sums: int8_error.ErrorSums = field(default_factory=int8_error.ErrorSums)
    lock: threading.Lock = field(default_factory=threading.Lock)  # chunks finish on several threads

    def record(self, name: str, r: grid.GridResult) -> None:
        with self.lock:
            s = self.stats.setdefault(name, TensorStats())
            s.groups += r.groups
            s.off_grid += r.off_grid
            s.max_abs_error = max(s.max_abs_error, r.max_abs_error)
            s.max_step_error = max(s.max_step_error, r.max_rel_step_error)

    def record_error(self, name: str, groups: int, err: float) -> None:
        with self.lock:
            s = self.stats.setdefault(name, TensorStats())
            s.groups += groups
            s.max_abs_error = max(s.max_abs_error, err)

    @property
    def off_grid(self) -> dict[str, int]:
        return {k: v.off_grid for k, v in self.stats.items() if v.off_grid}


Step = Callable[[list[Unit], dict, Context], tuple[list[Unit], dict]]


def _base(name: str) -> str:
    return name[: -len(".weight")]


def _single(u: Unit) -> Out:
    if len(u.outs) != 1:
        raise ValueError(f"{u.outs[0].name}: expected one tensor, got {[o.name for o in u.outs]}")
    return u.outs[0]


def check_weight(name: str, dtype: str, shape: tuple[int, ...]) -> None:
    """Raise ValueError unless ``name`` is a float weight with at least one value (what the
    quantizing steps and ``check`` can read; an I32 one is named as such, not as off the grid)."""
    if dtype not in FLOATS:
        raise ValueError(
            f"{name}: wrong dtype {dtype} for a weight to quantize (want one of {', '.join(FLOATS)})"
        )
    if 0 in shape:
        raise ValueError(f"{name}: empty weight (shape {list(shape)})")


def _weight(u: Unit) -> Out:
    o = _single(u)
    check_weight(o.name, o.dtype, o.shape)
    return o


def int4_unit(u: Unit, ctx: Context, extra_bases: tuple[str, ...] = ()) -> Unit:
    """A bf16 [out, in] weight -> weight_packed, weight_scale, weight_shape (also under extra_bases)."""
    o = _weight(u)
    grid.check_group_shape(o.name, o.shape)
    rows, cols = o.shape
    bases = (_base(o.name), *extra_bases)
    outs = []
    for b in bases:
        outs += [
            Out(f"{b}.weight_packed", "I32", (rows, cols // 8), True),
            Out(f"{b}.weight_scale", SCALE_DTYPE, (rows, cols // grid.GROUP), True),
            Out(f"{b}.weight_shape", "I64", (2,), False),
        ]
    inner = u.produce

    from repack import half  # numba's import is paid only by the steps that recover grids

    def produce(start: int, stop: int) -> list[np.ndarray | None]:
        w = inner(start, stop)[0]
        r = grid.recover_array(w, o.dtype, reuse=True, levels=False)
        ctx.record(o.name, r)
        scales = half.from_float32(r.steps, scratch.array("scales", r.steps.shape, np.float16))
        one = [
            r.packed,
            scales,
            np.array([rows, cols], np.int64) if start == 0 else None,
        ]
        return one * len(bases)

    return Unit(outs, rows, produce, u.shard, u.src, u.src_bytes, u.row_bytes, True, set(u.tags))


def int8_unit(u: Unit, ctx: Context) -> Unit:
    """A bf16 [out, in] weight -> int8 weight and a per-row bf16 scale (amax / 127 rounded to the nearest
    bf16, repack.int8_fast), the card's format; records the chunk's error sums (repack.int8_error)."""
    o = _weight(u)
    if len(o.shape) != 2:
        raise grid.GridShapeError(f"{o.name}: expected a 2-D [out, in] weight, got shape {list(o.shape)}")
    rows, cols = o.shape
    b = _base(o.name)
    outs = [
        Out(f"{b}.weight", "I8", (rows, cols), True),
        Out(f"{b}.weight_scale", "BF16", (rows, 1), True),
    ]
    inner = u.produce

    from repack import int8_fast  # numba's import is paid only by the W8A8 step

    def produce(start: int, stop: int) -> list[np.ndarray | None]:
        r = int8_fast.quantize_array(inner(start, stop)[0], o.dtype, reuse=True)
        ctx.record_error(o.name, stop - start, r.max_abs_error)
        ctx.int8_sums.add(o.name, start, r.err_sq, r.ref_sq)
        return [r.q, r.scale]

    return Unit(outs, rows, produce, u.shard, u.src, u.src_bytes, u.row_bytes, True, set(u.tags))


def ones(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Ones in a float dtype's storage (bf16 1.0 is the bits 0x3F80)."""
    if dtype == "BF16":
        return np.full(shape, 0x3F80, np.uint16)
    return np.ones(shape, STORAGE[dtype])


def _lm_prefix(units: list[Unit]) -> str:
    names = {o.name for u in units for o in u.outs}
    return "model.language_model." if any(n.startswith("model.language_model.") for n in names) else "model."


def fill_shared_k_norm(units: list[Unit], cfg: dict) -> list[Unit]:
    """Add k_norm for KV-shared layers that lack it: vLLM 0.29.0's CPU build requires one per layer.

    The values are never used (those layers read the cache of an earlier layer); ones it is.
    """
    del cfg  # the layer list comes from the tensors themselves
    lm = _lm_prefix(units)
    names = {o.name for u in units for o in u.outs}
    out: list[Unit] = []
    for u in units:
        out.append(u)
        m = re.match(rf"^{re.escape(lm)}layers\.(\d+)\.self_attn\.q_norm\.weight$", u.outs[0].name)
        if not m:
            continue
        kn = f"{lm}layers.{m.group(1)}.self_attn.k_norm.weight"
        if kn not in names:
            qn = u.outs[0]
            out.append(constant(kn, ones(qn.dtype, qn.shape), qn.dtype, u.shard))
    return out


def _qconfig(fmt: str, groups: dict, ignore: list[str]) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": groups,
        "ignore": ignore,
        "quantization_status": "compressed",
    }


def _quantize_linears(
    units: list[Unit], cfg: dict, to_unit: Callable[[Unit], Unit], fmt: str, weights: dict, acts: dict | None
) -> tuple[list[Unit], dict]:
    """Every language-model linear through ``to_unit``; towers kept and ignored; embeddings stay bf16."""
    if "quantization_config" in cfg:
        raise ValueError("the source is already quantized (config.json has quantization_config)")
    units = [to_unit(u) if LINEAR.match(u.outs[0].name) else u for u in units]
    units = fill_shared_k_norm(units, cfg)
    cfg = copy.deepcopy(cfg)
    ignore = ["lm_head"] + (TOWER_IGNORE if "vision_config" in cfg or "audio_config" in cfg else [])
    group = {"targets": ["Linear"], "weights": weights, "input_activations": acts, "output_activations": None}
    cfg["quantization_config"] = _qconfig(fmt, {"group_0": group}, ignore)
    return units, cfg


def repack(units: list[Unit], cfg: dict, ctx: Context) -> tuple[list[Unit], dict]:
    """Every language-model linear -> W4A16; towers kept and ignored; embeddings stay bf16."""
    return _quantize_linears(units, cfg, lambda u: int4_unit(u, ctx), "pack-quantized", W4, None)


def w8a8(units: list[Unit], cfg: dict, ctx: Context) -> tuple[list[Unit], dict]:
    """Every language-model linear -> int8 per output channel, activations int8 dynamic per token."""
    return _quantize_linears(units, cfg, lambda u: int8_unit(u, ctx), "int-quantized", W8, A8)


def text_only(units: list[Unit], cfg: dict, ctx: Context) -> tuple[list[Unit], dict]:
    """Drop the towers and their config; rename model.language_model.* to model.*."""
    del ctx
    if cfg.get("model_type") == "gemma4_text":
        return units, cfg
    kept = [u for u in units if not u.outs[0].name.startswith(TOWERS)]
    kept = [renamed(u, lambda n: n.replace("model.language_model.", "model.", 1)) for u in kept]
    tc = copy.deepcopy(cfg["text_config"])
    tc["architectures"] = ["Gemma4ForCausalLM"]
    for key in ("dtype", "torch_dtype", "transformers_version"):
        if key in cfg:
            tc[key] = cfg[key]
    tc["tie_word_embeddings"] = cfg.get("tie_word_embeddings", tc.get("tie_word_embeddings", True))
    if "quantization_config" in cfg:
        qc = copy.deepcopy(cfg["quantization_config"])
        qc["ignore"] = [i for i in qc.get("ignore", []) if i not in TOWER_IGNORE]
        tc["quantization_config"] = qc
    return kept, tc


def embed_int4(embed_tokens: bool) -> Step:
    """The per-layer table (and with ``embed_tokens`` also embed_tokens + an untied lm_head) -> int4."""

    def step(units: list[Unit], cfg: dict, ctx: Context) -> tuple[list[Unit], dict]:
        wanted = {"embed_tokens_per_layer"} | ({"embed_tokens"} if embed_tokens else set())
        out = []
        found = set()
        for u in units:
            m = EMBED.match(u.outs[0].name) if len(u.outs) == 1 else None
            if m and m.group(1) in wanted:
                if u.outs[0].dtype not in FLOATS:
                    raise ValueError(f"{u.outs[0].name} is already quantized")
                extra = ("lm_head",) if m.group(1) == "embed_tokens" else ()
                u = int4_unit(u, ctx, extra)
                found.add(m.group(1))
            out.append(u)
        missing = wanted - found
        if missing:
            raise ValueError(f"no {' or '.join(sorted(missing))} table in the input (already converted?)")
        cfg = copy.deepcopy(cfg)
        targets = ["re:.*embed_tokens_per_layer$"]
        if embed_tokens:
            targets += ["re:.*embed_tokens$", "re:.*lm_head$"]
            cfg["tie_word_embeddings"] = False
            if "text_config" in cfg:
                cfg["text_config"]["tie_word_embeddings"] = False
        qc = cfg.get("quantization_config") or _qconfig("pack-quantized", {}, [])
        qc.setdefault("config_groups", {})
        if embed_tokens:
            qc["ignore"] = [i for i in qc.get("ignore", []) if i != "lm_head"]
        group = {"targets": targets, "weights": W4, "input_activations": None, "output_activations": None}
        qc["config_groups"][f"group_{len(qc['config_groups'])}"] = group
        if qc.get("format") not in (None, "pack-quantized"):
            # int4 tables beside W8A8 linears: each group then names its own format.
            qc["config_groups"][f"group_{len(qc['config_groups']) - 1}"]["format"] = "pack-quantized"
            qc["format"] = "mixed-precision"
        cfg["quantization_config"] = qc
        return out, cfg

    step.__name__ = "embed_int4+embed_tokens" if embed_tokens else "embed_int4"
    return step


STEPS: dict[str, list[Step]] = {
    "w4a16": [repack],
    "text": [repack, text_only],
    "emb4": [repack, text_only, embed_int4(embed_tokens=True)],
    "w8a8": [w8a8, text_only],
}
