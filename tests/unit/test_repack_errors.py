"""Bad input gets a clear error naming what is wrong, and leaves nothing behind."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from repack import embed_int4, repack_q4_0, text_only, w8a8_from_qat
from tests.unit.repack_micro import SHARD, write_micro_qat


@pytest.fixture(scope="module")
def qat(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("err") / "qat"
    write_micro_qat(out)
    return out


@pytest.fixture
def copy(qat, tmp_path) -> Path:
    dst = tmp_path / "src"
    shutil.copytree(qat, dst)
    return dst


def _digest(d: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(d.iterdir()):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".tmp-" in p.name]


def _repack(src: Path, out: Path, *extra: str) -> int:
    return repack_q4_0.main(["repack", str(src), str(out), "-q", *extra])


def test_truncated_shard(copy, tmp_path, capsys):
    f = copy / SHARD
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    assert _repack(copy, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "truncated" in err and SHARD in err
    assert not (tmp_path / "out").exists()


def test_corrupt_header(copy, tmp_path, capsys):
    f = copy / SHARD
    data = bytearray(f.read_bytes())
    data[8:16] = b"garbage!"
    f.write_bytes(bytes(data))
    assert _repack(copy, tmp_path / "out") == 2
    assert SHARD in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_absurd_header_length(copy, tmp_path, capsys):
    f = copy / SHARD
    data = bytearray(f.read_bytes())
    data[:8] = struct.pack("<Q", 1 << 40)
    f.write_bytes(bytes(data))
    assert _repack(copy, tmp_path / "out") == 2
    assert "header" in capsys.readouterr().err


def test_missing_config(copy, tmp_path, capsys):
    (copy / "config.json").unlink()
    assert _repack(copy, tmp_path / "out") == 2
    assert "no config.json" in capsys.readouterr().err


def test_foreign_config(copy, tmp_path, capsys):
    (copy / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert _repack(copy, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "'llama'" in err and "Gemma 4" in err


def test_wrong_shape_for_group_size(copy, tmp_path, capsys):
    t = load_file(copy / SHARD)
    name = "model.language_model.layers.0.mlp.up_proj.weight"
    t[name] = torch.cat([t[name], t[name][:, :16]], dim=1).contiguous()  # 144 = 4.5 groups
    save_file(t, copy / SHARD, metadata={"format": "pt"})
    assert _repack(copy, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert name in err and "group size 32" in err
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_unwritable_out(qat, capsys):
    assert _repack(qat, Path("/proc/gemma-rig-repack-out")) == 2
    assert "cannot write" in capsys.readouterr().err
    assert _repack(qat, Path("/nonexistent-dir/sub/out")) == 2
    assert "does not exist" in capsys.readouterr().err


def test_existing_out_needs_force(qat, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("x")
    assert _repack(qat, out) == 2
    assert "--force" in capsys.readouterr().err
    assert (out / "keep").exists()
    assert _repack(qat, out, "--force") == 0
    assert not (out / "keep").exists() and (out / "config.json").exists()


def test_off_grid_input_aborts_names_tensors_and_leaves_no_out(copy, tmp_path, capsys):
    t = load_file(copy / SHARD)
    bad = [
        "model.language_model.layers.0.self_attn.q_proj.weight",
        "model.language_model.layers.1.mlp.down_proj.weight",
    ]
    for i, name in enumerate(bad):
        w = t[name].float()
        w[0, : 32 * (i + 1) : 32] += 0.00071  # i + 1 groups off the grid
        t[name] = w.to(torch.bfloat16)
    save_file(t, copy / SHARD, metadata={"format": "pt"})
    before = _digest(copy)
    for run in (
        lambda: _repack(copy, tmp_path / "out"),
        lambda: repack_q4_0.main(["build", str(copy), str(tmp_path / "out"), "--target", "emb4", "-q"]),
        lambda: repack_q4_0.main(["check", str(copy), "-q"]),
    ):
        assert run() == 3
        captured = capsys.readouterr()
        text = captured.err + captured.out
        assert bad[0] in text and bad[1] in text
        assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)
    assert _digest(copy) == before  # the source is never modified


def test_step_tools_refuse_bad_input(qat, tmp_path, capsys):
    # w8a8 wants a QAT source: a quantized input is refused.
    assert _repack(qat, tmp_path / "w4") == 0
    assert w8a8_from_qat.main([str(tmp_path / "w4"), str(tmp_path / "x"), "-q"]) == 2
    assert "already quantized" in capsys.readouterr().err
    # embed_int4 twice: the tables are already int4.
    assert text_only.main([str(tmp_path / "w4"), str(tmp_path / "t"), "-q"]) == 0
    assert embed_int4.main([str(tmp_path / "t"), str(tmp_path / "e"), "--embed-tokens", "-q"]) == 0
    assert embed_int4.main([str(tmp_path / "e"), str(tmp_path / "e2"), "-q"]) == 2
    assert "embed_tokens_per_layer" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "e2").exists()


def test_if_stale_rebuilds_over_a_stamp_that_is_not_an_object(qat, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "repack.json").write_text("[]")  # once an AttributeError traceback
    argv = ["build", str(qat), str(out), "--target", "w8a8", "--if-stale", "-q"]
    assert repack_q4_0.main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    assert json.loads((out / "repack.json").read_text())["steps"] == ["w8a8", "text_only"]
    assert repack_q4_0.main(argv) == 0
    assert "is up to date" in capsys.readouterr().out


def test_a_rewritten_source_with_the_same_shapes_is_stale(qat, tmp_path, capsys):
    """Weights trained again keep every name, size and header: the output must still be rebuilt."""
    import os
    import shutil

    src = tmp_path / "src"
    shutil.copytree(qat, src)
    out = tmp_path / "out"
    argv = ["build", str(src), str(out), "--target", "w8a8", "--status"]
    assert repack_q4_0.main(["build", str(src), str(out), "--target", "w8a8", "-q"]) == 0
    capsys.readouterr()
    assert repack_q4_0.main(argv) == 0
    assert capsys.readouterr().out.strip() == "current"
    shard = sorted(src.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-2:] = bytes(2)  # new values for the last weight: same shard size, same header
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 1))
    assert repack_q4_0.main(argv) == 0
    assert capsys.readouterr().out.strip() == "stale"


def test_an_unexpected_error_is_one_line_and_exit_1(capsys):
    from repack import cli

    def bug() -> int:
        return {}["missing"]

    assert cli.guarded("tool.py", bug) == cli.EXIT_INTERNAL == 1
    err = capsys.readouterr().err
    assert err.splitlines() == ["tool.py: internal error: KeyError: 'missing' (a bug; please report it)"]
