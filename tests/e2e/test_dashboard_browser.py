"""The dashboard of a real ``llds up`` run in headless Chromium: charts show live values that change.

Starts ``python -m llds.cli up --preset tiny --steps 3`` (every port 0 = free) as a subprocess, reads
the dashboard URL from its banner (``dashboard  http://127.0.0.1:PORT/``), opens it in Chromium via
Selenium, and reads the latest value of each chart from the page while training proceeds. Writes a
screenshot into ``$LLDS_ARTIFACTS_DIR`` (or the test's tmp dir). Skipped only when Chromium or
chromedriver is missing (``scripts/install-browser.sh`` installs them).
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEPS = 3
BANNER = re.compile(r"^dashboard\s+(http://\S+/)\s*$")
READ_PAGE = """
const out = {panels: {}, services: {}};
for (const el of document.querySelectorAll('[data-panel-id]')) {
  const vals = {};
  const firsts = {};
  for (const v of el.querySelectorAll('.val')) {
    vals[v.dataset.key] = v.dataset.value === undefined || v.dataset.value === '' ? null : Number(v.dataset.value);
    firsts[v.dataset.key] = v.dataset.first === undefined || v.dataset.first === '' ? null : Number(v.dataset.first);
  }
  out.panels[el.dataset.panelId] = {points: Number(el.dataset.points || 0), lastX: el.dataset.lastX ? Number(el.dataset.lastX) : null, values: vals, firsts: firsts};
}
for (const el of document.querySelectorAll('[data-service]')) out.services[el.dataset.service] = el.dataset.status;
out.step = document.getElementById('step').dataset.step;
out.polls = Number(document.getElementById('updated').dataset.polls);
return out;
"""


def find_browser() -> tuple[str, str] | None:
    """(chromium binary, chromedriver) from $LLDS_CHROMIUM / $LLDS_CHROMEDRIVER or PATH."""
    binary = os.environ.get("LLDS_CHROMIUM") or next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
    )
    driver = os.environ.get("LLDS_CHROMEDRIVER") or shutil.which("chromedriver")
    return (binary, driver) if binary and driver else None


@pytest.fixture()
def browser() -> Iterator[Any]:
    found = find_browser()
    if found is None:
        pytest.skip(
            "chromium and chromedriver not found: run scripts/install-browser.sh (apt-get install chromium chromium-driver)"
        )
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
    driver = webdriver.Chrome(service=Service(found[1]), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


class UpProcess:
    """``llds up`` in its own process group; its output is collected line by line."""

    def __init__(self, run_dir: Path):
        cmd = [sys.executable, "-m", "llds.cli", "up", "--preset", "tiny", "--steps", str(STEPS),
               "--run-dir", str(run_dir), "--retriever-port", "0", "--rollout-port", "0", "--trainer-port", "0",
               "--dashboard-port", "0", "--redis-port", "0"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
        self.lines: list[str] = []
        self.queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self.queue.put(line.rstrip("\n"))

    def wait_for_dashboard_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.queue.get(timeout=1.0)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            m = BANNER.match(line.strip())
            if m:
                return m.group(1)
        pytest.fail(
            f"`llds up` printed no dashboard URL (exit {self.proc.poll()}); output:\n"
            + "\n".join(self.lines[-80:])
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # `llds up` stops all its children on SIGTERM
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def wait_for(driver: Any, cond: Any, timeout: float, up: UpProcess) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    page: dict[str, Any] = {}
    while time.monotonic() < deadline:
        page = driver.execute_script(READ_PAGE)
        if cond(page):
            return page
        if up.proc.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"page never satisfied the condition; last reading: {page}\n`llds up` output:\n"
                         + "\n".join(up.lines[-60:]))  # fmt: skip


def test_llds_up_dashboard_shows_training_live(browser: Any, tmp_path: Path) -> None:
    artifacts = Path(os.environ.get("LLDS_ARTIFACTS_DIR") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    up = UpProcess(tmp_path / "run")
    try:
        url = up.wait_for_dashboard_url(timeout=900)
        browser.get(url)
        first = wait_for(
            browser, lambda p: p["polls"] >= 1 and p["services"].get("trainer") is not None, 60, up
        )

        # The trainer exits after its last step; unless `llds up` hands the dashboard its train log
        # (`--train-log`), the page may keep the step before the last.
        def trained(p: dict[str, Any]) -> bool:
            reward = p["panels"].get("reward", {})
            seen = min(reward.get("points", 0), reward.get("lastX") or 0)
            return seen >= STEPS or (seen >= STEPS - 1 and p["services"].get("trainer") == "down")

        done = wait_for(browser, trained, 900, up)
        time.sleep(3)  # a few more polls, so the time charts have moved on too
        last = wait_for(browser, lambda p: p["polls"] > done["polls"], 60, up)
        browser.save_screenshot(str(artifacts / "dashboard_llds_up.png"))

        assert last["services"]["retriever"] == "ok" and last["services"]["rollout"] == "ok", last["services"]
        assert last["services"]["trainer"] in ("ok", "down"), last["services"]
        reward = last["panels"]["reward"]
        assert reward["values"]["reward/mean"] is not None and 0.0 <= reward["values"]["reward/mean"] <= 1.0
        assert int(last["step"]) >= STEPS - 1
        # Values change as training proceeds: the step the page showed grew while we watched, or (when
        # training outran the page load) the trainer-step time chart, sampled since the dashboard
        # started, went from an earlier step to the last one; and the time charts kept advancing.
        step_chart = last["panels"]["trainer_step"]
        grew_in_chart = any(
            f is not None and v is not None and v > f
            for k, f in step_chart["firsts"].items() for v in [step_chart["values"][k]]
        )  # fmt: skip
        assert int(first["step"] or 0) < int(last["step"]) or grew_in_chart, (first, step_chart)
        metric_panels = [p for p in last["panels"].values() if p["lastX"] and p["lastX"] > 1e9]
        assert metric_panels, "no time-series panel has data"
        first_x = max((p["lastX"] or 0) for p in first["panels"].values())
        assert max(p["lastX"] for p in metric_panels) > first_x
        present = {k for p in last["panels"].values() for k, v in p["values"].items() if v is not None}
        assert any(k.startswith("lld/") for k in present), present
        assert any(k.startswith("llds_trainer_") or k.startswith("rate:llds_rollout_") for k in present), (
            present
        )
    finally:
        up.stop()
    assert up.proc.returncode is not None
