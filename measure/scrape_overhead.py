#!/usr/bin/env python3
"""What Prometheus's scraping costs a rig: the same rig's throughput quiet and scraped, side by side.

    python measure/scrape_overhead.py --rig URL --model NAME [--rig-key-file F] [--interval 1]
        [--concurrency 8] [--requests 32] [--rounds 8] [--scrapes 200] [--record DIR --label NAME]

Two figures, from one run on one rig:
- Throughput. Each round sends --requests chat completions, --concurrency at a time, once with
  nothing else asking the rig and once while a scraper GETs the rig's /metrics every --interval
  seconds (Prometheus's own request: the text format, the rig's key when it has one). Rounds
  alternate which arm goes first, so that a drift in the machine's load falls on both. The figure
  is the scraped arm's throughput over the quiet one's, from the sums over all rounds, with each
  round's own ratio as median, min and max: how far one round's figure can be trusted here.
- CPU per scrape. --scrapes back-to-back scrapes of an idle rig, read from the rig's own
  `process_cpu_seconds_total` (vLLM's API server process, which serves /metrics; the engine
  process is not involved in a scrape): the CPU seconds one scrape costs, and the share of one core
  that scraping every --interval seconds takes. On a 2-core machine the throughput ratio's noise is
  several percent a round, far above 1%; the CPU share is the tighter bound.

This is a measurement, not a test: it prints figures and never fails on them (only on a request that
fails). The default --interval of 1 s is fifteen times the gce profile's scrape interval.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module below

from gateway_overhead import BenchError, Round, _one_round, pair_ratios, write_record

# Prometheus's own Accept header for a scrape (text format 0.0.4 and OpenMetrics).
SCRAPE_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
CPU_LINE = re.compile(r"^process_cpu_seconds_total(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.MULTILINE)


@dataclass
class Result:
    """Every round, the scrapes made during the scraped arm, and the CPU cost of one scrape."""

    concurrency: int
    requests: int
    max_tokens: int
    interval: float
    rounds: list[Round] = field(default_factory=list)
    scrapes_during_load: int = 0
    cpu_per_scrape_s: float = 0.0

    def tokens_per_s(self, arm: str) -> float:
        mine = [r for r in self.rounds if r.endpoint == arm]
        return sum(r.tokens for r in mine) / sum(r.seconds for r in mine)

    @property
    def ratio(self) -> float:
        """Scraped throughput over quiet throughput (1.0: scraping costs nothing)."""
        return self.tokens_per_s("scraped") / self.tokens_per_s("quiet")

    def round_ratios(self) -> list[float]:
        return pair_ratios(self.rounds, "scraped", "quiet")

    @property
    def core_share(self) -> float:
        """The share of one core that a scrape every ``interval`` seconds takes."""
        return self.cpu_per_scrape_s / self.interval

    def summary(self) -> str:
        ratios = self.round_ratios()
        return (
            f"c={self.concurrency}, {self.requests} requests x {len(ratios)} rounds each, "
            f"{self.max_tokens} tokens each, a scrape every {self.interval:g} s "
            f"({self.scrapes_during_load} during the scraped arms): quiet "
            f"{self.tokens_per_s('quiet'):.1f} tok/s, scraped {self.tokens_per_s('scraped'):.1f} tok/s, "
            f"ratio {self.ratio:.3f}; per round: median {statistics.median(ratios):.3f}, "
            f"min {min(ratios):.3f}, max {max(ratios):.3f}. One scrape: "
            f"{self.cpu_per_scrape_s * 1000:.2f} ms of CPU, {self.core_share * 100:.3f}% of one core "
            f"at this interval"
        )


def cpu_seconds(text: str) -> float:
    """The rig process's CPU seconds from a scrape's text."""
    match = CPU_LINE.search(text)
    if match is None:
        raise BenchError("the rig's /metrics has no process_cpu_seconds_total")
    return float(match.group(1))


async def _scrape(client: httpx.AsyncClient) -> str:
    response = await client.get("/metrics", headers={"Accept": SCRAPE_ACCEPT})
    if response.status_code != 200:
        raise BenchError(f"{client.base_url}/metrics answered {response.status_code}")
    return response.text


async def _scraper(client: httpx.AsyncClient, interval: float, stop: asyncio.Event) -> int:
    """Scrape every ``interval`` seconds until ``stop``; the number of scrapes made."""
    made = 0
    while not stop.is_set():
        await _scrape(client)
        made += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
    return made


async def _measure(
    load: httpx.AsyncClient, scrape: httpx.AsyncClient, model: str, result: Result, rounds: int, scrapes: int
) -> Result:
    first = cpu_seconds(await _scrape(scrape))
    for _ in range(scrapes):
        last = await _scrape(scrape)
    result.cpu_per_scrape_s = (cpu_seconds(last) - first) / scrapes
    await _one_round(load, model, result.concurrency, result.concurrency, result.max_tokens)  # warm-up
    for n in range(rounds):
        for arm in ("quiet", "scraped") if n % 2 == 0 else ("scraped", "quiet"):
            stop = asyncio.Event()
            scraper = (
                asyncio.create_task(_scraper(scrape, result.interval, stop)) if arm == "scraped" else None
            )
            started = time.perf_counter()
            tokens = await _one_round(load, model, result.requests, result.concurrency, result.max_tokens)
            result.rounds.append(Round(arm, time.perf_counter() - started, tokens))
            if scraper is not None:
                stop.set()
                result.scrapes_during_load += await scraper
    return result


def measure(
    rig: str,
    model: str,
    rig_key: str = "",
    interval: float = 1.0,
    concurrency: int = 8,
    requests: int = 32,
    rounds: int = 8,
    max_tokens: int = 32,
    scrapes: int = 200,
    timeout: float = 300,
) -> Result:
    """Run the side-by-side bench (the module's docstring says how)."""
    headers = {"Authorization": f"Bearer {rig_key}"} if rig_key else {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def run() -> Result:
        async with (
            httpx.AsyncClient(base_url=rig, headers=headers, timeout=timeout, limits=limits) as load,
            httpx.AsyncClient(base_url=rig, headers=headers, timeout=timeout) as scrape,
        ):
            result = Result(concurrency, requests, max_tokens, interval)
            return await _measure(load, scrape, model, result, rounds, scrapes)

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: python measure/scrape_overhead.py --rig http://127.0.0.1:8000 --model tiny-emb4",
    )
    ap.add_argument("--rig", required=True, help="the rig's own endpoint (http://HOST:PORT)")
    ap.add_argument("--model", required=True, help="the served model's name (as /v1/models lists it)")
    ap.add_argument("--rig-key-file", type=Path, help="a file holding the rig's API key, when it has one")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes (default 1)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32, help="requests per round and arm")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--scrapes", type=int, default=200, help="back-to-back scrapes for the CPU figure")
    ap.add_argument("--record", type=Path, help="write LABEL.json here")
    ap.add_argument("--label", default="scrape-overhead")
    args = ap.parse_args(argv)
    for name in ("concurrency", "requests", "rounds", "max_tokens", "scrapes"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0.05 <= args.interval <= 3600:
        ap.error("--interval must be between 0.05 and 3600 seconds")
    key = ""
    if args.rig_key_file:
        try:
            key = args.rig_key_file.read_text().strip()
        except OSError as exc:
            ap.error(f"cannot read {args.rig_key_file}: {exc.strerror}")
    try:
        result = measure(
            args.rig, args.model, rig_key=key, interval=args.interval, concurrency=args.concurrency,
            requests=args.requests, rounds=args.rounds, max_tokens=args.max_tokens, scrapes=args.scrapes,
        )  # fmt: skip
    except (BenchError, httpx.HTTPError) as exc:
        print(f"scrape_overhead: {exc}", file=sys.stderr)
        return 1
    print(result.summary())
    if args.record:
        tail = {
            "quiet_tokens_per_s": result.tokens_per_s("quiet"),
            "scraped_tokens_per_s": result.tokens_per_s("scraped"),
            "ratio": result.ratio,
            "round_ratios": result.round_ratios(),
            "core_share": result.core_share,
        }
        head = {"rig": args.rig, "model": args.model}
        print(f"recorded {write_record(args.record, args.label, head, result, tail)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
