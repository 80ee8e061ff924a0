"""The clamp, judged by the compiler: vLLM's real attention kernel compiled for a T4 (sm_75).

docs/facts.md: unclamped, head size 512 asks for 98304 bytes of shared memory and Turing allows
65536, so the first prefill dies with OutOfResources. Triton's CUDA backend (ptxas ships in the
wheel) compiles for sm_75 on a machine with no GPU, so this checks the real kernel, not a formula.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from module_utils import turing_clamp
from tests.conftest import VENV_BIN

pytestmark = pytest.mark.slow

T4_SHARED_LIMIT = 65536  # bytes per block with opt-in (48 KiB static)
PROBE = Path(__file__).with_name("sm75_probe.py")


def _vllm_attention_file() -> Path:
    return Path(turing_clamp.locate(str(VENV_BIN / "python")))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Shared memory of the kernel as vLLM launches it, clamped and not, per capability."""
    original = _vllm_attention_file().read_text()
    folder = tmp_path_factory.mktemp("sm75")
    results = {}
    for name, text in {"clamped": turing_clamp.apply(original), "original": original}.items():
        path = folder / f"{name}.py"
        path.write_text(text)
        out = subprocess.run(
            [sys.executable, str(PROBE), str(path)], capture_output=True, text=True, timeout=900, check=False
        )
        assert out.returncode == 0, out.stderr[-4000:]
        lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        results[name] = {tuple(line["capability"]): line for line in lines}
    return results


def test_unclamped_kernel_overflows_the_t4(compiled, figure) -> None:
    shared = compiled["original"][(7, 5)]["shared_bytes"]
    figure("unclamped attention kernel, sm_75, head 512 fp16", f"{shared} bytes of shared memory")
    assert shared > T4_SHARED_LIMIT


def test_clamped_kernel_fits_the_t4(compiled, figure) -> None:
    launch = compiled["clamped"][(7, 5)]
    figure(
        "clamped attention kernel, sm_75, head 512 fp16",
        f"{launch['shared_bytes']} bytes, tile {launch['tile_size']}",
    )
    assert launch["shared_bytes"] <= T4_SHARED_LIMIT
    assert launch["options"] == {"num_stages": 1}
    assert launch["tile_size"] < compiled["original"][(7, 5)]["tile_size"]


def test_clamp_leaves_ampere_launch_unchanged(compiled) -> None:
    assert compiled["clamped"][(8, 0)] == compiled["original"][(8, 0)]
