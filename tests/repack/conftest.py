"""One set of tiny builds per session, shared by the round-trip, route and vLLM tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from repack.make_tiny_qat import build
from repack.pipeline import run
from repack.steps import STEPS, embed_int4, repack, text_only, w8a8

TARGETS = ("w4a16", "text", "emb4", "w8a8")


@pytest.fixture(scope="session")
def builds(tmp_path_factory) -> dict[str, Path]:
    """qat (release layout), qat-kv (with shared-layer k/v/k_norm), step-by-step and one-pass builds."""
    d = tmp_path_factory.mktemp("repack-builds")
    out = {"qat": d / "qat", "qat-kv": d / "qat-kv"}
    build(out["qat"], seed=0, with_shared_kv=False, force=False)
    build(out["qat-kv"], seed=0, with_shared_kv=True, force=False)
    q = dict(quiet=True)
    # The step-by-step route, exactly as the CLIs chain it.
    run(out["qat"], d / "w4a16", [repack], **q)
    run(d / "w4a16", d / "text", [text_only], **q)
    run(d / "text", d / "emb4", [embed_int4(embed_tokens=True)], **q)
    run(out["qat"], d / "w8a8", [w8a8, text_only], **q)
    for t in TARGETS:
        out[t] = d / t
        out[f"one-{t}"] = d / f"one-{t}"
        run(out["qat"], out[f"one-{t}"], STEPS[t], **q)
    out["text-kv"] = d / "text-kv"
    run(out["qat-kv"], out["text-kv"], STEPS["text"], **q)
    return out
