"""The dashboard app: routes, its own metrics, polling fake services through an httpx mock transport."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from llds.dashboard.app import STATIC_DIR, create_app
from llds.dashboard.cli import parse_args
from llds.dashboard.config import DashboardConfig

DOCUMENTED_DASHBOARD_METRICS = {
    "llds_dashboard_polls",
    "llds_dashboard_poll_duration_seconds",
    "llds_dashboard_service_up",
    "llds_dashboard_buffered_samples",
    "llds_dashboard_history_records",
    "llds_dashboard_api_requests",
}


class FakeServices:
    """Answers like the three services; trainer steps and counters advance with ``advance()``."""

    def __init__(self) -> None:
        self.step = 0
        self.tokens = 0.0
        self.retriever_up = True
        self.history_requests: list[str] = []

    def advance(self) -> None:
        self.step += 1
        self.tokens += 100.0

    def handler(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        if host == "retriever.test" and not self.retriever_up:
            raise httpx.ConnectError("refused", request=request)
        if path == "/health":
            status = "starting" if host == "rollout.test" and self.step == 0 else "ok"
            return httpx.Response(
                200 if status == "ok" else 503,
                json={"status": status, "service": host, "detail": {"step": self.step}},
            )
        if path == "/metrics":
            text = (
                "# TYPE llds_rollout_generated_tokens_total counter\n"
                f"llds_rollout_generated_tokens_total {self.tokens}\n"
                "# TYPE llds_trainer_stream_length_entries gauge\n"
                f"llds_trainer_stream_length_entries {self.step % 3}\n"
                "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.0\n"
            )
            return httpx.Response(200, text=text, headers={"content-type": "text/plain; version=0.0.4"})
        if path == "/history":
            since = int(request.url.params.get("since", "0"))
            self.history_requests.append(request.url.params.get("since", ""))
            recs = [{"step": s, "reward/mean": s / 10, "lld/alarm": 0, "lld/correct_logp_slope": math.nan}
                    for s in range(1, self.step + 1) if s > since]  # fmt: skip
            return httpx.Response(
                200, content=json.dumps(recs).encode(), headers={"content-type": "application/json"}
            )
        if path == "/status":
            return httpx.Response(200, json={"step": self.step})
        return httpx.Response(404)


@pytest.fixture()
def fakes() -> FakeServices:
    return FakeServices()


@pytest.fixture()
def client(fakes: FakeServices) -> Any:
    cfg = DashboardConfig(retriever_url="http://retriever.test", rollout_url="http://rollout.test/",
                          trainer_url="http://trainer.test")  # fmt: skip
    app = create_app(cfg, transport=httpx.MockTransport(fakes.handler), poll=False)
    with TestClient(app) as c:
        c.poll = lambda: c.portal.call(app.state.poller.poll_once)  # type: ignore[attr-defined]
        yield c


def test_page_and_static_files_are_served(client: Any) -> None:
    r = client.get("/")
    assert (
        r.status_code == 200
        and "static/dashboard.js" in r.text
        and "static/vendor/uPlot.iife.min.js" in r.text
    )
    for path in ("/static/dashboard.js", "/static/dashboard.css", "/static/vendor/uPlot.iife.min.js",
                 "/static/vendor/uPlot.min.css"):  # fmt: skip
        assert client.get(path).status_code == 200, path
    assert "cdn" not in r.text.lower() and "https://" not in r.text


def test_vendored_chart_library_is_the_pinned_one() -> None:
    meta = json.loads((STATIC_DIR / "vendor" / "uplot.json").read_text())
    assert meta["version"] == "1.6.32"
    for name, digest in meta["sha256"].items():
        assert hashlib.sha256((STATIC_DIR / "vendor" / name).read_bytes()).hexdigest() == digest, name
    assert (STATIC_DIR / "vendor" / meta["license_file"]).read_text().startswith("The MIT License")
    assert "(v1.6.32)" in (STATIC_DIR / "vendor" / "uPlot.iife.min.js").read_text()[:100]


def test_health_and_own_metrics(client: Any) -> None:
    client.poll()
    body = client.get("/health").json()
    assert body["status"] == "ok" and body["service"] == "dashboard"
    assert body["detail"]["services"] == {"retriever": "ok", "rollout": "starting", "trainer": "ok"}
    client.get("/api/state")
    text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert DOCUMENTED_DASHBOARD_METRICS <= set(families)
    for name in families:
        assert name.startswith("llds_dashboard_") and ":" not in name
    assert families["llds_dashboard_polls"].type == "counter"
    polls = {(s.labels["service"], s.labels["outcome"]): s.value for s in families["llds_dashboard_polls"].samples
             if s.name.endswith("_total")}  # fmt: skip
    assert polls[("trainer", "ok")] == 1.0


def test_state_grows_with_each_poll_and_pages_incrementally(client: Any, fakes: FakeServices) -> None:
    client.poll()
    fakes.advance()
    fakes.advance()
    client.poll()
    st = client.get("/api/state").json()
    assert st["seq"] == 2 and len(st["samples"]) == 2
    assert st["step"] == 2 and [h["step"] for h in st["history"]] == [1, 2]
    assert st["history"][0]["lld/correct_logp_slope"] is None  # NaN made JSON-safe
    assert st["alarm"] == 0
    last = st["samples"][-1]["values"]
    assert last["llds_trainer_stream_length_entries"] == 2.0
    assert last["rate:llds_rollout_generated_tokens_total"] > 0
    assert not any(k.startswith("process_") for k in last)
    assert st["services"]["trainer"]["extra"] == {"step": 2}
    assert st["services"]["rollout"]["status"] == "ok"
    panels = {p["id"]: p for p in st["layout"]}
    assert panels["reward"]["series"] == ["reward/mean"]
    assert panels["tokens"]["series"] == ["rate:llds_rollout_generated_tokens_total"]

    fakes.advance()
    client.poll()
    inc = client.get("/api/state", params={"since": 2, "history_since": 2, "boot_id": st["boot_id"]}).json()
    assert [s["seq"] for s in inc["samples"]] == [3]
    assert [h["step"] for h in inc["history"]] == [3]
    assert fakes.history_requests == ["0", "0", "2"]


def test_unreachable_service_is_reported_down_and_others_keep_going(client: Any, fakes: FakeServices) -> None:
    fakes.retriever_up = False
    fakes.advance()
    client.poll()
    st = client.get("/api/state").json()
    assert st["services"]["retriever"]["status"] == "down"
    assert "ConnectError" in st["services"]["retriever"]["error"]
    assert st["services"]["trainer"]["status"] == "ok" and st["step"] == 1
    polls = client.get("/metrics").text
    assert 'llds_dashboard_polls_total{outcome="error",service="retriever"} 1.0' in polls
    assert 'llds_dashboard_service_up{service="retriever"} 0.0' in polls


def test_cli_flags_override_env_and_toml(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = tmp_path / "d.toml"
    toml.write_text('port = 9100\npoll_interval_s = 2.0\ntrainer_url = "http://a:1"\n')
    monkeypatch.setenv("LLDS_DASHBOARD_POLL_INTERVAL_S", "1.5")
    cfg = parse_args(["--config", str(toml), "--trainer-url", "http://b:2/", "--host", "0.0.0.0"])
    assert (cfg.port, cfg.poll_interval_s, cfg.host) == (9100, 1.5, "0.0.0.0")
    assert cfg.service_urls() == {"trainer": "http://b:2"}
    with pytest.raises(SystemExit):
        parse_args(["--poll-interval", "0"])


def test_train_log_is_merged_with_history_by_step(fakes: FakeServices, tmp_path: Any) -> None:
    log = tmp_path / "train_log.jsonl"
    cfg = DashboardConfig(trainer_url="http://trainer.test", train_log=log)
    app = create_app(cfg, transport=httpx.MockTransport(fakes.handler), poll=False)
    with TestClient(app) as c:
        fakes.advance()
        log.write_text(json.dumps({"step": 1, "reward/mean": 0.1}) + "\n")
        c.portal.call(app.state.poller.poll_once)
        # Steps 2 and 3 reach only the log (as when the trainer exits right after its last step).
        log.write_text(
            log.read_text() + "".join(json.dumps({"step": s, "reward/mean": s / 10}) + "\n" for s in (2, 3))
        )
        c.portal.call(app.state.poller.poll_once)
        st = c.get("/api/state").json()
    assert [h["step"] for h in st["history"]] == [1, 2, 3]
