"""The tpu-inference patch on the real released 0.29.0 source (downloaded once, cached in build/).

What 0.29.0 already has is asserted on the released text; what the patch adds is applied to a copy,
checked for idempotence, byte-exact removal and refusal of foreign code, run through the Ansible
module, and its code is executed: the text-only config path on the tiny W8A8 config with
transformers, the int8 matmul on JAX's CPU backend (the jax that 0.29.0 pins) against a float
reference.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.unit import tpu_wheel
from tests.unit.test_turing_clamp_module import playbook, sha256

sys.path.insert(0, str(ROOT / "module_utils"))
import tpu_inference_patch as tp

CT = tp.COMPRESSED_TENSORS.path
G4 = tp.GEMMA4.path


@pytest.fixture(scope="session")
def released() -> Path:
    """The released tpu_inference package directory (read only)."""
    return tpu_wheel.released_package()


def package_copy(released: Path, dest: Path) -> Path:
    """The files the patch touches (and the package marker), copied out of the release."""
    pkg = dest / "tpu_inference"
    for rel in ("__init__.py", CT, G4, "models/common/kv_share.py"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(released / rel, pkg / rel)
    return pkg


@pytest.fixture
def pkg(released: Path, tmp_path: Path) -> Path:
    return package_copy(released, tmp_path)


@pytest.fixture
def patched(pkg: Path) -> Path:
    for change in tp.plan(str(pkg), "present"):
        tp.write(str(pkg), change)
    return pkg


def load_file(path: Path, name: str) -> ModuleType:
    """Import one file by path (the patched tree's own copy, not a package install)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tree_digest(pkg: Path) -> dict[str, str]:
    return {str(p.relative_to(pkg)): sha256(p) for p in sorted(pkg.rglob("*")) if p.is_file()}


# --- the release: what it has and lacks ---------------------------------------------------------


def test_known_digests_are_the_wheels_record() -> None:
    record = tpu_wheel.record()
    for fp in tp.FILE_PATCHES:
        assert record[f"tpu_inference/{fp.path}"] == fp.sha256, fp.path
    for nf in tp.NEW_FILES:
        assert f"tpu_inference/{nf.path}" not in record, f"0.29.0 already ships {nf.path}"


def test_release_already_shares_kv_but_allocates_kv_on_shared_layers(released: Path) -> None:
    """0.29.0 has KV sharing (the shared layers read the source's cache, write none) and builds
    k_proj/v_proj/k_norm on every layer anyway: the part of #3299 the patch adds."""
    text = (released / G4).read_text()
    assert "update_kv_cache=not self.is_kv_shared_layer" in text
    assert "self.kv_sharing_target_layer_name = (" in text
    init = text[
        text.index("class Gemma4Attention") : text.index(
            "    def __call__(", text.index("class Gemma4Attention")
        )
    ]
    assert "        self.k_proj = JaxEinsum(" in init and "        self.k_norm = JaxRmsNorm(" in init
    assert "self.k_proj = None" not in init


def test_release_lacks_text_only_and_int8(released: Path) -> None:
    g4 = (released / G4).read_text()
    assert g4.count("hf_config.text_config") == 4  # no fallback for a gemma4_text config
    assert 'WeightsMapper(orig_to_new_prefix={"model.": ""})' in g4  # model.X names go nowhere
    ct = (released / CT).read_text()
    assert "int8" not in ct.lower()
    assert "_is_fp8_w8a8" in ct and 'is not yet "\n            "supported in the JAX path' in ct


def test_release_already_pins_per_token_int8_in_the_fp8_helpers(released: Path) -> None:
    """0.29.0's xla_quantized_matmul quantizes activations per token, but only the fp8 methods reach
    it: nothing there is patched; the int8 path gets its own small function."""
    text = (released / "layers/common/linear.py").read_text()
    assert "x_q, x_scale = quantize_tensor(x, w_q.dtype)" in text


# --- text surgery on the released files ---------------------------------------------------------


def test_present_once_idempotent_and_absent_restores_bytes(pkg: Path) -> None:
    before = tree_digest(pkg)
    ok, message = tp.check(str(pkg))
    assert not ok and "not patched" in message

    first = tp.plan(str(pkg), "present")
    assert all(c.changed for c in first)
    for change in first:
        tp.write(str(pkg), change)
    ok, message = tp.check(str(pkg))
    assert ok, message
    patched_digest = tree_digest(pkg)
    assert not any(c.changed for c in tp.plan(str(pkg), "present"))  # idempotent
    for rel in (CT, G4):
        text = (pkg / rel).read_text()
        assert text.count(f"# >>> {tp.MARK}") >= 1
        compile(text, rel, "exec")

    for change in tp.plan(str(pkg), "absent"):
        tp.write(str(pkg), change)
    assert tree_digest(pkg) == before  # the released bytes, the added files gone
    assert not any(c.changed for c in tp.plan(str(pkg), "absent"))
    assert patched_digest != before


@pytest.mark.parametrize("fp", tp.FILE_PATCHES, ids=lambda fp: fp.path)
def test_every_hunk_is_exact(fp: tp.FilePatch, released: Path) -> None:
    original = (released / fp.path).read_text()
    for hunk in fp.hunks:
        assert tp._count(original, hunk.before) == 1, hunk.name
    patched = tp.apply_file(fp, original)
    assert tp.revert_file(fp, patched) == original
    assert tp.file_state(fp, patched) == "patched" and tp.file_state(fp, original) == "original"


@pytest.mark.parametrize(
    ("fp", "hunk"),
    [(fp, h) for fp in tp.FILE_PATCHES for h in fp.hunks],
    ids=lambda v: v.name if isinstance(v, tp.Hunk) else v.path,
)
def test_a_modified_anchor_is_refused_and_named(pkg: Path, fp: tp.FilePatch, hunk: tp.Hunk) -> None:
    target = pkg / fp.path
    text = target.read_text()
    first_line = hunk.before.splitlines(keepends=True)[0]
    target.write_text(text.replace(first_line, first_line.replace(" ", "  ", 1), 1))
    before = tree_digest(pkg)
    with pytest.raises(tp.PatchError, match=re.escape(f"anchor '{hunk.name}' is missing")):
        tp.plan(str(pkg), "present")
    assert tree_digest(pkg) == before


def test_other_bytes_and_edited_patch_are_refused(patched: Path) -> None:
    target = patched / G4
    target.write_text(target.read_text().replace("self.k_proj = None", "self.k_proj = None  # edited", 1))
    for state in ("present", "absent", "check"):
        with pytest.raises(
            tp.PatchError, match=re.escape("neither tpu-inference 0.29.0's file nor the gemma-rig patch")
        ):
            tp.plan(str(patched), state)


def test_a_foreign_added_file_is_never_deleted(patched: Path) -> None:
    added = patched / tp.INT8_MODULE
    added.write_text(added.read_text() + "# someone's edit\n")
    with pytest.raises(tp.PatchError, match="is not the file gemma-rig adds"):
        tp.plan(str(patched), "absent")
    assert added.exists()


# --- the Ansible module and the start-time check ------------------------------------------------


def test_module_check_mode_diff_idempotence_and_check_state(pkg: Path, tmp_path: Path) -> None:
    original = tree_digest(pkg)

    def step(state: str, **extra: Any) -> dict[str, Any]:
        return {
            "tpu_inference_patch": {"package_dir": str(pkg), "state": state},
            "ignore_errors": True,
            **extra,
        }

    results = playbook(
        tmp_path,
        [
            step("check"),  # 0: fails, not patched
            step("present", check_mode=True, diff=True),  # 1: would change
            step("present"),  # 2: changed
            step("present"),  # 3: not changed
            step("check"),  # 4: ok, not changed
            step("absent", check_mode=True),  # 5: would change
            step("absent"),  # 6: changed
            step("absent"),  # 7: not changed
        ],
    )
    assert results[0]["failed"] and "not patched" in results[0]["msg"]
    assert results[1]["changed"] and not results[1].get("failed")
    assert any("w8a8_int8_matmul" in d["after"] for d in results[1]["diff"])
    assert results[2]["changed"] and not results[2].get("failed")
    assert not results[3]["changed"] and not results[3].get("failed")
    assert not results[4]["changed"] and not results[4].get("failed")
    assert results[5]["changed"] and results[6]["changed"] and not results[7]["changed"]
    assert tree_digest(pkg) == original


def test_module_refuses_foreign_code(pkg: Path, tmp_path: Path) -> None:
    target = pkg / CT
    target.write_text(target.read_text().replace("raise NotImplementedError(\n", "raise ValueError(\n"))
    before = tree_digest(pkg)
    results = playbook(tmp_path, [{"tpu_inference_patch": {"package_dir": str(pkg)}, "ignore_errors": True}])
    assert results[0]["failed"] and "anchor 'int8 dispatch" in results[0]["msg"]
    assert tree_digest(pkg) == before


def test_check_cli(patched: Path) -> None:
    cli = [sys.executable, str(ROOT / "module_utils" / "tpu_inference_patch.py"), "check", "--package-dir"]
    ok = subprocess.run([*cli, str(patched)], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    (patched / tp.TEXT_ONLY_MODULE).unlink()
    missing = subprocess.run([*cli, str(patched)], capture_output=True, text=True, check=False)
    assert missing.returncode == 1 and "is missing" in missing.stderr


# --- the patched code, executed -----------------------------------------------------------------


def tiny_w8a8_text_config() -> dict[str, Any]:
    """The tiny text-only W8A8 config.json as the repack steps write it (no model is built)."""
    from repack import make_tiny_qat, steps

    units, cfg = steps._quantize_linears(
        [], make_tiny_qat.full_config(), None, "int-quantized", steps.W8, steps.A8
    )
    units, cfg = steps.text_only(units, cfg, None)
    return cfg


def test_text_only_config_path_on_the_tiny_w8a8_config(patched: Path) -> None:
    from transformers import AutoConfig

    cfg_dict = tiny_w8a8_text_config()
    assert cfg_dict["architectures"] == ["Gemma4ForCausalLM"] and cfg_dict["model_type"] == "gemma4_text"
    text_cfg = AutoConfig.for_model(**copy.deepcopy(cfg_dict))
    assert not hasattr(text_cfg, "text_config")  # what 0.29.0 reads
    full_cfg = AutoConfig.for_model(**make_full_config())

    helpers = load_file(patched / tp.TEXT_ONLY_MODULE, "gemma_rig_text_only")
    kv_share = load_file(patched / "models/common/kv_share.py", "kv_share")
    assert helpers.text_config_of(text_cfg) is text_cfg
    assert helpers.text_config_of(full_cfg) is full_cfg.text_config
    # What the patched Gemma4ForCausalLM.__init__ reads.
    assert getattr(helpers.text_config_of(text_cfg), "final_logit_softcapping", None) == 30.0
    assert helpers.text_config_of(text_cfg).hidden_size == 256

    # The patched load_weights' mapper, built the same way, on vLLM's own WeightsMapper.
    from vllm.model_executor.models.utils import WeightsMapper

    shared = kv_share.compute_kv_share_map(helpers.text_config_of(text_cfg))
    assert sorted(shared) == [6, 7, 8, 9]
    regex = {helpers.kv_shared_kv_names(shared): None, helpers.TEXT_ONLY_NAME: "model.language_model."}
    mapper = WeightsMapper(orig_to_new_regex=regex, orig_to_new_prefix={"model.": ""})
    assert (
        mapper._map_name("model.layers.0.self_attn.k_proj.weight")
        == "language_model.layers.0.self_attn.k_proj.weight"
    )
    assert mapper._map_name("model.language_model.norm.weight") == "language_model.norm.weight"
    assert mapper._map_name("model.embed_tokens.weight") == "language_model.embed_tokens.weight"
    assert (
        mapper._map_name("model.layers.9.self_attn.q_proj.weight")
        == "language_model.layers.9.self_attn.q_proj.weight"
    )
    for name in (
        "model.layers.9.self_attn.k_norm.weight",
        "model.language_model.layers.6.self_attn.v_proj.weight",
    ):
        assert mapper._map_name(name) is None, name
    assert mapper._map_name("model.layers.5.self_attn.k_norm.weight") is not None


def make_full_config() -> dict[str, Any]:
    from repack import make_tiny_qat

    return make_tiny_qat.full_config()


def test_int8_dispatch_recognises_the_tiny_w8a8_scheme_only(patched: Path) -> None:
    """The patched scheme test, run on the scheme vLLM's own compressed-tensors parser reads from
    the tiny W8A8 config; fp8 and W4A16 schemes stay with 0.29.0's code."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    tree = ast.parse((patched / CT).read_text())
    funcs = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("_rig_arg", "_rig_is_int8_w8a8")
    ]
    scope: dict[str, Any] = {}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), CT, "exec"), scope)  # the shipped functions
    is_int8 = scope["_rig_is_int8_w8a8"]

    ct = CompressedTensorsConfig.from_config(tiny_w8a8_text_config()["quantization_config"])
    scheme = ct.target_scheme_map["Linear"]
    assert is_int8(scheme["weights"], scheme["input_activations"])
    assert not ct._is_fp8_w8a8(scheme["weights"], scheme["input_activations"])  # 0.29.0 would raise

    from repack import steps

    w4 = CompressedTensorsConfig.from_config(
        steps._qconfig("pack-quantized", {"g": {"targets": ["Linear"], "weights": steps.W4}}, [])
    )
    assert not is_int8(
        w4.target_scheme_map["Linear"]["weights"], w4.target_scheme_map["Linear"]["input_activations"]
    )

    # And the patched method calls that function (the code the numerics test runs).
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RigInt8ChannelLinearMethod")
    calls = {c.func.id for c in ast.walk(cls) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    assert "w8a8_int8_matmul" in calls


NUMERICS = r"""
import importlib.util, json, sys
import numpy as np
import jax, jax.numpy as jnp

spec = importlib.util.spec_from_file_location("gemma_rig_int8", sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
rng = np.random.default_rng(0)
T, K, N = 8, 512, 192  # a tiny layer; K = 512 as E2B's q_proj of a sliding layer sees 1536
x = rng.standard_normal((T, K)).astype(np.float32) * rng.uniform(0.1, 10.0, (T, 1)).astype(np.float32)
x[3] = 0.0  # a padding token: all zeros
w_q = rng.integers(-127, 128, (K, N), dtype=np.int8)
w_s = rng.uniform(1e-4, 1e-2, (N,)).astype(np.float32)

out = np.asarray(jax.jit(mod.w8a8_int8_matmul)(jnp.asarray(x), jnp.asarray(w_q), jnp.asarray(w_s)))
# Float reference: the activations unquantized, the weights as the checkpoint defines them (q * s).
w = w_q.astype(np.float64) * w_s.astype(np.float64)
ref = x.astype(np.float64) @ w
# Bound. Per token t the quantizer uses s_t = amax_t / 127 and rounds, so x_tk = s_t q_tk + e_tk
# with |e_tk| <= s_t / 2 (no clipping: |x_tk| / s_t <= 127). The int8 x int8 sum is exact in int32,
# so the only other errors are float32's: the int32 -> float32 cast and two products, each within
# 2**-24 relative, on a value at most sum_k |s_t q_tk w_kn| <= sum_k (|x_tk| + s_t/2) |w_kn|.
# Hence |out - ref| <= (s_t / 2) * sum_k |w_kn| + 4 * 2**-24 * sum_k (|x_tk| + s_t / 2) |w_kn|.
s = np.abs(x).max(axis=1, keepdims=True).astype(np.float64) / 127.0
absw = np.abs(w).sum(axis=0, keepdims=True)
bound = s / 2 * absw + 4 * 2.0**-24 * ((np.abs(x) + s / 2) @ np.abs(w))
err = np.abs(out - ref)
print(json.dumps({
    "jax": jax.__version__, "backend": jax.default_backend(), "dtype": str(out.dtype),
    "max_abs_err": float(err.max()), "max_ratio": float((err / np.where(bound > 0, bound, 1)).max()),
    "max_abs_ref": float(np.abs(ref).max()), "zero_row_max": float(np.abs(out[3]).max()),
    "mean_rel_err": float((err.sum() / np.abs(ref).sum())),
}))
"""


@pytest.mark.slow
def test_int8_matmul_numerics_on_jax_cpu(patched: Path, tmp_path: Path, figure) -> None:
    """The shipped gemma_rig_int8.py, under the jax that 0.29.0 pins, within the rounding bound."""
    python = tpu_wheel.jax_python()
    script = tmp_path / "numerics.py"
    script.write_text(NUMERICS)
    res = subprocess.run(
        [str(python), str(script), str(patched / tp.INT8_MODULE)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    figure("int8 W8A8 matmul vs float reference (JAX CPU)", json.dumps(got))
    assert got["jax"] == tpu_wheel.pinned_jax() and got["backend"] == "cpu"
    assert got["dtype"] == "float32"
    assert got["max_ratio"] <= 1.0, got
    assert got["zero_row_max"] == 0.0
    # Not vacuous: the activations really were quantized (a float matmul would err ~1e-7).
    assert got["mean_rel_err"] > 1e-4, got
