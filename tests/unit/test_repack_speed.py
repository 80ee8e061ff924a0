"""measure/repack_speed.py: the synthetic release matches E2B's layout; --small runs end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "measure"))

import repack_speed  # noqa: E402

LM = "model.language_model."


def test_e2b_layout_matches_the_release():
    cfg, shapes = repack_speed.release_layout(small=False)
    s = dict(shapes)
    assert s[f"{LM}embed_tokens.weight"] == (262144, 1536)
    assert s[f"{LM}embed_tokens_per_layer.weight"] == (262144, 35 * 256)
    assert s[f"{LM}per_layer_model_projection.weight"] == (8960, 1536)
    assert s[f"{LM}layers.0.self_attn.k_proj.weight"] == (256, 1536)
    assert s[f"{LM}layers.4.self_attn.q_proj.weight"] == (4096, 1536)
    assert s[f"{LM}layers.4.self_attn.o_proj.weight"] == (1536, 4096)
    assert s[f"{LM}layers.14.mlp.gate_proj.weight"] == (6144, 1536)
    assert s[f"{LM}layers.34.mlp.down_proj.weight"] == (1536, 12288)
    assert s[f"{LM}layers.0.per_layer_input_gate.weight"] == (256, 1536)
    for i in range(15, 35):
        assert f"{LM}layers.{i}.self_attn.k_proj.weight" not in s
    assert any(k.startswith("model.vision_tower.") for k in s) and any(
        k.startswith("model.audio_tower.") for k in s
    )
    assert "lm_head.weight" not in s
    total = sum(2 * _numel(v) for v in s.values())
    assert abs(total - 10_246_621_918) / 10_246_621_918 < 0.03  # the release's size, within 3%
    assert cfg["text_config"]["global_head_dim"] == 512 and "per_layer_config" not in cfg["text_config"]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@pytest.mark.slow
def test_small_smoke_run(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "measure/repack_speed.py"),
            str(tmp_path / "w"),
            "--small",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    runs = {x["run"] for x in report["results"]}
    assert {"check", "repack (w4a16)", "build --target emb4 (one pass)"} <= runs
    for x in report["results"]:
        assert x["exit"] == 0 and x["wall_s"] > 0 and x["peak_rss_gib"] > 0 and x["copy_s"] > 0
    assert "x copy" in r.stdout


def test_fewer_layers_keep_e2b_shapes():
    cfg, shapes = repack_speed.release_layout(small=False, layers=10)
    s = dict(shapes)
    tc = cfg["text_config"]
    assert tc["num_hidden_layers"] == 10 and tc["num_kv_shared_layers"] == 5
    assert s[f"{LM}embed_tokens.weight"] == (262144, 1536)
    assert s[f"{LM}embed_tokens_per_layer.weight"] == (262144, 10 * 256)
    assert s[f"{LM}layers.0.self_attn.q_proj.weight"] == (2048, 1536)
    assert s[f"{LM}layers.4.self_attn.q_proj.weight"] == (4096, 1536)
    assert f"{LM}layers.5.self_attn.k_proj.weight" not in s  # KV-shared from layer 5 on
    assert f"{LM}layers.10.mlp.up_proj.weight" not in s


@pytest.mark.parametrize("layers", ["7", "5", "40"])
def test_layers_outside_the_e2b_pattern_are_refused(tmp_path, layers):
    with pytest.raises(SystemExit) as e:
        repack_speed.main([str(tmp_path / "w"), "--layers", layers])
    assert e.value.code == 2
    assert not (tmp_path / "w").exists()


def _vm_kib(field: str) -> int:
    """This process's ``field`` (VmRSS, VmHWM) from /proc/self/status, in KiB."""
    with open("/proc/self/status") as st:
        return int(next(line.split()[1] for line in st if line.startswith(field + ":")))


def test_peak_memory_is_the_childs_own(tmp_path):
    # The benchmark itself holds far more than the child: the child's figure must not inherit it.
    # No band that depends on the machine: the figure must cover what the child touched (its
    # array is freed when its script ends, before the figure is read, so only a high-water mark
    # covers it) and stay below this process's ballast, which an inherited figure would include.
    import numpy as np

    child, ballast_bytes = 64 << 20, 512 << 20
    ballast = np.ones(ballast_bytes, np.uint8)  # resident here (np.ones writes every page)
    assert _vm_kib("VmRSS") << 10 >= ballast_bytes
    script = tmp_path / "child.py"
    script.write_text(f"import numpy as np\nx = np.ones({child}, np.uint8)\n")
    wall, peak, code = repack_speed.run_child([sys.executable, str(script)])
    assert code == 0 and wall > 0
    assert child <= peak < ballast_bytes, (peak, _vm_kib("VmHWM") << 10)
    assert ballast[-1] == 1
