"""Build one run's record: run.json (checked against schema/run.schema.json), REPORT.md and plots.

``python -m evidence.report build`` merges what playbooks/bench.yml fetched (the bench JSON, the
unit's journal, a meta JSON of facts about the rig) into ``evidence/runs/<run_id>/``.
``python -m evidence.report render DIR`` re-renders REPORT.md and the plots from DIR/run.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import jsonschema

from evidence import RUNS_DIR, SCHEMA_PATH
from evidence.logs import parse_log

PLOTS = ("throughput.png", "ttft.png")


class RunInvalid(ValueError):
    """The run record does not match the schema; the message names the field."""


def validate(run: dict[str, Any]) -> None:
    """Raise RunInvalid naming the first offending field when ``run`` breaks the schema."""
    schema = json.loads(SCHEMA_PATH.read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(run), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.path) or "(top level)"
        raise RunInvalid(f"run.json invalid at {where}: {e.message}")


def build_run(meta: dict[str, Any], bench: dict[str, Any] | None, journal: str | None) -> dict[str, Any]:
    """Assemble a run record from the rig's meta facts, the bench output and the journal text."""
    facts = parse_log(journal or "")
    software = {"vllm_version": facts["vllm_version"], "non_default_args": facts["non_default_args"]}
    software.update({k: v for k, v in (meta.get("software") or {}).items() if v is not None})
    run: dict[str, Any] = {
        "schema_version": 1,
        "run_id": meta["run_id"],
        "date": meta["date"],
        "provenance": meta.get("provenance") or {"kind": "measured", "source": "playbooks/bench.yml"},
        "hardware": meta["hardware"],
        "software": software,
        "model": meta["model"],
        "memory": {
            k: facts[k]
            for k in (
                "model_loading_gib",
                "kv_cache_memory_gib",
                "kv_cache_tokens",
                "max_concurrency",
                "max_concurrency_tokens_per_request",
            )
        },
        "startup": {
            k: facts[k]
            for k in (
                "model_loading_s",
                "weights_loading_s",
                "engine_init_s",
                "compile_s",
                "linear_kernel",
                "linear_scheme",
                "aot_compile_loaded",
                "server_start_s",
            )
        },
        "bench": None,
    }
    run["startup"]["time_to_healthy_s"] = meta.get("time_to_healthy_s")
    if bench is not None:
        server = bench.get("server") or {}
        run["bench"] = {
            "method": bench["method"],
            # What the client was told, else what the engine logged it resolved to.
            "prefix_caching": server.get("prefix_caching")
            if server.get("prefix_caching") is not None
            else facts["prefix_caching"],
            "max_num_seqs": server.get("max_num_seqs"),
            "max_model_len": server.get("max_model_len"),
            "settings": bench.get("settings") or {},
            "cells": bench.get("cells") or [],
            "decode": bench.get("decode"),
            "tools": bench.get("tools"),
        }
    if meta.get("accuracy"):
        run["accuracy"] = meta["accuracy"]
    return run


def merge_bench(parts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One bench record from several runs of the bench client (playbooks/bench.yml runs one per cell).

    Cells keep their order; the decode check and the tool workload come from whichever part ran them.
    """
    if not parts:
        return None
    merged = {**parts[0], "cells": [], "decode": None, "tools": None}
    for part in parts:
        merged["cells"].extend(part.get("cells") or [])
        merged["decode"] = part.get("decode") or merged["decode"]
        merged["tools"] = part.get("tools") or merged["tools"]
    return merged


def _fmt(v: Any, unit: str = "", digits: int = 2) -> str:
    if v is None:
        return "missing"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}{unit}"
    if isinstance(v, float):
        return f"{v:,.{digits}f}{unit}"
    return f"{v}{unit}"


def _spread(cell: dict[str, Any], key: str, digits: int = 1) -> str:
    s = (cell.get("spread") or {}).get(key)
    return f"{s['min']:,.{digits}f}-{s['max']:,.{digits}f}" if s else "—"


def render_markdown(run: dict[str, Any]) -> str:
    """REPORT.md text for one run."""
    hw, sw, model, mem, st = run["hardware"], run["software"], run["model"], run["memory"], run["startup"]
    prov = run["provenance"]
    out = [
        f"# {run['run_id']}",
        "",
        f"{model['key']} on {hw['accelerator']} ({hw['platform']}), {run['date']}.",
        "",
        f"**Provenance:** {prov['kind']} — {prov['source']}."
        + (f" {prov['notes']}" if prov.get("notes") else ""),
        "",
        "## Hardware and software",
        "",
        "| | |",
        "|---|---|",
        f"| accelerator | {hw['accelerator']} |",
        f"| host | {_fmt(hw.get('host'))} ({_fmt(hw.get('machine'))}) |",
        f"| CPUs / memory | {_fmt(hw.get('cpu_count'))} / {_fmt(hw.get('memory_gib'), ' GiB', 1)} |",
        f"| vLLM | {_fmt(sw.get('vllm_version'))} |",
        f"| OS / Python | {_fmt(sw.get('os'))} / {_fmt(sw.get('python'))} |",
        f"| model | {model['key']}: {_fmt(model.get('description'))} |",
        "",
        "## Memory and start-up",
        "",
        "| figure | value |",
        "|---|---|",
        f"| model loading | {_fmt(mem['model_loading_gib'], ' GiB')} in {_fmt(st['model_loading_s'], ' s')} |",
        f"| weights loading (CPU build) | {_fmt(st.get('weights_loading_s'), ' s')} |",
        f"| available KV cache memory | {_fmt(mem['kv_cache_memory_gib'], ' GiB')} |",
        f"| KV cache tokens | {_fmt(mem['kv_cache_tokens'])} |",
        f"| max concurrency | {_fmt(mem['max_concurrency'], 'x')} at "
        f"{_fmt(mem.get('max_concurrency_tokens_per_request'))} tokens per request |",
        f"| engine init | {_fmt(st['engine_init_s'], ' s')} (compilation {_fmt(st['compile_s'], ' s')}) |",
        f"| AOT compile cache loaded | {_fmt(st.get('aot_compile_loaded'))} |",
        f"| vLLM start (config line to listening) | {_fmt(st.get('server_start_s'), ' s', 0)} |",
        f"| time to healthy | {_fmt(st.get('time_to_healthy_s'), ' s', 0)} |",
        f"| linear kernel | {_fmt(st['linear_kernel'])} ({_fmt(st.get('linear_scheme'))}) |",
        "",
    ]
    if sw.get("non_default_args"):
        out += ["Non-default vLLM args: `" + json.dumps(sw["non_default_args"], sort_keys=True) + "`", ""]
    bench = run.get("bench")
    if bench:
        settings = bench.get("settings") or {}
        out += [
            "## Throughput sweep",
            "",
            f"Method: {bench['method']}. Prefix cache on the server: {_fmt(bench['prefix_caching'])}; "
            f"max-num-seqs {_fmt(bench.get('max_num_seqs'))}; max-model-len {_fmt(bench.get('max_model_len'))}; "
            f"output {_fmt(settings.get('output_len'))} tokens, ignore-eos, temperature 0, "
            f"{_fmt(settings.get('repeats'))} repeats (median, min-max).",
            "",
            "| input | conc. | prompts | status | output tok/s | spread | TTFT ms (median) | spread | TPOT ms |",
            "|---:|---:|---:|---|---:|---:|---:|---:|---:|",
        ]
        for c in bench["cells"]:
            med = c.get("median") or {}
            dash = "—"
            status = c["status"] if c["status"] == "ok" else f"{c['status']}: {c.get('reason')}"
            out.append(
                f"| {_fmt(c['input_len']).replace('missing', 'not recorded')} | {c['concurrency']} "
                f"| {_fmt(c['num_prompts'])} | {status} "
                f"| {_fmt(med.get('output_tok_s'), '', 1).replace('missing', dash)} | {_spread(c, 'output_tok_s')} "
                f"| {_fmt(med.get('ttft_ms'), '', 0).replace('missing', dash)} | {_spread(c, 'ttft_ms', 0)} "
                f"| {_fmt(med.get('tpot_ms'), '', 1).replace('missing', dash)} |"
            )
        out.append("")
        d = bench.get("decode")
        if d:
            out += [
                "## Single-stream decode",
                "",
                f"{d['output_len']} output tokens at concurrency 1, input {_fmt(d.get('input_len'))}, "
                f"median of runs 2-{len(d.get('runs') or []) or 4}: **{_fmt(d['output_tok_s'], ' tok/s', 1)}** "
                f"(decode only {_fmt(d.get('decode_tok_s'), ' tok/s', 1)}, TTFT {_fmt(d.get('ttft_ms'), ' ms', 0)})"
                + ("" if d["status"] == "ok" else f" — {d['status']}: {d.get('reason')}"),
                "",
            ]
        if has_plots(run):
            out += ["![output throughput](throughput.png)", "", "![time to first token](ttft.png)", ""]
    if run.get("accuracy"):
        out += ["## Accuracy (paired, 95% bootstrap interval)", ""]
    for acc in run.get("accuracy") or []:
        out.append(
            f"- {acc['b']} vs {acc['a']} on {acc['records']:,} records of {_fmt(acc.get('dataset'))}: "
            f"{acc['acc_a']:.1f}% -> {acc['acc_b']:.1f}%, difference {acc['diff']:+.1f} "
            f"({_fmt_signed(acc['ci_low'])} to {_fmt_signed(acc['ci_high'])})"
        )
    return "\n".join(out).rstrip() + "\n"


def _fmt_signed(v: float | None) -> str:
    return "missing" if v is None else f"{v:+.1f}"


def has_plots(run: dict[str, Any]) -> bool:
    """Whether the run has any measured sweep cell to plot."""
    return any(c.get("median") for c in ((run.get("bench") or {}).get("cells") or []))


def plot(run: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write throughput.png and ttft.png (median with min-max bars) against concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in ((run.get("bench") or {}).get("cells") or []) if c.get("median")]
    paths = []
    for name, key, label in (
        ("throughput.png", "output_tok_s", "output tokens/s (median)"),
        ("ttft.png", "ttft_ms", "time to first token, ms (median)"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        lens = sorted({c["input_len"] for c in cells}, key=lambda x: (x is None, x or 0))
        drawn = False
        for inp in lens:
            pts = sorted(
                (c for c in cells if c["input_len"] == inp and c["median"].get(key) is not None),
                key=lambda c: c["concurrency"],
            )
            if not pts:
                continue
            xs = [c["concurrency"] for c in pts]
            ys = [c["median"][key] for c in pts]
            spreads = [(c.get("spread") or {}).get(key) for c in pts]
            lo = [y - s["min"] if s else 0 for y, s in zip(ys, spreads, strict=True)]
            hi = [s["max"] - y if s else 0 for y, s in zip(ys, spreads, strict=True)]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=f"input {inp or 'not recorded'}")
            drawn = True
        if drawn:
            ax.legend()
            ax.set_xscale("log", base=2)
            ticks = sorted({c["concurrency"] for c in cells})
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.minorticks_off()
        else:
            ax.text(0.5, 0.5, "no measured cells", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(label)
        ax.set_title(f"{run['run_id']}")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def write_run(run: dict[str, Any], out_dir: Path) -> Path:
    """Validate, then write run.json, REPORT.md and the plots into ``out_dir``."""
    validate(run)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    (out_dir / "REPORT.md").write_text(render_markdown(run))
    for stale in PLOTS:
        (out_dir / stale).unlink(missing_ok=True)
    if has_plots(run):
        plot(run, out_dir)
    return out_dir


def _load_json(path: Path | None, what: str) -> Any:
    if path is None:
        return None
    if not path.is_file():
        raise SystemExit(f"error: {what} not found: {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SystemExit(f"error: {what} {path} is not JSON: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(prog="python -m evidence.report", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="merge bench JSON + journal + meta into a run directory")
    b.add_argument("--meta", type=Path, required=True, help="JSON: run_id, date, hardware, software, model")
    b.add_argument("--bench", type=Path, nargs="*", default=[], help="outputs of the bench client (merged)")
    b.add_argument("--journal", type=Path, help="journalctl -u vllm text")
    b.add_argument("--out", type=Path, help="run directory to write (default: evidence/runs/<run_id>)")
    r = sub.add_parser("render", help="re-render REPORT.md and plots from DIR/run.json")
    r.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            meta = _load_json(args.meta, "meta")
            for key in ("run_id", "date", "hardware", "model"):
                if key not in meta:
                    raise SystemExit(f"error: meta {args.meta} lacks {key!r}")
            journal = None
            if args.journal:
                if not args.journal.is_file():
                    raise SystemExit(f"error: journal not found: {args.journal}")
                journal = args.journal.read_text(errors="replace")
            bench = merge_bench([_load_json(p, "bench") for p in args.bench])
            run = build_run(meta, bench, journal)
            out = write_run(run, args.out or RUNS_DIR / meta["run_id"])
        else:
            out = write_run(_load_json(args.dir / "run.json", "run.json"), args.dir)
    except RunInvalid as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
