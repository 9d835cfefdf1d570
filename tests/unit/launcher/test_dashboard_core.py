"""The dashboard's pure core: metrics parsing, rates, histogram quantiles, panel layout, the store."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from llds.dashboard.panels import PANELS, layout
from llds.dashboard.scrape import (
    MetricsParseError,
    derive,
    histogram_quantile,
    metric_family,
    parse_metrics,
    series_key,
)
from llds.dashboard.store import Store, finite
from llds_proto import steplog as K


def _registry() -> tuple[CollectorRegistry, Counter, Gauge, Histogram]:
    r = CollectorRegistry()
    c = Counter("llds_rollout_generated_tokens", "tokens", ["replica"], registry=r)
    g = Gauge("llds_rollout_weights_version", "version", ["replica"], registry=r)
    h = Histogram(
        "llds_retriever_request_latency_seconds", "latency", ["route"], registry=r, buckets=(0.01, 0.1, 1.0)
    )
    Gauge("python_other_thing", "not ours", registry=r).set(5)
    return r, c, g, h


def test_parse_metrics_keeps_llds_families_and_aggregates() -> None:
    r, c, g, h = _registry()
    c.labels(replica="a").inc(10)
    c.labels(replica="b").inc(5)
    g.labels(replica="a").set(3)
    h.labels(route="/retrieve").observe(0.05)
    h.labels(route="/batch").observe(0.5)
    s = parse_metrics(generate_latest(r).decode())
    assert s.counters == {"llds_rollout_generated_tokens_total": 15.0}
    assert s.gauges == {'llds_rollout_weights_version{replica="a"}': 3.0}
    hist = s.histograms["llds_retriever_request_latency_seconds"]
    assert hist.count == 2.0 and hist.sum == pytest.approx(0.55)
    assert hist.buckets == {0.01: 0.0, 0.1: 1.0, 1.0: 2.0, math.inf: 2.0}


def test_parse_metrics_rejects_garbage() -> None:
    with pytest.raises(MetricsParseError):
        parse_metrics("llds_x{broken 1\n")


def test_series_key_sorts_labels() -> None:
    assert series_key("m", {}) == "m"
    assert series_key("m", {"b": "2", "a": "1"}) == 'm{a="1",b="2"}'


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = {0.1: 50.0, 0.2: 100.0, math.inf: 100.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.75, buckets) == pytest.approx(0.15)
    assert histogram_quantile(0.95, {0.1: 0.0, math.inf: 10.0}) == pytest.approx(0.1)  # in +Inf: lower bound
    assert histogram_quantile(0.95, {0.1: 0.0, math.inf: 0.0}) is None
    assert histogram_quantile(0.95, {}) is None


def test_derive_rates_and_interval_histogram_stats() -> None:
    r, c, _g, h = _registry()
    c.labels(replica="a").inc(100)
    h.labels(route="x").observe(0.05)
    prev = parse_metrics(generate_latest(r).decode())
    first = derive(None, prev, 0.0)
    assert first["llds_rollout_generated_tokens_total"] == 100.0
    assert "rate:llds_rollout_generated_tokens_total" not in first  # no rate without a previous scrape
    c.labels(replica="a").inc(50)
    for v in (0.005, 0.005, 0.005, 0.5):
        h.labels(route="x").observe(v)
    cur = parse_metrics(generate_latest(r).decode())
    out = derive(prev, cur, 2.0)
    assert out["rate:llds_rollout_generated_tokens_total"] == pytest.approx(25.0)
    assert out["rate:llds_retriever_request_latency_seconds_count"] == pytest.approx(2.0)
    assert out["mean:llds_retriever_request_latency_seconds"] == pytest.approx(0.515 / 4)
    # 4 new observations: 3 in (0, 0.01], 1 in (0.1, 1]; p95 target 3.8 lies in (0.1, 1].
    assert out["p95:llds_retriever_request_latency_seconds"] == pytest.approx(0.1 + 0.9 * 0.8)


def test_derive_counter_reset_gives_no_rate() -> None:
    r1, c1, _, _ = _registry()
    c1.labels(replica="a").inc(100)
    r2, c2, _, _ = _registry()
    c2.labels(replica="a").inc(3)
    out = derive(
        parse_metrics(generate_latest(r1).decode()), parse_metrics(generate_latest(r2).decode()), 1.0
    )
    assert out["rate:llds_rollout_generated_tokens_total"] is None


def test_finite_replaces_nan_and_inf() -> None:
    assert finite({"a": math.nan, "b": [1.0, math.inf], "c": "x"}) == {"a": None, "b": [1.0, None], "c": "x"}


def test_metric_family() -> None:
    assert metric_family("rate:llds_x_requests_total") == "llds_x_requests"
    assert metric_family('llds_x_up{a="b"}') == "llds_x_up"
    assert metric_family("p95:llds_x_latency_seconds") == "llds_x_latency_seconds"
    assert metric_family("llds_x_latency_seconds_count") == "llds_x_latency_seconds"


def test_layout_places_known_keys_and_groups_the_rest() -> None:
    hkeys = {
        "step",
        "reward/mean",
        "lld/alarm",
        "lld/correct_logp_slope",
        "timing/step_s",
        "timing/io_s",
        "odd",
    }
    mkeys = {
        "llds_trainer_stream_length_entries", "rate:llds_rollout_generated_tokens_total", "llds_rollout_generated_tokens_total",
        'llds_rollout_weights_version{replica="a"}', "llds_new_thing_total", "rate:llds_new_thing_total",
        "llds_new_gauge", "mean:llds_new_lat_seconds", "rate:llds_new_lat_seconds_count", "llds_new_lat_seconds_count",
    }  # fmt: skip
    panels = {p["id"]: p for p in layout(mkeys, hkeys)}
    assert panels["reward"]["series"] == ["reward/mean"]
    assert panels["reward"]["missing"] == ["reward/exact_match"]
    assert panels["lld_alarm"]["series"] == ["lld/alarm"] and panels["lld_alarm"]["stepped"]
    assert panels["lld_alarm"]["y_range"] == (0, 2)
    assert panels["lld_slope"]["series"] == ["lld/correct_logp_slope"]
    assert panels["tokens"]["series"] == ["rate:llds_rollout_generated_tokens_total"]
    assert panels["weights"]["series"] == [
        'llds_rollout_weights_version{replica="a"}'
    ]  # labelled series match
    assert panels["queue"]["missing"] == [
        "llds_trainer_consumer_lag_entries",
        "llds_rollout_redis_buffer_groups",
    ]
    assert panels["h:timing"]["series"] == ["timing/io_s", "timing/step_s"]
    assert panels["h:other"]["series"] == ["odd"]
    assert panels["m:llds_new_thing:rate"]["series"] == ["rate:llds_new_thing_total"]
    assert panels["m:llds_new_gauge"]["series"] == ["llds_new_gauge"]
    assert panels["m:llds_new_lat_seconds"]["series"] == ["mean:llds_new_lat_seconds"]
    assert panels["m:llds_new_lat_seconds"]["unit"] == "s"
    assert panels["m:llds_new_lat_seconds:rate"]["series"] == ["rate:llds_new_lat_seconds_count"]
    # Nothing is drawn twice, and every known panel is always present (empty until data comes).
    claimed = [k for p in panels.values() for k in p["series"]]
    assert len(claimed) == len(set(claimed))
    assert {p.id for p in PANELS} <= set(panels)


def test_known_panels_cover_the_documented_signals() -> None:
    wanted = {
        K.REWARD_MEAN, K.REWARD_EXACT_MATCH, K.LOSS_LLDS, K.LLD_CORRECT_LOGP_TOKEN, K.LLD_CORRECT_LOGP_SLOPE,
        K.LLD_FELL_FRACTION_RESPONSES, K.LLD_FELL_FRACTION_ACTIONS, K.LLD_FIRST_ACTION_LOGP,
        K.LLD_LATER_ACTION_LOGP, K.LLD_CORRECT_INCORRECT_GAP, K.LLD_ALARM, K.LLDS_GATED_FRACTION, K.ACTOR_ENTROPY,
        K.ACTOR_GRAD_NORM, K.ROLLOUT_RESPONSE_LEN_MEAN, K.ROLLOUT_TURNS_MEAN, K.ROLLOUT_VALID_SEARCHES_MEAN,
        "llds_trainer_stream_length_entries", "llds_trainer_consumer_lag_entries", "rate:llds_rollout_generated_tokens_total",
        "rate:llds_rollout_trajectories_total", "rate:llds_retriever_requests_total",
        "p95:llds_retriever_request_latency_seconds", "llds_rollout_weights_version",
        "rate:llds_rollout_stale_groups_dropped_total",
    }  # fmt: skip
    placed = {s for p in PANELS for s in p.series}
    assert wanted <= placed


def test_layout_names_what_is_missing_and_hides_the_llds_term_copy() -> None:
    hkeys = {
        K.LLD_CORRECT_LOGP_TOKEN,
        K.LLD_FELL_FRACTION_RESPONSES,
        K.ROLLOUT_TURNS_MEAN,
        K.LOSS_LLDS,
        K.LLD_LLDS_TERM,
        K.TIME_UNIX,
        K.PERF_STEP_S,
    }
    mkeys = {"rate:llds_rollout_stale_groups_dropped_total", "llds_rollout_stale_groups_dropped_total"}
    panels = {p["id"]: p for p in layout(mkeys, hkeys)}
    assert panels["lld_logp"]["series"] == [K.LLD_CORRECT_LOGP_TOKEN]
    assert panels["lld_displaced"]["series"] == [K.LLD_FELL_FRACTION_RESPONSES]
    assert panels["lld_displaced"]["missing"] == [K.LLD_FELL_FRACTION_ACTIONS, K.LLDS_GATED_FRACTION]
    assert panels["turns"]["series"] == [K.ROLLOUT_TURNS_MEAN]
    assert panels["loss_llds"]["series"] == [K.LOSS_LLDS]
    assert panels["staleness"]["series"] == ["rate:llds_rollout_stale_groups_dropped_total"]
    # lld/llds_term repeats loss/llds: no "lld/*" panel draws it a second time.
    assert "h:time" not in panels and "h:lld" not in panels and panels["h:perf"]["series"] == [K.PERF_STEP_S]
    assert not any(p["id"].startswith("m:") for p in panels.values())


def test_store_history_dedupes_by_step_and_pages_by_count() -> None:
    store = Store({"trainer": "http://x"}, max_samples=10, max_history=3)
    assert store.history_since() == 0
    assert store.add_history([{"step": 1, "reward/mean": 0.1}, {"step": 2, "reward/mean": math.nan}]) == 2
    assert store.add_history([{"step": 2}, {"step": 3, "reward/mean": 0.3}]) == 1  # step 2 repeated: skipped
    assert store.history_since() == 3
    st = store.state(0, 0)
    assert [h["step"] for h in st["history"]] == [1, 2, 3]
    assert st["history"][1]["reward/mean"] is None
    store.add_history([{"step": 4}])  # the ring holds 3: step 1 falls out
    assert [h["step"] for h in store.state(0, 0)["history"]] == [2, 3, 4]
    assert [h["step"] for h in store.state(0, 3)["history"]] == [4]
    assert store.state(0, 4)["history"] == []
    assert store.add_history([{"reward/mean": 1.0}, "junk"]) == 1  # no step key: numbered by arrival
    assert store.state(0, 4)["history"] == [{"reward/mean": 1.0, "step": 4}]


def test_store_samples_events_and_boot_id() -> None:
    store = Store({}, max_samples=3)
    for i, v in enumerate([1.0, 1.0, 2.0, 2.0]):
        store.add_sample(100.0 + i, {"llds_rollout_weights_version": v, "x": math.inf})
    st = store.state(0, 0)
    assert [s["seq"] for s in st["samples"]] == [2, 3, 4]
    assert st["samples"][0]["values"]["x"] is None
    assert [s["seq"] for s in store.state(3, 0)["samples"]] == [4]
    assert store.state(3, 0, boot_id="other")["samples"][0]["seq"] == 2  # restarted dashboard: resend all
    assert st["events"] == [
        {"t": 102.0, "kind": "weights", "key": "llds_rollout_weights_version", "from": 1.0, "to": 2.0}
    ]
