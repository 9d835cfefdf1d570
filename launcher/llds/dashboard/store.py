"""The store: bounded buffers of metric samples, trainer step records and weight-version events, and
what ``GET /api/state`` serves from them."""

from __future__ import annotations

import itertools
import math
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from llds.dashboard.panels import layout
from llds.dashboard.scrape import Scrape, derive, metric_family
from llds_proto import steplog as K


def now() -> float:
    """Wall-clock time (Unix seconds) of samples, polls and the state."""
    return time.time()


def finite(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become None (JSON has no NaN), containers recursed."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


@dataclass
class ServiceState:
    """What the dashboard last learned about one service."""

    name: str
    url: str
    status: str = "unknown"
    """``ok`` / ``starting`` / ``degraded`` from its /health, ``down`` when unreachable, ``error`` else."""
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    checked_at: float | None = None
    last_ok_at: float | None = None
    poll_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Trainer: its /status body."""

    def as_json(self) -> dict[str, Any]:
        return finite({"name": self.name, "url": self.url, "status": self.status, "detail": self.detail,
                       "error": self.error, "checked_at": self.checked_at, "last_ok_at": self.last_ok_at,
                       "poll_ms": self.poll_ms, "extra": self.extra})  # fmt: skip


class Store:
    """Bounded buffers of metric samples, trainer step records and weight-version events."""

    def __init__(self, services: dict[str, str], max_samples: int = 3600, max_history: int = 100_000):
        self.boot_id = uuid.uuid4().hex[:12]
        self.started_at = now()
        self.services = {name: ServiceState(name, url) for name, url in services.items()}
        self.samples: deque[dict[str, Any]] = deque(maxlen=max_samples)
        self.seq = 0
        self.history: deque[dict[str, Any]] = deque(maxlen=max_history)
        self.history_total = 0
        self.last_step: int | None = None
        self.events: deque[dict[str, Any]] = deque(maxlen=200)
        self.metric_keys: set[str] = set()
        self.history_keys: set[str] = set()
        self.scrapes: dict[str, tuple[float, Scrape]] = {}
        self.latest: dict[str, float | None] = {}

    def add_scrape(self, service: str, t: float, scrape: Scrape) -> dict[str, float | None]:
        """Derive one service's values against its previous scrape; returns them."""
        prev = self.scrapes.get(service)
        values = derive(prev[1] if prev else None, scrape, t - prev[0] if prev else 0.0)
        self.scrapes[service] = (t, scrape)
        return values

    def add_sample(self, t: float, values: dict[str, float | None]) -> None:
        """Append one poll round's values; records weight-version changes as events."""
        for key, value in values.items():
            if metric_family(key).endswith("_weights_version") and value is not None:
                old = self.latest.get(key)
                if old is not None and old != value:
                    self.events.append({"t": t, "kind": "weights", "key": key, "from": old, "to": value})
        self.latest.update(values)
        self.seq += 1
        self.samples.append({"seq": self.seq, "t": t, "values": finite(values)})
        self.metric_keys.update(values)

    def add_history(self, records: list[Any]) -> int:
        """Append trainer step records not seen yet (by ``step``); returns how many were new."""
        added = 0
        for rec in records:
            if not isinstance(rec, dict):
                continue
            step = rec.get(K.STEP)
            if isinstance(step, int | float) and not isinstance(step, bool):
                if self.last_step is not None and step <= self.last_step:
                    continue
                self.last_step = int(step)
            else:
                rec = {**rec, K.STEP: self.history_total}
            rec = finite(rec)
            self.history.append(rec)
            self.history_total += 1
            self.history_keys.update(
                k for k, v in rec.items() if isinstance(v, int | float) and not isinstance(v, bool)
            )
            added += 1
        return added

    def history_since(self) -> int:
        """The ``since`` argument of the next ``/history`` request."""
        return self.last_step if self.last_step is not None else self.history_total

    def state(self, since: int = 0, history_since: int = 0, boot_id: str | None = None) -> dict[str, Any]:
        """What the page needs: samples after ``since``, history records after ``history_since``.

        A client holding another ``boot_id`` (the dashboard restarted) gets everything again.
        """
        if boot_id is not None and boot_id != self.boot_id:
            since, history_since = 0, 0
        samples = [s for s in self.samples if s["seq"] > since]
        dropped = self.history_total - len(self.history)
        start = max(0, history_since - dropped)
        history = (
            list(itertools.islice(self.history, start, None)) if history_since < self.history_total else []
        )
        latest_rec = self.history[-1] if self.history else {}
        alarm = latest_rec.get(K.LLD_ALARM)
        return {
            "boot_id": self.boot_id,
            "now": now(),
            "started_at": self.started_at,
            "seq": self.seq,
            "samples": samples,
            "history_total": self.history_total,
            "history": history,
            "services": {name: s.as_json() for name, s in self.services.items()},
            "events": list(self.events),
            "alarm": alarm,
            "step": self.last_step,
            "layout": layout(self.metric_keys, self.history_keys),
        }
