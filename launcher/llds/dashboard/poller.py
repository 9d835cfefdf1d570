"""The poller: fetches every service's health, metrics and (trainer) history and status, and tails
the trainer's step log, feeding the store."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from llds.dashboard.config import DashboardConfig
from llds.dashboard.metrics import DashboardMetrics
from llds.dashboard.scrape import MetricsParseError, parse_metrics
from llds.dashboard.store import ServiceState, Store, now
from llds_proto.steplog import StepLogTail

log = logging.getLogger("llds.dashboard")


class Poller:
    """Polls every configured service once per interval (all concurrently)."""

    def __init__(self, cfg: DashboardConfig, store: Store, metrics: DashboardMetrics, transport: Any = None):
        import httpx

        self.cfg = cfg
        self.store = store
        self.metrics = metrics
        self.client = httpx.AsyncClient(timeout=cfg.timeout_s, transport=transport)
        self.rounds = 0
        # A log cut by a restarted trainer is read again from its start (the store keeps new steps only).
        self.log_tail = StepLogTail(cfg.train_log) if cfg.train_log else None

    async def poll_once(self) -> None:
        """One round: every service's health and metrics, the trainer's history; one sample."""
        t = now()
        results = await asyncio.gather(*(self._poll_service(s) for s in self.store.services.values()))
        values: dict[str, float | None] = {}
        for part in results:
            values.update(part)
        if self.log_tail is not None:
            self.store.add_history(self.log_tail.read())
        self.store.add_sample(t, values)
        self.rounds += 1
        self.metrics.samples.set(len(self.store.samples))
        self.metrics.history.set(len(self.store.history))

    async def _poll_service(self, svc: ServiceState) -> dict[str, float | None]:
        import httpx

        t0 = time.perf_counter()
        was = svc.status
        values: dict[str, float | None] = {}
        errors: list[str] = []
        try:
            r = await self.client.get(f"{svc.url}/health")
            parsed = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            body: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
            svc.status = str(body.get("status") or ("ok" if r.status_code == 200 else "error"))
            detail = body.get("detail")
            svc.detail = detail if isinstance(detail, dict) else {}
        except httpx.HTTPError as e:
            svc.status, svc.detail = "down", {}
            errors.append(f"health: {type(e).__name__}")
        except ValueError as e:
            svc.status = "error"
            errors.append(f"health: bad JSON ({e})")
        if svc.status != "down":
            try:
                r = await self.client.get(f"{svc.url}/metrics")
                r.raise_for_status()
                values.update(self.store.add_scrape(svc.name, now(), parse_metrics(r.text)))
            except (httpx.HTTPError, MetricsParseError) as e:
                errors.append(f"metrics: {e}")
            if svc.name == "trainer":
                errors.extend(await self._poll_trainer(svc))
        ok = not errors and svc.status != "down"
        if svc.status != was:
            log.info("service=%s url=%s status %s -> %s%s", svc.name, svc.url, was, svc.status,
                     f" ({'; '.join(errors)})" if errors else "")  # fmt: skip
        svc.error = "; ".join(errors) or None
        svc.checked_at = now()
        svc.poll_ms = (time.perf_counter() - t0) * 1000.0
        if svc.status == "ok":
            svc.last_ok_at = svc.checked_at
        self.metrics.polls.labels(service=svc.name, outcome="ok" if ok else "error").inc()
        self.metrics.poll_seconds.labels(service=svc.name).observe(svc.poll_ms / 1000.0)
        self.metrics.up.labels(service=svc.name).set(1.0 if svc.status == "ok" else 0.0)
        return values

    async def _poll_trainer(self, svc: ServiceState) -> list[str]:
        import httpx

        errors: list[str] = []
        try:
            r = await self.client.get(f"{svc.url}/history", params={"since": self.store.history_since()})
            r.raise_for_status()
            records = r.json()
            if not isinstance(records, list):
                raise ValueError(f"expected a JSON list, got {type(records).__name__}")
            self.store.add_history(records)
        except (httpx.HTTPError, ValueError) as e:
            errors.append(f"history: {e}")
        try:
            r = await self.client.get(f"{svc.url}/status")
            r.raise_for_status()
            body = r.json()
            svc.extra = body if isinstance(body, dict) else {"status": body}
        except (httpx.HTTPError, ValueError) as e:
            errors.append(f"status: {e}")
        return errors

    async def run(self) -> None:
        """Poll until cancelled, one round per interval."""
        while True:
            t0 = time.monotonic()
            try:
                await self.poll_once()
            except Exception:  # a bug in one round must not stop the dashboard; it is logged
                log.exception("poll round failed")
            await asyncio.sleep(max(0.0, self.cfg.poll_interval_s - (time.monotonic() - t0)))

    async def aclose(self) -> None:
        await self.client.aclose()
