"""What tpu-inference 0.29.0 lacks to serve the rig's W8A8 Gemma 4 E2B: the patch and its check.

``tpu-inference==0.29.0`` is the JAX backend of ``vllm-tpu==0.29.0``. Read from the released wheel,
it has neither of these, both of which a one-chip Cloud TPU rig needs for the ``w8a8`` build
(text-only ``Gemma4ForCausalLM``, compressed-tensors ``int-quantized``):

1. an int8 W8A8 linear method on the JAX compressed-tensors path: ``get_quant_method`` picks a
   method for fp8 W8A8 only and raises ``NotImplementedError`` for every other scheme;
2. a text-only Gemma 4: the JAX model reads ``hf_config.text_config`` (a ``gemma4_text`` config
   has none) and loads ``model.language_model.*`` names only (a text-only checkpoint has
   ``model.*``);
3. KV-shared layers that own no K/V: 0.29.0 allocates ``k_proj``/``v_proj``/``k_norm`` on them
   (never used: they read the source layer's cache), so the loader demands tensors that QAT
   exports, and the rig's checkpoints, do not have (tpu-inference pull request #3299, open).

What 0.29.0 already has is left alone: the KV-sharing itself (shared layers read their source
layer's cache slot with ``update_kv_cache=False``), and per-token int8 activation quantization
in ``xla_quantized_matmul`` (used by the fp8 path, not reachable for int8 checkpoints).

The patch is two new files (pure code that tests import without the rest of vllm-tpu) and exact
text replacements in two released files. Each released file is recognised by its sha256 (the
wheel's RECORD); every replacement's original text must occur exactly once. Removal reverses the
replacements and checks the result's sha256 against the release, so ``absent`` restores the
original bytes or changes nothing. A file in any other state is refused, naming what differs.

Like ``turing_clamp.py`` this file stays free of Ansible imports: ``library/tpu_inference_patch.py``
imports it as ``ansible.module_utils.tpu_inference_patch``, and its ``checker`` option writes this
very file to the rig, where ``python tpu_inference_patch.py check --python PY`` is the command the
unit runs before every start (exit 0 only when the installed tpu-inference carries the whole patch).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass

VERSION = "0.29.0"
PACKAGE = "tpu_inference"
MARK = "gemma-rig"


class PatchError(Exception):
    """The tree cannot be patched, unpatched or checked; the message says why."""


@dataclass(frozen=True)
class Hunk:
    """One exact replacement: ``before`` (0.29.0's text, once in the file) becomes ``after``."""

    name: str
    before: str
    after: str


@dataclass(frozen=True)
class FilePatch:
    """A released file, identified by its sha256 in the 0.29.0 wheel's RECORD, and its hunks."""

    path: str  # relative to the tpu_inference package directory
    sha256: str
    hunks: tuple[Hunk, ...]


@dataclass(frozen=True)
class NewFile:
    """A file the patch adds to the package; ``absent`` deletes it only if it is still ours."""

    path: str
    text: str


# --- the new files --------------------------------------------------------------------------------

INT8_MODULE = "layers/jax/quantization/gemma_rig_int8.py"
INT8_TEXT = '''\
# Added by gemma-rig's tpu_inference_patch (state=absent removes it). Pure JAX, on purpose: the rig's
# tests import this file alone and check it on JAX's CPU backend against a float reference.
"""Int8 W8A8 matmul for compressed-tensors ``int-quantized`` checkpoints.

Weights are static int8 per output channel (``weight_scale[out, 1]``); activations are quantized
here, per token, dynamic and symmetric, so the matrix units multiply int8 x int8 into int32 and
the result is scaled once by both scales.
"""

import jax
import jax.numpy as jnp

INT8_MAX = 127.0


def quantize_per_token_int8(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(q, scale) with x ~= q * scale: one float32 scale per row (token), q int8 in [-127, 127]."""
    xf = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(xf), axis=-1, keepdims=True)
    # An all-zero row keeps scale 1 so the division stays finite; its q is 0 either way.
    scale = jnp.where(amax > 0, amax / INT8_MAX, 1.0)
    q = jnp.clip(jnp.round(xf / scale), -INT8_MAX, INT8_MAX).astype(jnp.int8)
    return q, scale


def w8a8_int8_matmul(x: jax.Array, w_q: jax.Array, w_scale: jax.Array, out_dtype=None) -> jax.Array:
    """x [T, K] float, w_q [K, N] int8, w_scale [N] (or [N, 1]) -> [T, N] in out_dtype (x's dtype)."""
    x_q, x_scale = quantize_per_token_int8(x)
    # Summed in int32: exact while K * 127 * 127 < 2**31, i.e. K < 133,143 (E2B's widest is 12,288).
    acc = jax.lax.dot_general(
        x_q, w_q, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32
    )
    out = acc.astype(jnp.float32) * x_scale * w_scale.astype(jnp.float32).reshape(1, -1)
    return out.astype(out_dtype or x.dtype)
'''

TEXT_ONLY_MODULE = "models/jax/gemma_rig_text_only.py"
TEXT_ONLY_TEXT = '''\
# Added by gemma-rig's tpu_inference_patch (state=absent removes it). No imports beyond re: the
# rig's tests load a real gemma4_text config and check these without the rest of vllm-tpu.
"""What the JAX Gemma 4 needs to load a text-only checkpoint and KV-shared layers without K/V."""

import re

# A text-only checkpoint (Gemma4ForCausalLM, gemma4_text) names its weights model.X; the
# multimodal release names them model.language_model.X, which is where the JAX model keeps them.
TEXT_ONLY_NAME = re.compile(r"^model\\.(?!language_model\\.)")


def text_config_of(hf_config):
    """The text config: ``text_config`` of a multimodal config, a ``gemma4_text`` config itself."""
    text_config = getattr(hf_config, "text_config", None)
    return hf_config if text_config is None else text_config


def kv_shared_kv_names(layer_indices):
    """A pattern for the K/V tensors (k_proj, v_proj, k_norm) of the KV-shared layers, or None."""
    if not layer_indices:
        return None
    alternatives = "|".join(str(i) for i in sorted(layer_indices))
    return re.compile(
        r"^model\\.(?:language_model\\.)?layers\\.(?:" + alternatives
        + r")\\.self_attn\\.(?:k_proj|v_proj|k_norm)\\."
    )
'''

# --- the replacements -----------------------------------------------------------------------------

_CT_CLASSES_AFTER = '''\
# >>> gemma-rig: int8 W8A8 >>>
# compressed-tensors int-quantized W8A8: static int8 weights per output channel, dynamic symmetric
# int8 activations per token. 0.29.0 has a JAX method for fp8 W8A8 only; these reuse the fp8
# per-channel methods' parameters and loaders (the loader keeps the checkpoint's int8 dtype) and
# multiply int8 x int8 -> int32 in gemma_rig_int8.w8a8_int8_matmul.
from tpu_inference.layers.jax.quantization.gemma_rig_int8 import \\
    w8a8_int8_matmul  # noqa: E402


def _rig_arg(args, name):
    value = getattr(args, name, None)
    return getattr(value, "value", value)


def _rig_is_int8_w8a8(weight_quant, input_quant) -> bool:
    """True for exactly the rig's scheme, so any other int8 layout still fails loudly."""
    if weight_quant is None or input_quant is None:
        return False
    return (_rig_arg(weight_quant, "type") == "int"
            and _rig_arg(weight_quant, "num_bits") == 8
            and _rig_arg(weight_quant, "strategy") == "channel"
            and _rig_arg(weight_quant, "symmetric") is True
            and not _rig_arg(weight_quant, "dynamic")
            and _rig_arg(input_quant, "type") == "int"
            and _rig_arg(input_quant, "num_bits") == 8
            and _rig_arg(input_quant, "strategy") == "token"
            and _rig_arg(input_quant, "symmetric") is True
            and _rig_arg(input_quant, "dynamic") is True)


class RigInt8ChannelLinearMethod(Fp8TensorwiseLinearMethod):
    """Int8 W8A8 per output channel for a JAX linear (q/k/v/o, down, per-layer projections)."""

    def create_weights_jax(self, layer, *weight_args, rngs,
                           **extra_weight_attrs):
        if getattr(self.linear_config, "n_shards", 1) != 1:
            # One chip is what the rig serves on; the fp8 path's shard reordering is not here.
            raise NotImplementedError(
                "gemma-rig int8 W8A8 is for one chip (tensor parallel 1)")
        super().create_weights_jax(layer,
                                   *weight_args,
                                   rngs=rngs,
                                   **extra_weight_attrs)
        # Same shape, sharding and loader as the fp8 method; an int8 placeholder so the abstract
        # model already has the dtype the checkpoint brings.
        layer.weight.set_value(
            jnp.zeros(layer.weight.get_value().shape, dtype=jnp.int8))

    def apply_jax(self, layer, x):
        if self.batch_features:
            raise NotImplementedError(
                "gemma-rig int8 W8A8: batched einsums are not supported")
        bias = layer.bias[...] if layer.bias is not None else None
        if len(x.shape) > 2:
            x = x.reshape(-1, self.in_features)
        out = w8a8_int8_matmul(x, layer.weight[...], layer.weight_scale[...])
        if bias is not None:
            out += bias
        return out.reshape(out.shape[:-1] + self.output_shape)


class RigInt8ChannelMergedLinearMethod(RigInt8ChannelLinearMethod,
                                       Fp8TensorwiseMergedLinearMethod):
    """The same for a merged linear (gate_up): the fp8 merged loaders join the shards."""


# <<< gemma-rig: int8 W8A8 <<<


class CompressedTensorsConfig(QuantizationConfig):
'''

_CT_DISPATCH_BEFORE = """\
        # TODO: w4a8 / wNa16 schemes need their own JAX methods (not yet ported).
        raise NotImplementedError(
"""
_CT_DISPATCH_AFTER = (
    """\
        # >>> gemma-rig: int8 W8A8 >>>
        if _rig_is_int8_w8a8(weight_quant, input_quant):
            if isinstance(layer, JaxMergedColumnParallelLinear):
                return RigInt8ChannelMergedLinearMethod(layer, linear_config)
            return RigInt8ChannelLinearMethod(layer, linear_config)
        # <<< gemma-rig: int8 W8A8 <<<
"""
    + _CT_DISPATCH_BEFORE
)

# The import added below needs jnp, which 0.29.0's compressed_tensors.py does not import.
_CT_IMPORT_BEFORE = "from types import MappingProxyType\nfrom typing import Optional\n"
_CT_IMPORT_AFTER = (
    _CT_IMPORT_BEFORE + "\nimport jax.numpy as jnp  # gemma-rig: int8 W8A8 (the int8 placeholder)\n"
)

COMPRESSED_TENSORS = FilePatch(
    path="layers/jax/quantization/compressed_tensors.py",
    sha256="fca97cd70efa07cc1896acb5017df72e1adf064301f54c9cbdba7b4fa34f39a3",
    hunks=(
        Hunk("jnp import", _CT_IMPORT_BEFORE, _CT_IMPORT_AFTER),
        Hunk(
            "int8 methods (before CompressedTensorsConfig)",
            "class CompressedTensorsConfig(QuantizationConfig):\n",
            _CT_CLASSES_AFTER,
        ),
        Hunk("int8 dispatch (before the NotImplementedError)", _CT_DISPATCH_BEFORE, _CT_DISPATCH_AFTER),
    ),
)

_G4_IMPORT_BEFORE = "from tpu_inference.models.common.kv_share import compute_kv_share_map\n"
_G4_IMPORT_AFTER = _G4_IMPORT_BEFORE + (
    "from tpu_inference.models.jax.gemma_rig_text_only import (  # gemma-rig\n"
    "    TEXT_ONLY_NAME, kv_shared_kv_names, text_config_of)\n"
)

_G4_SHARED_INIT_BEFORE = (
    '            self.kv_sharing_target_layer_name = (\n                f"layer.{kv_share_map[layer_idx]}")\n'
)
_G4_SHARED_INIT_AFTER = _G4_SHARED_INIT_BEFORE + (
    "        # >>> gemma-rig: KV-shared layers own no K/V (tpu-inference #3299) >>>\n"
    "        # __call__ reads their K/V from the source layer's cache slot (update_kv_cache=False),\n"
    "        # so their own k_proj/v_proj/k_norm are never used, and QAT exports (the rig's\n"
    "        # checkpoints among them) do not carry them: the loader would demand them.\n"
    "        if self.is_kv_shared_layer:\n"
    "            self.k_proj = None\n"
    "            self.v_proj = None\n"
    "            self.k_norm = None\n"
    "        # <<< gemma-rig <<<\n"
)

_G4_SHARED_CALL_BEFORE = (
    "        k = self.k_proj(x)\n        v = self.v_proj(x) if self.v_proj is not None else k\n"
)
_G4_SHARED_CALL_AFTER = (
    "        # >>> gemma-rig: KV-shared layers own no K/V (tpu-inference #3299) >>>\n"
    "        if self.k_proj is None:\n"
    "            # Shape-only operands: with update_kv_cache=False the kernel reads K/V from the\n"
    "            # source layer's cache and never these (what 0.29.0 computed here was unused too).\n"
    "            k = v = jnp.zeros((x.shape[0], self.num_kv_heads, self.head_dim), x.dtype)\n"
    "        else:\n"
    "            k = self.k_proj(x)\n"
    "            v = self.v_proj(x) if self.v_proj is not None else k\n"
    "        # <<< gemma-rig <<<\n"
)

_G4_DECODER_BEFORE = "        text_config: Gemma4TextConfig = config.hf_config.text_config\n"
_G4_DECODER_AFTER = (
    "        text_config: Gemma4TextConfig = text_config_of(config.hf_config)  # gemma-rig: text-only\n"
)
_G4_MODEL_BEFORE = "        text_config = hf_config.text_config\n"
_G4_MODEL_AFTER = "        text_config = text_config_of(hf_config)  # gemma-rig: text-only\n"
_G4_SOFTCAP_BEFORE = (
    "        self.final_logit_softcapping = getattr(\n"
    '            model_config.hf_config.text_config, "final_logit_softcapping",\n'
    "            None)\n"
)
_G4_SOFTCAP_AFTER = (
    "        self.final_logit_softcapping = getattr(  # gemma-rig: text-only\n"
    '            text_config_of(model_config.hf_config), "final_logit_softcapping",\n'
    "            None)\n"
)
_G4_LM_HEAD_BEFORE = "                hidden_size = model_config.hf_config.text_config.hidden_size\n"
_G4_LM_HEAD_AFTER = (
    "                hidden_size = text_config_of(\n"
    "                    model_config.hf_config).hidden_size  # gemma-rig: text-only\n"
)
_G4_MAPPER_BEFORE = '        mapper = WeightsMapper(orig_to_new_prefix={"model.": ""})\n'
_G4_MAPPER_AFTER = (
    "        # >>> gemma-rig: text-only names, KV-shared layers without K/V >>>\n"
    "        # model.X (text-only) -> model.language_model.X before the prefix is stripped; the K/V\n"
    "        # tensors of KV-shared layers (Google's full release ships them) have no parameter.\n"
    '        _rig_regex = {TEXT_ONLY_NAME: "model.language_model."}\n'
    "        _rig_shared = kv_shared_kv_names(\n"
    "            compute_kv_share_map(\n"
    "                text_config_of(self.vllm_config.model_config.hf_config)))\n"
    "        if _rig_shared is not None:\n"
    "            _rig_regex = {_rig_shared: None, **_rig_regex}\n"
    "        mapper = WeightsMapper(orig_to_new_regex=_rig_regex,\n"
    '                               orig_to_new_prefix={"model.": ""})\n'
    "        # <<< gemma-rig <<<\n"
)

GEMMA4 = FilePatch(
    path="models/jax/gemma4.py",
    sha256="ae119654fe765fd717b00ea285401bd0a29b1fa349bfc6a5a8a411460be0fb60",
    hunks=(
        Hunk("gemma_rig_text_only import", _G4_IMPORT_BEFORE, _G4_IMPORT_AFTER),
        Hunk("KV-shared layers drop k_proj/v_proj/k_norm", _G4_SHARED_INIT_BEFORE, _G4_SHARED_INIT_AFTER),
        Hunk("KV-shared layers compute no K/V", _G4_SHARED_CALL_BEFORE, _G4_SHARED_CALL_AFTER),
        Hunk("decoder layer text config", _G4_DECODER_BEFORE, _G4_DECODER_AFTER),
        Hunk("model text config", _G4_MODEL_BEFORE, _G4_MODEL_AFTER),
        Hunk("final logit softcapping", _G4_SOFTCAP_BEFORE, _G4_SOFTCAP_AFTER),
        Hunk("lm_head hidden size", _G4_LM_HEAD_BEFORE, _G4_LM_HEAD_AFTER),
        Hunk("weight names", _G4_MAPPER_BEFORE, _G4_MAPPER_AFTER),
    ),
)

FILE_PATCHES: tuple[FilePatch, ...] = (COMPRESSED_TENSORS, GEMMA4)
NEW_FILES: tuple[NewFile, ...] = (NewFile(INT8_MODULE, INT8_TEXT), NewFile(TEXT_ONLY_MODULE, TEXT_ONLY_TEXT))


# --- text surgery ---------------------------------------------------------------------------------


def sha256_text(text: str) -> str:
    """The sha256 of ``text`` as UTF-8 bytes (the files are read and written with newline='')."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _count(text: str, lines: str) -> int:
    """How often ``lines`` occurs in ``text`` as whole lines (an indented copy does not count)."""
    return ("\n" + text).count("\n" + lines)


def _replace(text: str, old: str, new: str) -> str:
    """``text`` with the one whole-line occurrence of ``old`` replaced by ``new``."""
    return ("\n" + text).replace("\n" + old, "\n" + new, 1)[1:]


def _first_bad_anchor(fp: FilePatch, text: str, side: str) -> str:
    for hunk in fp.hunks:
        anchor = hunk.before if side == "before" else hunk.after
        found = _count(text, anchor)
        if found != 1:
            state = "missing" if found == 0 else f"found {found} times"
            return f"anchor '{hunk.name}' is {state}"
    return "every anchor is there, but other bytes differ"


def apply_file(fp: FilePatch, original: str) -> str:
    """``original`` (0.29.0's file, checked by sha256) with every hunk applied."""
    if sha256_text(original) != fp.sha256:
        raise PatchError(
            f"{fp.path} is not tpu-inference {VERSION}'s (sha256 {sha256_text(original)[:12]}..., "
            f"expected {fp.sha256[:12]}...): {_first_bad_anchor(fp, original, 'before')}; left unchanged"
        )
    text = original
    for hunk in fp.hunks:
        # Checked on the original above, but a hunk must not create another hunk's anchor either.
        if _count(text, hunk.before) != 1:
            raise PatchError(f"{fp.path}: anchor '{hunk.name}' is not unique while patching (a bug)")
        text = _replace(text, hunk.before, hunk.after)
    compile(text, fp.path, "exec")  # a SyntaxError here is a bug in the hunks
    return text


def revert_file(fp: FilePatch, patched: str) -> str:
    """The 0.29.0 bytes from a patched file, or PatchError if it is not exactly our patch."""
    text = patched
    for hunk in reversed(fp.hunks):
        if _count(text, hunk.after) != 1:
            raise PatchError(f"{fp.path}: patched text of '{hunk.name}' not found once; left unchanged")
        text = _replace(text, hunk.after, hunk.before)
    if sha256_text(text) != fp.sha256:
        raise PatchError(f"{fp.path}: removing the patch does not give {VERSION}'s file back; left unchanged")
    return text


def file_state(fp: FilePatch, text: str) -> str:
    """'original' (0.29.0 as released), 'patched' (exactly our patch of it) or 'foreign'."""
    if sha256_text(text) == fp.sha256:
        return "original"
    try:
        original = revert_file(fp, text)
    except PatchError:
        return "foreign"
    return "patched" if apply_file(fp, original) == text else "foreign"


# --- the package directory ------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One file: its text before and after (None: the file does not exist / is deleted)."""

    path: str  # relative to the package directory
    before: str | None
    after: str | None

    @property
    def changed(self) -> bool:
        return self.before != self.after


def _read(path: str) -> str | None:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", newline="") as fh:
        return fh.read()


def plan(package_dir: str, state: str) -> list[Change]:
    """Every file the patch owns, with the text it has and the text ``state`` wants.

    ``present`` and ``absent`` fail (PatchError, nothing planned) on any file in a state they
    do not know; ``check`` fails unless every file is already patched.
    """
    if state not in ("present", "absent", "check"):
        raise PatchError(f"unknown state {state!r}")
    if not os.path.isfile(os.path.join(package_dir, "__init__.py")):
        raise PatchError(f"{package_dir} is not a package directory (no __init__.py)")
    changes: list[Change] = []
    for fp in FILE_PATCHES:
        full = os.path.join(package_dir, fp.path)
        text = _read(full)
        if text is None:
            raise PatchError(f"{full} does not exist: not tpu-inference {VERSION}")
        current = file_state(fp, text)
        if current == "foreign":
            raise PatchError(
                f"{full} is neither tpu-inference {VERSION}'s file nor the gemma-rig patch of it "
                f"({_first_bad_anchor(fp, text, 'before')}); left unchanged"
            )
        if state == "check" and current != "patched":
            raise PatchError(f"{full} is not patched (tpu-inference reinstalled or upgraded?)")
        if state == "present":
            after = text if current == "patched" else apply_file(fp, text)
        elif state == "absent":
            after = text if current == "original" else revert_file(fp, text)
        else:
            after = text
        changes.append(Change(fp.path, text, after))
    for nf in NEW_FILES:
        full = os.path.join(package_dir, nf.path)
        text = _read(full)
        if text is not None and text != nf.text:
            raise PatchError(f"{full} exists but is not the file gemma-rig adds; left unchanged")
        if state == "check" and text is None:
            raise PatchError(f"{full} is missing (tpu-inference reinstalled or upgraded?)")
        changes.append(Change(nf.path, text, nf.text if state in ("present", "check") else None))
    return changes


def write(package_dir: str, change: Change) -> None:
    """Make one planned change: write beside the target and rename (a crash leaves old or new)."""
    full = os.path.join(package_dir, change.path)
    if change.after is None:
        if os.path.exists(full):
            os.unlink(full)
        return
    mode = os.stat(full).st_mode & 0o7777 if os.path.exists(full) else 0o644
    tmp = f"{full}.{MARK}.tmp"
    with open(tmp, "w", encoding="utf-8", newline="") as fh:
        fh.write(change.after)
    os.chmod(tmp, mode)
    os.replace(tmp, full)


def locate(python: str, timeout: float = 60.0) -> str:
    """The tpu_inference package directory of ``python``, found without importing it (seconds, JAX)."""
    code = (
        "import importlib.util, sys\n"
        f"s = importlib.util.find_spec({PACKAGE!r})\n"
        f"sys.exit({PACKAGE!r} + ' is not installed for ' + sys.executable) if s is None else None\n"
        "print(list(s.submodule_search_locations)[0])\n"
    )
    try:
        res = subprocess.run(
            [python, "-I", "-c", code], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PatchError(f"cannot run {python}: {exc}") from exc
    if res.returncode != 0:
        raise PatchError(f"cannot locate {PACKAGE} with {python}: {(res.stderr or res.stdout).strip()}")
    return res.stdout.strip()


def check(package_dir: str) -> tuple[bool, str]:
    """(ok, message): ok only when every file of the patch is in place, exactly."""
    try:
        plan(package_dir, "check")
    except (OSError, UnicodeDecodeError, PatchError) as exc:
        return False, f"tpu-inference patch check failed: {exc}"
    return True, f"gemma-rig tpu-inference {VERSION} patch present in {package_dir}"


def main(argv: list[str] | None = None) -> int:
    """``check --python PY`` or ``check --package-dir DIR``: the unit's ExecStartPre."""
    parser = argparse.ArgumentParser(description=f"Check the gemma-rig patch of tpu-inference {VERSION}.")
    sub = parser.add_subparsers(dest="command", required=True)
    chk = sub.add_parser("check", help="exit 0 only when the patch is present, exactly")
    where = chk.add_mutually_exclusive_group()
    where.add_argument("--python", help="interpreter whose tpu_inference is checked (default: this one)")
    where.add_argument("--package-dir", help="the tpu_inference package directory")
    args = parser.parse_args(argv)
    try:
        package_dir = args.package_dir or locate(args.python or sys.executable)
    except PatchError as exc:
        print(exc, file=sys.stderr)
        return 1
    ok, message = check(package_dir)
    print(message, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
