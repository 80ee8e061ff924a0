#!/usr/bin/env python3
"""The gateway's cost in throughput: one rig asked directly and through the gateway, side by side.

    python measure/gateway_overhead.py --rig URL --gateway URL --model NAME [--key-file F]
        [--cafile F] [--concurrency 8] [--requests 32] [--rounds 2] [--record DIR --label NAME]

Both endpoints must reach the same vLLM (drain the fleet's other rigs first: `gateway-ctl drain`),
or the figure compares two rigs, not the gateway. Each round sends --requests chat completions,
--concurrency at a time, to one endpoint, then the same to the other; rounds alternate which goes
first (direct, gateway; gateway, direct; ...), so that a drift in the machine's load falls on both.
Every request asks for --max-tokens tokens with ignore_eos, so both sides generate the same work.
Throughput is the generated tokens over the round's wall time; the figure is the gateway's
throughput over the direct one's, from the sums over all rounds, with each round's own ratio (its
gateway share over its direct share) summed up as median, min and max: how far one round's figure
can be trusted on this machine. The target (docs/gateway.md) is a loss of 5% at most at 8
concurrent requests.

This is a measurement, not a test: it prints figures and never fails on them (only on a request that
fails). tests/e2e/test_25_gateway.py runs it on the local fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import ssl
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx


class BenchError(RuntimeError):
    """A request that did not succeed: the bench stops, naming the endpoint and its answer."""


@dataclass
class Round:
    """One endpoint's share of one round."""

    endpoint: str
    seconds: float
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


@dataclass
class Result:
    """Every round, and the sums the figure is made of."""

    concurrency: int
    requests: int
    max_tokens: int
    rounds: list[Round] = field(default_factory=list)

    def total(self, endpoint: str) -> tuple[int, float]:
        mine = [r for r in self.rounds if r.endpoint == endpoint]
        return sum(r.tokens for r in mine), sum(r.seconds for r in mine)

    def tokens_per_s(self, endpoint: str) -> float:
        tokens, seconds = self.total(endpoint)
        return tokens / seconds

    @property
    def ratio(self) -> float:
        """Gateway throughput over direct throughput (1.0: no cost)."""
        return self.tokens_per_s("gateway") / self.tokens_per_s("direct")

    def round_ratios(self) -> list[float]:
        """Each round's gateway throughput over the same round's direct throughput."""
        return pair_ratios(self.rounds, "gateway", "direct")

    def summary(self) -> str:
        direct, via = self.tokens_per_s("direct"), self.tokens_per_s("gateway")
        ratios = self.round_ratios()
        return (
            f"c={self.concurrency}, {self.requests} requests x {len(self.rounds) // 2} rounds each, "
            f"{self.max_tokens} tokens each: direct {direct:.1f} tok/s, through the gateway {via:.1f} tok/s, "
            f"ratio {self.ratio:.3f} ({(1 - self.ratio) * 100:+.1f}% loss); per round: median "
            f"{statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}"
        )


def pair_ratios(rounds: list[Round], top: str, bottom: str) -> list[float]:
    """Each round's ``top`` throughput over the same round's ``bottom`` (rounds come in pairs)."""
    pairs: list[dict[str, Round]] = [{} for _ in range(len(rounds) // 2)]
    for n, r in enumerate(rounds):
        pairs[n // 2][r.endpoint] = r
    return [p[top].tokens_per_s / p[bottom].tokens_per_s for p in pairs]


def write_record(
    directory: Path, label: str, head: dict[str, Any], result: Any, tail: dict[str, Any]
) -> Path:
    """``directory``/``label``.json: when, ``head``, the result's fields and rounds, then ``tail``."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"{label}.json"
    record = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **head,
        **{k: v for k, v in asdict(result).items() if k != "rounds"},
        "rounds": [{**asdict(r), "tokens_per_s": r.tokens_per_s} for r in result.rounds],
        **tail,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    return out


async def _one_round(
    client: httpx.AsyncClient, model: str, requests: int, concurrency: int, max_tokens: int
) -> int:
    """``requests`` chats, ``concurrency`` at a time; the generated tokens they report."""
    gate = asyncio.Semaphore(concurrency)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Count slowly from one to one hundred."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # vLLM's: every request generates max_tokens, on both sides
    }

    async def ask() -> int:
        async with gate:
            response = await client.post("/v1/chat/completions", json=body)
            if response.status_code != 200:
                raise BenchError(f"{client.base_url} answered {response.status_code}: {response.text[:300]}")
            return response.json()["usage"]["completion_tokens"]

    return sum(await asyncio.gather(*(ask() for _ in range(requests))))


async def _measure(
    clients: dict[str, httpx.AsyncClient],
    model: str,
    requests: int,
    concurrency: int,
    max_tokens: int,
    rounds: int,
) -> Result:
    result = Result(concurrency, requests, max_tokens)
    for client in clients.values():  # warm-up: connections, TLS sessions, vLLM's first batches
        await _one_round(client, model, concurrency, concurrency, max_tokens)
    for n in range(rounds):
        order = ("direct", "gateway") if n % 2 == 0 else ("gateway", "direct")
        for name in order:
            started = time.perf_counter()
            tokens = await _one_round(clients[name], model, requests, concurrency, max_tokens)
            result.rounds.append(Round(name, time.perf_counter() - started, tokens))
    return result


def measure(
    rig: str,
    gateway: str,
    model: str,
    key: str = "",
    rig_key: str = "",
    cafile: str | None = None,
    concurrency: int = 8,
    requests: int = 32,
    rounds: int = 2,
    max_tokens: int = 32,
    timeout: float = 300,
) -> Result:
    """Run the side-by-side bench (the module's docstring says how); ``key`` is the gateway's."""
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=cafile) if cafile else True
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    def headers(secret: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {secret}"} if secret else {}

    async def run() -> Result:
        async with (
            httpx.AsyncClient(
                base_url=rig, headers=headers(rig_key), timeout=timeout, limits=limits
            ) as direct,
            httpx.AsyncClient(
                base_url=gateway, headers=headers(key), verify=verify, timeout=timeout, limits=limits
            ) as via,
        ):
            return await _measure(
                {"direct": direct, "gateway": via}, model, requests, concurrency, max_tokens, rounds
            )

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: python measure/gateway_overhead.py --rig http://127.0.0.1:8000 "
        "--gateway https://127.0.0.1:8443 --cafile gateway.crt --key-file key.txt --model tiny-emb4",
    )
    ap.add_argument("--rig", required=True, help="the rig's own endpoint (http://HOST:PORT)")
    ap.add_argument("--gateway", required=True, help="the gateway's endpoint (https://HOST:PORT)")
    ap.add_argument("--model", required=True, help="the served model's name (as /v1/models lists it)")
    ap.add_argument(
        "--key-file", type=Path, help="a file holding the gateway's API key (never on the command line)"
    )
    ap.add_argument("--rig-key-file", type=Path, help="a file holding the rig's API key, when it has one")
    ap.add_argument(
        "--cafile", help="the CA that signed the gateway's certificate (a self-signed one: itself)"
    )
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32, help="requests per round and endpoint")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--record", type=Path, help="write LABEL.json here")
    ap.add_argument("--label", default="gateway")
    args = ap.parse_args(argv)
    for name in ("concurrency", "requests", "rounds", "max_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")

    def secret(path: Path | None) -> str:
        if path is None:
            return ""
        try:
            return path.read_text().strip()
        except OSError as exc:
            ap.error(f"cannot read {path}: {exc.strerror}")
        return ""

    try:
        result = measure(
            args.rig, args.gateway, args.model, key=secret(args.key_file), rig_key=secret(args.rig_key_file),
            cafile=args.cafile, concurrency=args.concurrency, requests=args.requests, rounds=args.rounds,
            max_tokens=args.max_tokens,
        )  # fmt: skip
    except (BenchError, httpx.HTTPError) as exc:
        print(f"gateway_overhead: {exc}", file=sys.stderr)
        return 1
    print(result.summary())
    if args.record:
        head = {"rig": args.rig, "gateway": args.gateway, "model": args.model}
        tail = {
            "direct_tokens_per_s": result.tokens_per_s("direct"),
            "gateway_tokens_per_s": result.tokens_per_s("gateway"),
            "ratio": result.ratio,
            "round_ratios": result.round_ratios(),
        }
        print(f"recorded {write_record(args.record, args.label, head, result, tail)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
