"""Prometheus text from a service's ``/metrics``, parsed (``prometheus_client``'s parser) and turned
into one sample's values: gauges as they are, counter rates, interval histogram mean and p95."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field


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


_KEY_PREFIX = re.compile(r"^(rate|mean|p95):")
_KEY_SUFFIX = re.compile(r"(_total|_count|_sum)$")


def metric_family(key: str) -> str:
    """Family a sample key belongs to: ``rate:x_total`` -> ``x``, ``x{a="b"}`` -> ``x``."""
    base = _KEY_PREFIX.sub("", key).split("{", 1)[0]
    return _KEY_SUFFIX.sub("", base)
