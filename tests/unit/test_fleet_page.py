"""The fleet page (roles/monitoring/files/consoles/gemma-rig.html) as a person sees it: rendered by
the real Prometheus over backfilled samples of two rigs and two clients, loaded in headless
Chromium, screenshot taken; every panel shows numbers. And the reverse: over an empty TSDB every
panel says "no data" (so a page whose panels always look filled would fail here)."""

from __future__ import annotations

import math
import os
import shutil
import struct
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests import prometheus_backfill as pb

CHROMIUM = Path("/usr/bin/chromium-headless-shell")
PAGE = "/consoles/gemma-rig.html"
PANELS = {"tokens", "ttft", "requests", "kv-cache", "gpu", "errors", "client-requests", "client-tokens"}
WIDTH, HEIGHT = 1400, 1800
# A client name is whatever api-keys.map says: the page shows it as text, never as markup.
HOSTILE = '<img src=x onerror="alert(1)">\\"} or vector(1)'


def require_chromium() -> None:
    if os.access(CHROMIUM, os.X_OK):
        return
    why = f"{CHROMIUM} missing: run scripts/setup.sh (it installs chromium-headless-shell)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(why)
    pytest.skip(why)


class Panels(HTMLParser):
    """Per data-panel element: the data-value attributes inside it, and whether it says no data."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, list[str]] = {}
        self.empty: dict[str, bool] = {}
        self.current: str | None = None
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        self.tags.append(tag)
        if "data-panel" in attr:
            self.current = str(attr["data-panel"])
            self.values[self.current] = []
            self.empty[self.current] = False
        elif self.current is not None:
            if "data-value" in attr:
                self.values[self.current].append(str(attr["data-value"]))
            if "data-empty" in attr:
                self.empty[self.current] = True

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self.current = None


def chromium(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [str(CHROMIUM), "--no-sandbox", "--disable-gpu", f"--window-size={WIDTH},{HEIGHT}", *args, url]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def dom_panels(url: str) -> Panels:
    done = chromium(url, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    parsed = Panels()
    parsed.feed(done.stdout)
    assert set(parsed.values) == PANELS, done.stdout[-2000:]
    return parsed


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (the signature checked first)."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", head
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_every_panel_shows_numbers_and_the_screenshot_is_taken(tmp_path: Path, figure) -> None:
    pb.require_binaries()
    require_chromium()
    began = time.monotonic()
    pb.backfill(
        tmp_path / "tsdb",
        pb.fleet_openmetrics(
            time.time(), rigs=(*pb.RIGS, "rig-idle"), clients=(*pb.CLIENTS, HOSTILE), idle=("rig-idle",)
        ),
        tmp_path,
    )
    with pb.prometheus(tmp_path / "tsdb", tmp_path) as base:
        url = base + PAGE
        shot = tmp_path / "fleet-page.png"
        done = chromium(url, f"--screenshot={shot}")
        assert done.returncode == 0, done.stderr[-2000:]
        panels = dom_panels(url)
    assert png_size(shot) == (WIDTH, HEIGHT)
    # A blank page of that size compresses to a few KB; one with tables and text does not.
    assert shot.stat().st_size > 20_000, shot.stat().st_size
    out = pb.ROOT / "build" / "fleet-page.png"
    out.parent.mkdir(exist_ok=True)
    shutil.copyfile(shot, out)
    for name in PANELS:
        numbers = [float(v) for v in panels.values[name]]
        assert numbers and all(math.isfinite(n) and n >= 0 for n in numbers), (name, panels.values[name])
        assert not panels.empty[name], name
    # The hostile name is a row of text with its own figures (its per-row queries quote it).
    assert "img" not in panels.tags
    assert HOSTILE in panels.text
    assert len(panels.values["client-tokens"]) == 3 * 3
    # A rig that served nothing has no TTFT: "idle", not a number (nor NaN).
    assert len(panels.values["ttft"]) == 2 * 2 and panels.text.count("idle") == 2
    # The figures are the backfilled ones: rig-a makes 40 generation tokens/s, rig-b 80.
    assert [round(float(v)) for v in panels.values["tokens"][::2]] == [40, 80, 0]
    # Counts over the hour are whole numbers (increase() extrapolates; the page rounds). The errors
    # panel ends with the clients' rows: requests, 5xx and the 5xx share, which is no count.
    errors = panels.values["errors"]
    counts = {
        "errors": errors[: -3 * 3] + [v for i, v in enumerate(errors[-3 * 3 :]) if i % 3 != 2],
        "client-requests": panels.values["client-requests"],
        "client-tokens": panels.values["client-tokens"],
    }
    for name, values in counts.items():
        assert values and all(float(v).is_integer() for v in values), (name, values)
    # Only rig-a has a GPU (nvidia-smi): one row, in base units.
    assert [float(v) for v in panels.values["gpu"]] == [0.5, 12 * 2**30, 15 * 2**30, 60, 50]
    figure("fleet page test (backfill, Prometheus, Chromium x2)", f"{time.monotonic() - began:.1f} s")


def test_an_empty_tsdb_shows_no_data_in_every_panel(tmp_path: Path) -> None:
    pb.require_binaries()
    require_chromium()
    with pb.prometheus(tmp_path / "tsdb", tmp_path) as base:
        panels = dom_panels(base + PAGE)
    for name in PANELS:
        assert panels.values[name] == [], (name, panels.values[name])
        assert panels.empty[name], name
