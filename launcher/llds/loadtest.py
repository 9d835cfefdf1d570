"""Bounded load against running services: N concurrent clients for a fixed time, then percentiles.

Counts every response by status; a 503 must carry ``Retry-After`` (deliberate backpressure), any
other non-200 is an error. Stops by itself after ``duration_s`` (plus the requests in flight, each
bounded by ``timeout_s``). Loopback targets only.

    python -m llds.loadtest --url http://127.0.0.1:8000/retrieve --kind retrieve --clients 256 --seconds 20
    python -m llds.loadtest --url http://127.0.0.1:8001/answer --kind answer --clients 32 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import httpx

from llds_server.http import is_loopback

_WORDS = [
    "founder",
    "city",
    "born",
    "academy",
    "river",
    "country",
    "occupation",
    "institute",
    "museum",
    "year",
]


@dataclass
class LoadResult:
    """Outcome of one load run."""

    clients: int
    seconds: float
    ok: int = 0
    backpressure: int = 0
    backpressure_without_retry_after: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies_s: list[float] = field(default_factory=list)

    def percentile(self, q: float) -> float:
        xs = sorted(self.latencies_s)
        if not xs:
            return float("nan")
        return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]

    def summary(self) -> dict[str, object]:
        return {
            "clients": self.clients,
            "seconds": round(self.seconds, 2),
            "ok": self.ok,
            "rps": round(self.ok / self.seconds, 2) if self.seconds else 0.0,
            "backpressure_503": self.backpressure,
            "backpressure_without_retry_after": self.backpressure_without_retry_after,
            "errors": self.errors,
            "p50_ms": round(self.percentile(50) * 1000, 1),
            "p90_ms": round(self.percentile(90) * 1000, 1),
            "p99_ms": round(self.percentile(99) * 1000, 1),
        }


def _body(kind: str, rng: random.Random, i: int) -> dict[str, object]:
    words = " ".join(rng.choice(_WORDS) for _ in range(3))
    if kind == "retrieve":
        return {"queries": [f"{words} {i}"], "topk": 3, "return_scores": True}
    return {"question": f"Who is the {words} number {i}?", "max_turns": 1}


def _check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    if not is_loopback(host):
        raise ValueError(f"load tests only target loopback addresses, not {host!r}")


async def run_load(
    url: str, kind: str, clients: int, duration_s: float, timeout_s: float = 60.0
) -> LoadResult:
    """``clients`` workers each send one request at a time until ``duration_s`` has passed."""
    _check_loopback(url)
    res = LoadResult(clients=clients, seconds=0.0)
    stop_at = time.monotonic() + duration_s
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:

        async def worker(w: int) -> None:
            rng = random.Random(w)
            i = 0
            while time.monotonic() < stop_at:
                t0 = time.perf_counter()
                try:
                    r = await client.post(url, json=_body(kind, rng, w * 100_000 + i))
                except httpx.HTTPError as e:
                    key = type(e).__name__
                    res.errors[key] = res.errors.get(key, 0) + 1
                    continue
                finally:
                    i += 1
                dt = time.perf_counter() - t0
                if r.status_code == 200:
                    res.ok += 1
                    res.latencies_s.append(dt)
                elif r.status_code == 503:
                    res.backpressure += 1
                    if "retry-after" not in r.headers:
                        res.backpressure_without_retry_after += 1
                    await asyncio.sleep(float(r.headers.get("retry-after", "0.05") or 0.05) / 10)
                else:
                    key = str(r.status_code)
                    res.errors[key] = res.errors.get(key, 0) + 1

        t0 = time.monotonic()
        await asyncio.gather(*(worker(w) for w in range(clients)))
        res.seconds = time.monotonic() - t0
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llds.loadtest", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="full URL of the route (loopback only)")
    p.add_argument("--kind", choices=["retrieve", "answer"], required=True, help="request body to send")
    p.add_argument("--clients", type=int, default=64, help="concurrent clients")
    p.add_argument("--seconds", type=float, default=10.0, help="how long to send new requests")
    args = p.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0:
        p.error(f"--clients ({args.clients}) must be >= 1 and --seconds ({args.seconds}) > 0")
    res = asyncio.run(run_load(args.url, args.kind, args.clients, args.seconds))
    print(json.dumps(res.summary(), indent=2))
    return 0 if not res.errors and not res.backpressure_without_retry_after else 1


if __name__ == "__main__":
    raise SystemExit(main())
