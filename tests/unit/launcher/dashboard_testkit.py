"""Helpers for the dashboard's browser tests: headless Chromium, reading chart values off the page,
running ``llds dashboard serve``, and small real HTTP stand-ins for the three services.

The stand-ins are FastAPI apps served by uvicorn on free loopback ports (in threads), each with its
own prometheus_client registry; a ticker thread advances counters, gauges, histograms and the
trainer's step history, so whatever polls them sees values that change over time.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Query
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from llds_server.http import BackgroundServer, free_port

# Reads every panel's latest values (legend data-value), its oldest buffered ones (data-first), point
# count and last x; the health strip; the header.
READ_PAGE = """
const num = (s) => (s === undefined || s === '' ? null : Number(s));
const out = {panels: {}, services: {}, missing: {}};
for (const el of document.querySelectorAll('[data-panel-id]')) {
  const values = {}, firsts = {};
  for (const v of el.querySelectorAll('.val')) { values[v.dataset.key] = num(v.dataset.value); firsts[v.dataset.key] = num(v.dataset.first); }
  out.panels[el.dataset.panelId] = {points: Number(el.dataset.points || 0), lastX: num(el.dataset.lastX),
    values, firsts, hasCanvas: !!el.querySelector('canvas')};
  out.missing[el.dataset.panelId] = el.querySelector('.missing').textContent;
}
for (const el of document.querySelectorAll('[data-service]')) out.services[el.dataset.service] = el.dataset.status;
out.step = document.getElementById('step').dataset.step;
out.alarm = document.getElementById('alarm').dataset.alarm;
out.alarmText = document.getElementById('alarm').textContent;
out.polls = Number(document.getElementById('updated').dataset.polls);
return out;
"""
SKIP_REASON = "chromium and chromedriver not found: run scripts/install-browser.sh (apt-get install chromium chromium-driver)"


def find_browser() -> tuple[str, str] | None:
    """(chromium binary, chromedriver) from $LLDS_CHROMIUM / $LLDS_CHROMEDRIVER or PATH."""
    names = ("chromium", "chromium-browser", "google-chrome")
    binary = os.environ.get("LLDS_CHROMIUM") or next((p for p in map(shutil.which, names) if p), None)
    driver = os.environ.get("LLDS_CHROMEDRIVER") or shutil.which("chromedriver")
    return (binary, driver) if binary and driver else None


@contextmanager
def chrome() -> Iterator[Any]:
    """Headless Chromium driven by Selenium; skips the test when no browser is installed."""
    found = find_browser()
    if found is None:
        pytest.skip(SKIP_REASON)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = found[0]
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,2600",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(found[1]), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def artifacts_dir(tmp_path: Path) -> Path:
    """Where screenshots go: $LLDS_ARTIFACTS_DIR, else the test's tmp dir."""
    out = Path(os.environ.get("LLDS_ARTIFACTS_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def read_page(driver: Any) -> dict[str, Any]:
    return driver.execute_script(READ_PAGE)


def wait_page(driver: Any, cond: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> dict[str, Any]:
    """Read the page until ``cond(page)`` holds; returns that reading."""
    deadline = time.monotonic() + timeout
    page: dict[str, Any] = {}
    while time.monotonic() < deadline:
        page = read_page(driver)
        try:
            if cond(page):
                return page
        except (KeyError, TypeError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"page never satisfied the condition; last reading: {page}")


@contextmanager
def dashboard(urls: dict[str, str], poll_interval: float = 0.3, extra: tuple[str, ...] = ()) -> Iterator[str]:
    """``llds dashboard serve`` as a subprocess polling ``urls``; yields its base URL once healthy."""
    port = free_port()
    flags = [f for name, u in urls.items() for f in (f"--{name}-url", u)] + list(extra)
    cmd = [sys.executable, "-m", "llds.cli", "dashboard", "serve", "--port", str(port),
           "--poll-interval", str(poll_interval), *flags]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                out = proc.stdout.read() if proc.stdout else ""
                raise AssertionError(f"dashboard did not become healthy (exit {proc.poll()}):\n{out}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _app(name: str, registry: CollectorRegistry, health: dict[str, Any]) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    def _health() -> dict[str, Any]:
        return {"status": "ok", "service": name, "detail": dict(health)}

    @app.get("/metrics")
    def _metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


class FakeSystem:
    """Retriever, rollout and trainer fakes whose numbers move every ``tick_s`` seconds.

    A training step (history record, weights version bump on both sides) happens every
    ``ticks_per_step`` ticks.
    """

    def __init__(self, tick_s: float = 0.1, ticks_per_step: int = 5):
        self.tick_s = tick_s
        self.ticks_per_step = ticks_per_step
        self.lock = threading.Lock()
        self.history: list[dict[str, float]] = []
        self.ticks = 0
        self.version = 0
        self._stop = threading.Event()
        self._servers: list[BackgroundServer] = []
        self.urls: dict[str, str] = {}

        r = self.r_retriever = CollectorRegistry()
        self.requests = Counter("llds_retriever_requests", "requests", ["status"], registry=r)
        self.latency = Histogram("llds_retriever_request_latency_seconds", "latency", registry=r,
                                 buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1))  # fmt: skip
        self.docs = Gauge("llds_retriever_index_documents", "documents in the index", registry=r)
        self.docs.set(1234)
        r = self.r_rollout = CollectorRegistry()
        self.tokens = Counter("llds_rollout_generated_tokens", "tokens", registry=r)
        self.trajectories = Counter("llds_rollout_trajectories", "trajectories", registry=r)
        self.stale = Counter("llds_rollout_stale_groups_dropped", "dropped groups", registry=r)
        self.swaps = Histogram("llds_rollout_weight_swap_seconds", "swap time", registry=r)
        self.r_version = Gauge("llds_rollout_weights_version", "version", registry=r)
        r = self.r_trainer = CollectorRegistry()
        self.step_g = Gauge("llds_trainer_step", "step", registry=r)
        self.t_version = Gauge("llds_trainer_weights_version", "version", registry=r)
        self.queue = Gauge("llds_trainer_stream_length_entries", "queue depth", registry=r)
        self.lag = Gauge("llds_trainer_consumer_lag_entries", "consumer lag", registry=r)
        self.rollout_health: dict[str, Any] = {"weights_version": 0}

    # ------------------------------------------------------------------ apps
    def _trainer_app(self) -> FastAPI:
        app = _app("trainer", self.r_trainer, {})

        @app.get("/history")
        def history(since: int = Query(0)) -> list[dict[str, float]]:
            with self.lock:
                return [h for h in self.history if h["step"] > since]

        @app.get("/status")
        def status() -> dict[str, Any]:
            with self.lock:
                return {"step": len(self.history), "weights_version": self.version, "state": "training"}

        return app

    # ------------------------------------------------------------------ ticking
    def tick(self) -> None:
        with self.lock:
            self.ticks += 1
            k = self.ticks
            self.tokens.inc(40 + 10 * (k % 3))
            self.trajectories.inc(1)
            if k % 4 == 0:
                self.stale.inc()
            for i in range(3):
                self.requests.labels(status="200").inc()
                self.latency.observe(0.002 + 0.001 * ((k + i) % 5))
            self.queue.set(k % 7)
            self.lag.set((k * 3) % 11)
            if k % self.ticks_per_step == 0:
                step = len(self.history) + 1
                self.version += 1
                self.swaps.observe(0.05)
                self.r_version.set(self.version)
                self.t_version.set(self.version)
                self.step_g.set(step)
                self.rollout_health["weights_version"] = self.version
                self.history.append(self.record(step))

    def record(self, step: int) -> dict[str, float]:
        """A plausible step record: reward rises, correct log-likelihood drifts down."""
        return {
            "step": step, "reward/mean": 0.1 + 0.05 * step, "reward/exact_match": 0.08 + 0.04 * step,
            "loss/total": 1.0 / step, "loss/policy": 0.5 / step, "loss/llds": 0.01 * step, "loss/kl": 0.001,
            "lld/correct_logp_token": -1.0 - 0.02 * step, "lld/correct_logp_slope": -0.02,
            "lld/fell_fraction_responses": min(1.0, 0.1 * step), "lld/fell_fraction_actions": 0.05,
            "lld/first_action_logp": -2.0, "lld/later_action_logp": -1.5, "lld/correct_incorrect_gap": 0.3,
            "lld/alarm": float(min(2, step // 4)), "llds/gated_fraction": 0.2, "actor/entropy": 1.0 + math.sin(step),
            "actor/grad_norm": 2.0 + step % 3, "actor/clip_frac": 0.01, "rollout/response_len_mean": 100.0 + step,
            "rollout/turns_mean": 2.0, "rollout/valid_searches_mean": 1.0, "weights/version": float(step),
            "timing/step_seconds": 0.5,
        }  # fmt: skip

    def _run_ticker(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.tick()

    def start(self) -> FakeSystem:
        apps = {
            "retriever": _app("retriever", self.r_retriever, {"documents": 1234}),
            "rollout": _app("rollout", self.r_rollout, self.rollout_health),
            "trainer": self._trainer_app(),
        }
        for name, app in apps.items():
            server = BackgroundServer(app).start()
            self._servers.append(server)
            self.urls[name] = server.url
        threading.Thread(target=self._run_ticker, daemon=True, name="fake-ticker").start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for server in self._servers:
            server.stop(timeout_s=5)
