"""The dashboard page in headless Chromium against small real HTTP services whose values move.

Starts three fake services (uvicorn on loopback, prometheus_client metrics, a growing /history),
``llds dashboard serve`` as a real subprocess, and Chromium through Selenium; reads the latest value of
each chart from the page (legend ``data-value``) and checks they change as "training" proceeds and
match what the services published. Writes a screenshot into ``$LLDS_ARTIFACTS_DIR`` (or the test's
tmp dir). Skipped only when Chromium or chromedriver is missing (``scripts/install-browser.sh``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_testkit import FakeSystem, artifacts_dir, chrome, dashboard, wait_page

pytestmark = pytest.mark.integration


@pytest.fixture()
def browser() -> Iterator[Any]:
    with chrome() as driver:
        yield driver


@pytest.fixture()
def system() -> Iterator[tuple[FakeSystem, str]]:
    fakes = FakeSystem(tick_s=0.1, ticks_per_step=5).start()
    try:
        with dashboard(fakes.urls, poll_interval=0.3) as url:
            yield fakes, url
    finally:
        fakes.stop()


def test_dashboard_page_shows_live_changing_values(
    browser: Any, system: tuple[FakeSystem, str], tmp_path: Path
) -> None:
    fakes, url = system
    browser.get(url + "/")
    first = wait_page(browser, lambda p: p["panels"].get("reward", {}).get("points", 0) >= 2
                     and p["panels"].get("tokens", {}).get("values", {}).get("rate:llds_rollout_generated_tokens_total") is not None)  # fmt: skip
    later = wait_page(browser, lambda p: p["panels"]["reward"]["points"] >= first["panels"]["reward"]["points"] + 3
                     and p["panels"]["tokens"]["lastX"] > first["panels"]["tokens"]["lastX"])  # fmt: skip

    # Step charts: the latest reward is the one the trainer logged for the latest step shown.
    for page in (first, later):
        reward = page["panels"]["reward"]
        step = reward["lastX"]
        assert reward["values"]["reward/mean"] == pytest.approx(fakes.record(int(step))["reward/mean"])
        assert page["panels"]["lld_slope"]["values"]["lld/correct_logp_slope"] == pytest.approx(-0.02)
    assert (
        later["panels"]["reward"]["values"]["reward/mean"]
        > first["panels"]["reward"]["values"]["reward/mean"]
    )
    assert (
        later["panels"]["lld_logp"]["values"]["lld/correct_logp_token"]
        < first["panels"]["lld_logp"]["values"]["lld/correct_logp_token"]
    )
    assert int(later["step"]) > int(first["step"])
    w1 = first["panels"]["weights"]["values"]["llds_rollout_weights_version"]
    w2 = later["panels"]["weights"]["values"]["llds_rollout_weights_version"]
    assert w2 > w1

    # Time charts: rates computed from counters, latency from the histogram.
    sys_vals = {k: v for p in later["panels"].values() for k, v in p["values"].items()}
    assert sys_vals["rate:llds_rollout_generated_tokens_total"] > 0
    assert sys_vals["rate:llds_rollout_trajectories_total"] > 0
    assert sys_vals["rate:llds_retriever_requests_total"] > 0
    assert 0.001 < sys_vals["mean:llds_retriever_request_latency_seconds"] < 0.01
    assert (
        sys_vals["llds_trainer_stream_length_entries"] is not None
        and sys_vals["llds_trainer_consumer_lag_entries"] is not None
    )
    # Unknown names still get panels of their own.
    assert (
        later["panels"]["m:llds_retriever_index_documents"]["values"]["llds_retriever_index_documents"]
        == 1234
    )
    assert later["panels"]["h:timing"]["values"]["timing/step_seconds"] == 0.5

    assert later["services"] == {"retriever": "ok", "rollout": "ok", "trainer": "ok"}
    assert later["polls"] > first["polls"]
    for pid in ("reward", "lld_alarm", "lld_slope", "lld_displaced", "entropy", "grad_norm", "turns", "queue",
                "tokens", "trajectories", "retrieval_qps", "retrieval_latency", "weights", "staleness"):  # fmt: skip
        assert later["panels"][pid]["hasCanvas"], pid
        assert later["missing"][pid] == "", (pid, later["missing"][pid])

    # Let the alarm reach level 2 (the fake escalates every 4 steps) and see the badge say so.
    alarmed = wait_page(browser, lambda p: p["alarm"] == "2")
    assert "ALARM" in alarmed["alarmText"]

    shot = artifacts_dir(tmp_path) / "dashboard_fake_services.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
