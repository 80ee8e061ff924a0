#!/usr/bin/env python3
"""Time the converters on a synthetic checkpoint shaped exactly like Google's E2B QAT release.

    python measure/repack_speed.py WORKDIR [--small | --layers N] [--repeat N] [--json OUT.json]

Writes WORKDIR/qat (tensor names and shapes of google/gemma-4-E2B-it-qat-q4_0-unquantized, taken
from transformers' Gemma 4 at E2B's config on the meta device; on-grid random bf16 values, about
10 GB), then runs each tool and the one-pass route as a child process and prints, per run: wall
time, input GB/s, peak memory and the ratio to a plain copy of the
same input measured in the same run (copied before each run and after the last; the fastest
copy is the one compared, and with --repeat N the fastest of N runs). Peak memory is the child's
own VmHWM. Dirty pages are flushed before every timed child. Targets:
peak <= 2 GiB, each step <= 2x its copy time, one-pass emb4 <= 1.5x the source's copy time.
--small uses a tiny config (a smoke run in seconds).
This is a measurement, not a test: it prints figures and never fails on them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from repack import grid  # noqa: E402
from repack.st_io import ShardWriter  # noqa: E402
from repack.torch_bf16 import bits  # noqa: E402

GiB = 1024**3
SHARD_BYTES = 4 * 10**9


def e2b_text_config(small: bool, layers: int | None = None) -> dict:
    """E2B's text config (docs/facts.md); --small shrinks it but keeps the layout.

    ``layers`` keeps E2B's tensor shapes but fewer decoder layers (the per-layer table is then
    [262144, layers * 256]); the KV-shared share stays about 20 of 35.
    """
    n = layers or (10 if small else 35)
    return {
        "model_type": "gemma4_text",
        "vocab_size": 2048 if small else 262144,
        "vocab_size_per_layer_input": 2048 if small else 262144,
        "hidden_size": 256 if small else 1536,
        "hidden_size_per_layer_input": 64 if small else 256,
        "intermediate_size": 512 if small else 6144,
        "num_hidden_layers": n,
        "num_attention_heads": 2 if small else 8,
        "num_key_value_heads": 1,
        "head_dim": 64 if small else 256,
        "global_head_dim": 128 if small else 512,
        "num_kv_shared_layers": 4 if small else (20 if n == 35 else max(1, n * 20 // 35)),
        "use_double_wide_mlp": True,
        "layer_types": ["full_attention" if i % 5 == 4 else "sliding_attention" for i in range(n)],
        "sliding_window": 512,
        "final_logit_softcapping": 30.0,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
    }


def release_layout(small: bool, layers: int | None = None) -> tuple[dict, list[tuple[str, tuple[int, ...]]]]:
    """(config.json, [(name, shape)]) of the release, from transformers' model on the meta device."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    tc = e2b_text_config(small, layers)
    cfg = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": tc}
    if small:
        cfg["vision_config"] = {
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 64,
        }
        cfg["audio_config"] = {
            "hidden_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "output_proj_dims": 256,
            "subsampling_conv_channels": [16, 8],
        }
    else:
        cfg["vision_config"] = {}
        cfg["audio_config"] = {}
    with torch.device("meta"):
        model = Gemma4ForConditionalGeneration(Gemma4Config.from_dict(json.loads(json.dumps(cfg))))
    shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items() if k != "lm_head.weight"]
    full = model.config.to_dict()
    full["text_config"].pop("per_layer_config", None)
    full["text_config"]["global_head_dim"] = tc["global_head_dim"]
    full["architectures"] = ["Gemma4ForConditionalGeneration"]
    if not small and not layers:
        s = dict(shapes)
        lm = "model.language_model."
        assert s[f"{lm}embed_tokens_per_layer.weight"] == (262144, 8960)
        assert s[f"{lm}layers.0.self_attn.q_proj.weight"] == (2048, 1536)
        assert s[f"{lm}layers.4.self_attn.k_proj.weight"] == (512, 1536)
        assert s[f"{lm}layers.20.mlp.up_proj.weight"] == (12288, 1536)
        assert f"{lm}layers.15.self_attn.k_proj.weight" not in s
    return full, shapes


def write_source(out: Path, small: bool, layers: int | None = None) -> int:
    """Write the synthetic release; returns its size in bytes."""
    from repack.steps import EMBED, LINEAR

    cfg, shapes = release_layout(small, layers)
    out.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    pools: dict[int, torch.Tensor] = {}

    def rows_for(name: str, shape: tuple[int, ...], start: int, stop: int) -> torch.Tensor:
        if len(shape) == 2 and (LINEAR.match(name) or EMBED.match(name)):
            cols = shape[1]
            if cols not in pools:  # a pool of on-grid rows, reused: generating 10 GB would dominate
                pools[cols] = grid.random_on_grid((max(1, (8 << 20) // (cols * 2)), cols), gen)
            pool = pools[cols]
            idx = torch.arange(start, stop) % pool.shape[0]
            return pool[idx]
        return (torch.randn((stop - start, *shape[1:]), generator=gen) * 0.02).to(torch.bfloat16)

    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in shapes:
        nb = 2 * max(1, int(torch.tensor(shape).prod())) if shape else 2
        if shards[-1] and size + nb > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nb
    total = 0
    weight_map = {}
    for i, members in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        w = ShardWriter(out / fname, [(n, "BF16", s) for n, s in members])
        for name, shape in members:
            if len(shape) < 2:
                w.write(name, bits((torch.ones(shape) if shape else torch.ones(())).to(torch.bfloat16)))
                continue
            step = max(1, (64 << 20) // (2 * shape[1] * max(1, int(torch.tensor(shape[2:]).prod()))))
            for start in range(0, shape[0], step):
                stop = min(shape[0], start + step)
                w.write(name, bits(rows_for(name, shape, start, stop)), start)
            weight_map[name] = fname
        w.close()
        for n, _ in members:
            weight_map[n] = fname
        total += (out / fname).stat().st_size
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return total


def dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file())


# Runs a script in this fresh interpreter, then reports the process's own peak memory (VmHWM).
# ru_maxrss from wait4 would not do: the child starts as a vfork of this benchmark, and Linux
# carries the parent's high-water mark across exec into the child's ru_maxrss.
_HWM = """
import os, runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    with open("/proc/self/status") as st, open(os.environ["BENCH_HWM"], "w") as out:
        out.write(next((line.split()[1] for line in st if line.startswith("VmHWM:")), "0"))
"""


def run_child(cmd: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak RSS bytes of the child, exit code); cmd = [python, script, *args].

    Dirty pages are flushed first, so neither the copy nor a tool pays for the other's writeback.
    """
    os.sync()
    with tempfile.NamedTemporaryFile("r", suffix=".hwm") as hwm:
        env = {**os.environ, "BENCH_HWM": hwm.name}
        t0 = time.monotonic()
        p = subprocess.run(
            [cmd[0], "-c", _HWM, *cmd[1:]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
        )
        wall = time.monotonic() - t0
        peak_kib = int(hwm.read() or 0)
    if p.returncode:
        print(p.stderr.decode()[-2000:], file=sys.stderr)
    return wall, peak_kib * 1024, p.returncode


def copy_time(src: Path, dst: Path) -> float:
    """Plain copy of the same input (every file), in a child process like the tools."""
    shutil.rmtree(dst, ignore_errors=True)
    script = dst.parent / "copy_tree.py"
    script.write_text(f"import shutil\nshutil.copytree({str(src)!r}, {str(dst)!r})\n")
    wall, _, _ = run_child([sys.executable, str(script)])
    shutil.rmtree(dst, ignore_errors=True)
    return wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="repack_speed.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("workdir", type=Path, help="scratch directory (about 40 GB free for the full run)")
    ap.add_argument("--small", action="store_true", help="tiny synthetic checkpoint: a smoke run in seconds")
    ap.add_argument(
        "--layers",
        type=int,
        help="E2B's shapes with fewer decoder layers (10, 15, ..., 35; 10: about 4.4 GB); default all 35 (about 10 GB)",
    )
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the outputs (default: delete each after use)")
    ap.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="run each tool N times and keep its fastest run"
    )
    args = ap.parse_args(argv)
    if args.layers is not None and (args.layers % 5 or not 10 <= args.layers <= 35):
        # E2B's 4 sliding + 1 full pattern, and both kinds among the KV-shared layers too
        ap.error(f"--layers must be a multiple of 5 from 10 to 35, got {args.layers}")
    if args.layers and args.small:
        ap.error("--layers and --small do not combine")
    wd = args.workdir
    wd.mkdir(parents=True, exist_ok=True)
    src = wd / "qat"
    if not (src / "config.json").exists():
        t0 = time.monotonic()
        shutil.rmtree(src, ignore_errors=True)
        size = write_source(src, args.small, args.layers)
        print(
            f"wrote synthetic source {src}: {size / 1e9:.2f} GB in {time.monotonic() - t0:.0f} s", flush=True
        )
    py, rp = sys.executable, str(ROOT / "repack")
    runs = [
        (
            "repack (w4a16)",
            src,
            wd / "w4a16",
            [py, f"{rp}/repack_q4_0.py", "repack", str(src), str(wd / "w4a16")],
        ),
        (
            "text_only",
            wd / "w4a16",
            wd / "text",
            [py, f"{rp}/text_only.py", str(wd / "w4a16"), str(wd / "text")],
        ),
        (
            "embed_int4 --embed-tokens",
            wd / "text",
            wd / "emb4",
            [py, f"{rp}/embed_int4.py", str(wd / "text"), str(wd / "emb4"), "--embed-tokens"],
        ),
        ("w8a8_from_qat", src, wd / "w8a8", [py, f"{rp}/w8a8_from_qat.py", str(src), str(wd / "w8a8")]),
        (
            "build --target emb4 (one pass)",
            src,
            wd / "one-emb4",
            [py, f"{rp}/repack_q4_0.py", "build", str(src), str(wd / "one-emb4"), "--target", "emb4"],
        ),
        ("check", src, None, [py, f"{rp}/repack_q4_0.py", "check", str(src), "-q"]),
    ]
    results: list[dict] = []
    report = {
        "small": args.small,
        "layers": args.layers or (None if args.small else 35),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "load_average_at_start": os.getloadavg(),
        "repeat": args.repeat,
        "results": results,
        "targets": {"peak_rss_gib": 2.0, "step_ratio_to_copy": 2.0, "one_pass_emb4_ratio_to_copy": 1.5},
    }
    print(
        f"{'run':<32} {'in GB':>7} {'wall s':>8} {'GB/s':>6} {'peak GiB':>9} {'copy s':>7} {'x copy':>7}",
        flush=True,
    )
    for label, inp, out, cmd in runs:
        if out is not None:
            cmd = [*cmd, "--quiet"]
        if not (inp / "config.json").exists():
            print(f"{label:<32} skipped: its input {inp} was not built", flush=True)
            results.append({"run": label, "exit": "skipped"})
            continue
        gb = dir_bytes(inp) / 1e9
        copies, walls, peak, code = [], [], 0, 0
        for _ in range(args.repeat):  # copy, run, ..., copy: best of each, side by side
            if out is not None:
                shutil.rmtree(out, ignore_errors=True)
            copies.append(copy_time(inp, wd / "copy"))
            w, p, code = run_child(cmd)
            walls.append(w)
            peak = max(peak, p)
            if code:
                break
        copies.append(copy_time(inp, wd / "copy"))
        wall, ctime = min(walls), min(copies)
        r = {
            "run": label,
            "input_gb": round(gb, 3),
            "wall_s": round(wall, 2),
            "input_gb_per_s": round(gb / wall, 3),
            "peak_rss_gib": round(peak / GiB, 3),
            "copy_s": round(ctime, 2),
            "walls_s": [round(w, 2) for w in walls],
            "copies_s": [round(c, 2) for c in copies],
            "ratio_to_copy": round(wall / ctime, 2),
            "exit": code,
        }
        results.append(r)
        print(
            f"{label:<32} {gb:>7.2f} {wall:>8.1f} {gb / wall:>6.2f} {peak / GiB:>9.2f} {ctime:>7.1f} {wall / ctime:>7.2f}"
            + ("" if code == 0 else f"  (exit {code})"),
            flush=True,
        )
        if args.json:  # after every run, so an interrupted benchmark keeps what it measured
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2) + "\n")
    if not args.keep:
        for d in ("w4a16", "text", "emb4", "w8a8", "one-emb4"):
            shutil.rmtree(wd / d, ignore_errors=True)
    return 0 if all(r.get("exit") == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
