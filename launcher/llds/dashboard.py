"""``llds dashboard serve``: the live training dashboard.

A small FastAPI app. Its backend polls every service's ``/health`` and ``/metrics`` and the trainer's
``/history`` and ``/status`` (server-side, so the browser needs no CORS), keeps a bounded ring buffer
of samples, turns counters into rates and histograms into mean / p95 latency, and serves it all as
JSON at ``GET /api/state``. The page (``dashboard_static/``: one HTML, one JS, one CSS file and the
vendored uPlot chart library, no CDN) polls that and draws the charts. Known signals go into named
panels; every other ``llds_*`` metric or history key still gets a panel of its own.

    llds dashboard serve --trainer-url http://127.0.0.1:8002 --rollout-url http://127.0.0.1:8001 \\
        --retriever-url http://127.0.0.1:8000 --port 8003 [--train-log RUN_DIR/trainer/train_log.jsonl]
    # then open http://127.0.0.1:8003/
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import math
import re
import sys
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from llds_proto.messages import HealthResponse
from llds_server.settings import ServiceSettings

log = logging.getLogger("llds.dashboard")
STATIC_DIR = Path(__file__).resolve().parent / "dashboard_static"
SERVICES = ("retriever", "rollout", "trainer")


class DashboardConfig(ServiceSettings):
    """Everything the dashboard decides; env prefix ``LLDS_DASHBOARD_``."""

    model_config = SettingsConfigDict(env_prefix="LLDS_DASHBOARD_", extra="forbid")

    host: str = "127.0.0.1"
    """Interface to bind."""
    port: int = Field(default=8003, ge=0, le=65535)
    """Port to bind."""
    retriever_url: str | None = None
    """Base URL of the retriever (none: not shown)."""
    rollout_url: str | None = None
    """Base URL of the rollout service (none: not shown)."""
    trainer_url: str | None = None
    """Base URL of the trainer (none: not shown)."""
    poll_interval_s: float = Field(default=1.0, gt=0.05, le=60.0)
    """Seconds between two polls of every service."""
    timeout_s: float = Field(default=2.0, gt=0.0, le=60.0)
    """Per-request timeout of a poll."""
    max_samples: int = Field(default=3600, ge=10)
    """Metric samples kept in the ring buffer (one per poll)."""
    max_history: int = Field(default=100_000, ge=10)
    """Trainer step records kept."""
    train_log: Path | None = None
    """The trainer's ``train_log.jsonl``, read as it grows: a second source of step records that
    still has the last steps after the trainer has exited (records are merged by ``step``)."""

    def service_urls(self) -> dict[str, str]:
        """Configured services, name -> base URL without a trailing slash."""
        urls = {"retriever": self.retriever_url, "rollout": self.rollout_url, "trainer": self.trainer_url}
        return {name: url.rstrip("/") for name, url in urls.items() if url}


# --------------------------------------------------------------------------------------------
# Core: pure functions and the sample store (no web framework, unit-testable)
# --------------------------------------------------------------------------------------------


class MetricsParseError(ValueError):
    """A ``/metrics`` body that is not Prometheus text."""


@dataclass
class Histogram:
    """One histogram family, summed over its label sets (except ``le``)."""

    buckets: dict[float, float] = field(default_factory=dict)
    """Upper bound -> cumulative count."""
    sum: float = 0.0
    count: float = 0.0


@dataclass
class Scrape:
    """One parsed ``/metrics`` body, ``llds_*`` families only."""

    gauges: dict[str, float] = field(default_factory=dict)
    """Gauge (and untyped) samples; key ``name`` or ``name{label="v",...}``."""
    counters: dict[str, float] = field(default_factory=dict)
    """Counter sample name (``..._total``) -> value summed over label sets."""
    histograms: dict[str, Histogram] = field(default_factory=dict)
    """Histogram or summary family name -> aggregate."""


def series_key(name: str, labels: dict[str, str]) -> str:
    """``name`` or ``name{a="x",b="y"}`` with sorted labels: the key of one sample's series."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def parse_metrics(text: str, prefix: str = "llds_") -> Scrape:
    """Parse Prometheus text; keep families whose name starts with ``prefix``."""
    from prometheus_client.parser import text_string_to_metric_families

    out = Scrape()
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise MetricsParseError(f"not Prometheus text: {e}") from e
    for fam in families:
        if not fam.name.startswith(prefix):
            continue
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            value = float(s.value)
            if fam.type == "counter":
                out.counters[s.name] = out.counters.get(s.name, 0.0) + value
            elif fam.type in ("histogram", "summary") and s.name != fam.name:
                hist = out.histograms.setdefault(fam.name, Histogram())
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    hist.buckets[le] = hist.buckets.get(le, 0.0) + value
                elif s.name.endswith("_sum"):
                    hist.sum += value
                elif s.name.endswith("_count"):
                    hist.count += value
            else:  # gauges, untyped, and summary quantiles (sample name == family name)
                out.gauges[series_key(s.name, dict(s.labels))] = value
    return out


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus-style quantile from cumulative buckets (linear inside a bucket); None when empty."""
    bounds = sorted(buckets)
    if not bounds:
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    target = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= target:
            if math.isinf(bound):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (target - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def derive(prev: Scrape | None, cur: Scrape, dt: float) -> dict[str, float | None]:
    """Values of one sample: gauges as they are, counter rates and interval histogram stats.

    Keys: gauges ``name[{labels}]``; counters ``name_total`` (value) and ``rate:name_total``
    (per second since the previous scrape; None after a reset); histograms ``rate:name_count``,
    ``mean:name`` and ``p95:name`` over the interval.
    """
    out: dict[str, float | None] = dict(cur.gauges)
    ok_dt = prev is not None and dt > 0
    for name, value in cur.counters.items():
        out[name] = value
        if ok_dt and prev is not None and name in prev.counters:
            delta = value - prev.counters[name]
            out[f"rate:{name}"] = delta / dt if delta >= 0 else None
    for name, hist in cur.histograms.items():
        out[f"{name}_count"] = hist.count
        old = prev.histograms.get(name) if ok_dt and prev is not None else None
        if old is None:
            continue
        n = hist.count - old.count
        if n < 0:  # the service restarted: no interval statistics for this sample
            continue
        out[f"rate:{name}_count"] = n / dt
        out[f"mean:{name}"] = (hist.sum - old.sum) / n if n > 0 else None
        if hist.buckets:
            window = {le: c - old.buckets.get(le, 0.0) for le, c in hist.buckets.items()}
            out[f"p95:{name}"] = histogram_quantile(0.95, window) if n > 0 else None
    return out


def finite(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become None (JSON has no NaN), containers recursed."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


# ------------------------------------------------------------------ layout

Source = Literal["history", "metrics"]


@dataclass(frozen=True)
class Panel:
    """A named chart: which series it draws and from where."""

    id: str
    title: str
    source: Source
    series: tuple[str, ...]
    section: str
    unit: str = ""
    """``s`` (seconds), ``/s`` (rate) or empty."""
    stepped: bool = False
    """Draw as steps (versions, alarm levels)."""
    y_range: tuple[float, float] | None = None
    """Fixed y axis (e.g. the alarm's 0..2); none: fit the data."""


H: Source = "history"
M: Source = "metrics"
# A series spec "a|b" names one signal by alternative names (the spec's and the services' own);
# whichever exists is drawn. Each panel lists the names in the issue first, then what the services
# export today.
PANELS: tuple[Panel, ...] = (
    Panel("reward", "Reward and exact match", H, ("reward/mean", "reward/exact_match"), "Reward"),
    Panel("lld_alarm", "LLD alarm (0 ok, 1 warning, 2 alarm)", H, ("lld/alarm",), "Reward", stepped=True,
          y_range=(0, 2)),
    Panel("loss_llds", "LLDS term", H, ("loss/llds|lld/llds_term",), "Reward"),
    Panel("llds_lambda", "LLDS lambda and alarm actions (1 = the alarm acted)", H, ("llds/lambda", "lld/action"),
          "Reward", stepped=True),
    Panel("loss", "Losses", H, ("loss/total", "loss/policy", "loss/kl"), "Reward"),
    Panel("lld_logp", "Log-likelihood per token (correct, first / later actions, incorrect)", H,
          ("lld/correct_logp_mean|lld/correct_logp_token", "lld/first_action_logp", "lld/later_action_logp",
           "lld/incorrect_logp_token"), "LLD signals"),
    Panel("lld_slope", "Correct log-likelihood slope", H, ("lld/correct_logp_slope",), "LLD signals"),
    Panel("lld_displaced", "Fraction displaced (fell) and LLDS-gated", H,
          ("lld/displaced_frac_responses|lld/fell_fraction_responses",
           "lld/displaced_frac_actions|lld/fell_fraction_actions", "llds/gated_frac|llds/gated_fraction"),
          "LLD signals"),
    Panel("lld_displacement", "Intra-step displacement (sum of logp change)", H,
          ("lld/displacement_mean", "lld/first_action_displacement", "lld/later_action_displacement"), "LLD signals"),
    Panel("lld_gap", "Correct - incorrect log-likelihood gap", H, ("lld/correct_incorrect_gap",), "LLD signals"),
    Panel("entropy", "Token entropy", H, ("actor/entropy",), "Policy"),
    Panel("grad_norm", "Gradient norm (pre-clip)", H, ("actor/grad_norm", "actor/grad_norm_max"), "Policy"),
    Panel("clip_frac", "Clip fraction and max ratio", H, ("actor/clip_frac", "actor/ratio_max"), "Policy"),
    Panel("response_length", "Response length (tokens)", H,
          ("response/length_mean|rollout/response_len_mean",), "Policy"),
    Panel("turns", "Turns and valid searches", H,
          ("response/turns_mean|rollout/turns_mean", "response/valid_searches_mean|rollout/valid_searches_mean"),
          "Policy"),
    Panel("weights_step", "Weights version per step", H, ("weights/version",), "Policy", stepped=True),
    Panel("queue", "Stream length and consumer lag (entries)", M,
          ("llds_trainer_stream_length_entries", "llds_trainer_consumer_lag_entries", "llds_rollout_redis_buffer_groups"), "System"),
    Panel("staleness", "Groups dropped (stale)", M,
          ("rate:llds_rollout_staleness_dropped_total|rate:llds_rollout_stale_groups_dropped_total",
           "rate:llds_trainer_groups_dropped_total"), "System", "/s"),
    Panel("tokens", "Tokens/s (generated, trained)", M,
          ("rate:llds_rollout_generated_tokens_total", "llds_trainer_train_tokens_per_second"), "System", "/s"),
    Panel("trajectories", "Trajectories/s (generated, trained)", M,
          ("rate:llds_rollout_trajectories_total", "rate:llds_trainer_trajectories_consumed_total"), "System", "/s"),
    Panel("retrieval_qps", "Retrieval requests/s and queries/s", M,
          ("rate:llds_retriever_requests_total", "rate:llds_retriever_queries_total"), "System", "/s"),
    Panel("retrieval_latency", "Retrieval latency (server mean / p95, seen by rollout p95)", M,
          ("mean:llds_retriever_request_latency_seconds", "p95:llds_retriever_request_latency_seconds",
           "p95:llds_rollout_retriever_latency_seconds"), "System", "s"),
    Panel("weights", "Weights version (trainer, rollout)", M,
          ("llds_trainer_weights_version", "llds_rollout_weights_version", "llds_rollout_trainer_version"),
          "System", stepped=True),
    Panel("swaps", "Weight swaps/s", M,
          ("rate:llds_rollout_weight_swaps_total|rate:llds_rollout_weight_swap_seconds_count",), "System", "/s"),
    Panel("swap_time", "Weight swap time", M, ("mean:llds_rollout_weight_swap_seconds",), "System", "s"),
    Panel("trainer_step", "Trainer step", M, ("llds_trainer_step",), "System", stepped=True),
)  # fmt: skip
TRAINER_GAUGES_SECTION = "Trainer gauges (the last step's values, as Prometheus sees them)"
# History keys that are bookkeeping, not signals.
HIDDEN_HISTORY = {"step", "time/unix"}

_KEY_PREFIX = re.compile(r"^(rate|mean|p95):")
_KEY_SUFFIX = re.compile(r"(_total|_count|_sum)$")


def metric_family(key: str) -> str:
    """Family a sample key belongs to: ``rate:x_total`` -> ``x``, ``x{a="b"}`` -> ``x``."""
    base = _KEY_PREFIX.sub("", key).split("{", 1)[0]
    return _KEY_SUFFIX.sub("", base)


def _matches(spec: str, keys: Iterable[str]) -> list[str]:
    """Keys that ``spec`` names: the first alternative that exists (labelled variants included)."""
    for alt in spec.split("|"):
        found = sorted(k for k in keys if k == alt or k.startswith(alt + "{"))
        if found:
            return found
    return []


def layout(metric_keys: Iterable[str], history_keys: Iterable[str]) -> list[dict[str, Any]]:
    """Panels to draw: every known panel (with the series present now and those still missing),
    then one panel per unknown history-key prefix and one per unknown metric family."""
    mkeys, hkeys = set(metric_keys), set(history_keys)
    panels: list[dict[str, Any]] = []
    claimed_h: set[str] = set()
    claimed_m: set[str] = set()
    for p in PANELS:
        keys = hkeys if p.source == H else mkeys
        present: list[str] = []
        missing: list[str] = []
        for spec in p.series:
            found = _matches(spec, keys)
            present.extend(found)
            if not found:
                missing.append(spec.split("|")[0])
            for alt in spec.split("|"):
                if p.source == H:
                    claimed_h.add(alt)
                else:
                    claimed_m.add(metric_family(alt))
        panels.append({"id": p.id, "title": p.title, "source": p.source, "section": p.section, "unit": p.unit,
                       "stepped": p.stepped, "series": present, "missing": missing, "known": True,
                       "collapsed": False, "y_range": p.y_range})  # fmt: skip
    by_prefix: dict[str, list[str]] = {}
    for k in sorted(hkeys - claimed_h - HIDDEN_HISTORY):
        by_prefix.setdefault(k.split("/", 1)[0] if "/" in k else "other", []).append(k)
    for prefix, hseries in by_prefix.items():
        panels.append({"id": f"h:{prefix}", "title": f"{prefix}/*", "source": H, "section": "More training keys",
                       "unit": "", "stepped": False, "series": hseries, "missing": [], "known": False,
                       "collapsed": False})  # fmt: skip
    by_family: dict[tuple[str, bool], list[str]] = {}
    for k in sorted(mkeys):
        fam = metric_family(k)
        if fam in claimed_m:
            continue
        # Raw counter totals are drawn as rates, histogram counts as rate/mean/p95.
        if (k.endswith("_total") or k.endswith("_count")) and not k.startswith("rate:"):
            continue
        by_family.setdefault((fam, k.startswith("rate:")), []).append(k)
    for (fam, is_rate), mseries in by_family.items():
        unit = "/s" if is_rate else ("s" if fam.endswith("_seconds") else "")
        pid, title = (f"m:{fam}:rate", f"{fam} (per second)") if is_rate else (f"m:{fam}", fam)
        # The trainer's gauges repeat its last step record, already drawn per step: fold them away.
        mirror = fam.startswith("llds_trainer_") and not is_rate and not any(":" in k for k in mseries)
        section = TRAINER_GAUGES_SECTION if mirror else "More metrics"
        panels.append({"id": pid, "title": title, "source": M, "section": section, "unit": unit,
                       "stepped": False, "series": mseries, "missing": [], "known": False,
                       "collapsed": mirror})  # fmt: skip
    return panels


# ------------------------------------------------------------------ store


def _now() -> float:
    return time.time()


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
        self.started_at = _now()
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
            step = rec.get("step")
            if isinstance(step, int | float) and not isinstance(step, bool):
                if self.last_step is not None and step <= self.last_step:
                    continue
                self.last_step = int(step)
            else:
                rec = {**rec, "step": self.history_total}
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
        alarm = latest_rec.get("lld/alarm")
        return {
            "boot_id": self.boot_id,
            "now": _now(),
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


class LogTail:
    """The complete JSONL lines appended to a file since the previous read."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.bad_lines = 0

    def read(self) -> list[dict[str, Any]]:
        """New records; a missing file is no records yet, a shrunk file is read again from the start."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:
            self.offset = 0
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        records: list[dict[str, Any]] = []
        for line in data[: end + 1].splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                self.bad_lines += 1
                log.warning("%s: skipped a line that is not JSON (%d so far)", self.path, self.bad_lines)
                continue
            if isinstance(rec, dict):
                records.append(rec)
        return records


# --------------------------------------------------------------------------------------------
# Poller: fetches every service, feeds the store
# --------------------------------------------------------------------------------------------


class Poller:
    """Polls every configured service once per interval (all concurrently)."""

    def __init__(self, cfg: DashboardConfig, store: Store, metrics: DashboardMetrics, transport: Any = None):
        import httpx

        self.cfg = cfg
        self.store = store
        self.metrics = metrics
        self.client = httpx.AsyncClient(timeout=cfg.timeout_s, transport=transport)
        self.rounds = 0
        self.log_tail = LogTail(cfg.train_log) if cfg.train_log else None

    async def poll_once(self) -> None:
        """One round: every service's health and metrics, the trainer's history; one sample."""
        t = _now()
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
                values.update(self.store.add_scrape(svc.name, _now(), parse_metrics(r.text)))
            except (httpx.HTTPError, MetricsParseError) as e:
                errors.append(f"metrics: {e}")
            if svc.name == "trainer":
                errors.extend(await self._poll_trainer(svc))
        ok = not errors and svc.status != "down"
        if svc.status != was:
            log.info("service=%s url=%s status %s -> %s%s", svc.name, svc.url, was, svc.status,
                     f" ({'; '.join(errors)})" if errors else "")  # fmt: skip
        svc.error = "; ".join(errors) or None
        svc.checked_at = _now()
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


# --------------------------------------------------------------------------------------------
# App
# --------------------------------------------------------------------------------------------


class DashboardMetrics:
    """The dashboard's own Prometheus metrics, in a registry of its own."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.polls = Counter(
            "llds_dashboard_polls",
            "Service polls, by service and outcome",
            ["service", "outcome"],
            registry=r,
        )
        self.poll_seconds = Histogram("llds_dashboard_poll_duration_seconds", "Time to poll one service", ["service"],
                                      registry=r, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))  # fmt: skip
        self.up = Gauge(
            "llds_dashboard_service_up", "1 when the service's /health said ok", ["service"], registry=r
        )
        self.samples = Gauge(
            "llds_dashboard_buffered_samples", "Metric samples in the ring buffer", registry=r
        )
        self.history = Gauge("llds_dashboard_history_records", "Trainer step records held", registry=r)
        self.api = Counter("llds_dashboard_api_requests", "Requests to GET /api/state", registry=r)


def create_app(cfg: DashboardConfig, transport: Any = None, poll: bool = True) -> Any:
    """The FastAPI app. ``transport``: an httpx transport for tests; ``poll=False``: no background
    polling (tests drive ``app.state.poller.poll_once()`` themselves)."""
    from fastapi import FastAPI, Query
    from fastapi.responses import FileResponse, JSONResponse, Response
    from fastapi.staticfiles import StaticFiles
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    store = Store(cfg.service_urls(), cfg.max_samples, cfg.max_history)
    metrics = DashboardMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        poller = Poller(cfg, store, metrics, transport=transport)
        app.state.poller = poller
        task = asyncio.create_task(poller.run()) if poll else None
        log.info("dashboard polling %s every %.1f s", cfg.service_urls(), cfg.poll_interval_s)
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
            await poller.aclose()

    app = FastAPI(title="llds dashboard", lifespan=lifespan)
    app.state.store = store
    app.state.metrics = metrics
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/health")
    async def health() -> HealthResponse:
        detail: dict[str, object] = {"services": {n: s.status for n, s in store.services.items()},
                                     "samples": len(store.samples), "history_records": store.history_total}  # fmt: skip
        return HealthResponse(status="ok", service="dashboard", detail=detail)

    @app.get("/metrics", include_in_schema=False)
    async def prom() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/state", response_model=None)
    async def api_state(
        since: int = Query(0, ge=0, description="last sample seq the client holds"),
        history_since: int = Query(0, ge=0, description="number of step records the client holds"),
        boot_id: str | None = Query(None, description="boot id the client's data came from"),
    ) -> JSONResponse:
        metrics.api.inc()
        return JSONResponse(store.state(since, history_since, boot_id), headers={"Cache-Control": "no-store"})

    return app


def parse_args(argv: list[str]) -> DashboardConfig:
    p = argparse.ArgumentParser(prog="llds dashboard serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, help="TOML file with DashboardConfig fields")
    p.add_argument("--host", help="bind address")
    p.add_argument("--port", type=int, help="port")
    for svc in SERVICES:
        p.add_argument(f"--{svc}-url", dest=f"{svc}_url", help=f"base URL of the {svc}")
    p.add_argument("--poll-interval", type=float, dest="poll_interval_s", help="seconds between polls")
    p.add_argument("--timeout", type=float, dest="timeout_s", help="per-request poll timeout (s)")
    p.add_argument("--max-samples", type=int, help="metric samples kept")
    p.add_argument("--train-log", type=Path, help="the trainer's train_log.jsonl (also read, merged by step)")
    return DashboardConfig.from_cli(p, argv)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll request is noise
    import uvicorn

    app = create_app(cfg)
    print(
        f"dashboard  http://{cfg.host}:{cfg.port}/  polling {', '.join(cfg.service_urls()) or 'no services'}"
    )
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
