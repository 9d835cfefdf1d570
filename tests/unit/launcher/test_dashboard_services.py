"""The dashboard's named panels find what the real services export (their metrics classes, no servers).

If a service renames a metric or a step-record key, this fails and names the panel and series left
empty: align ``llds.dashboard.panels.PANELS`` or the service (step-record keys: ``llds_proto.steplog``).
"""

from __future__ import annotations

from llds.dashboard.panels import layout
from llds.dashboard.scrape import parse_metrics
from llds.dashboard.store import Store
from llds_proto import steplog


def _scrapes() -> Store:
    from prometheus_client import generate_latest

    from llds_retriever.metrics import RetrieverMetrics
    from llds_rollout.metrics import RolloutMetrics
    from llds_trainer.metrics import TrainerMetrics

    ret, rol, tra = RetrieverMetrics(), RolloutMetrics(), TrainerMetrics()
    store = Store({})
    for t in (0.0, 1.0):
        ret.requests.labels(status="200").inc(3)
        ret.queries.inc(5)
        ret.latency.observe(0.004)
        rol.generated_tokens.labels(kind="train").inc(100)
        rol.trajectories.labels(status="ok").inc(2)
        rol.stale_drops.inc()
        rol.swap_seconds.observe(0.2)
        rol.retriever_latency.observe(0.01)
        rol.weights_version.set(t)
        rec = {k: 0.5 for k in steplog.KEYS} | {
            "step": int(t) + 1,
            "data/groups": 1,
            "data/trajectories": 4,
            "perf/step_s": 1.0,
        }
        tra.observe_step(rec)
        tra.dropped.labels(reason="stale").inc()
        values: dict[str, float | None] = {}
        for name, reg in (("retriever", ret.registry), ("rollout", rol.registry), ("trainer", tra.registry)):
            values.update(store.add_scrape(name, t, parse_metrics(generate_latest(reg).decode())))
        store.add_sample(t, values)
        store.add_history([rec])
    return store


def test_every_named_panel_has_data_from_the_real_services() -> None:
    store = _scrapes()
    panels = layout(store.metric_keys, store.history_keys)
    empty = [p["id"] for p in panels if p["known"] and not p["series"]]
    assert empty == [], f"named panels with no series from the services: {empty}"
    missing = {p["id"]: p["missing"] for p in panels if p["known"] and p["missing"]}
    assert missing == {}, f"named series no service exports: {missing}"
    by_id = {p["id"]: p for p in panels}
    assert "rate:llds_rollout_generated_tokens_total" in by_id["tokens"]["series"]
    assert "p95:llds_retriever_request_latency_seconds" in by_id["retrieval_latency"]["series"]
    assert "lld/alarm" in by_id["lld_alarm"]["series"]
