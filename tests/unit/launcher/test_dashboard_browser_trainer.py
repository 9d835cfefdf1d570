"""The dashboard page in headless Chromium against the real trainer, then ``llds report`` on its log.

Real Redis, the real trainer (``python -m llds_trainer``, tiny random model) as a subprocess,
``llds dashboard serve`` as a subprocess polling it (and tailing its ``train_log.jsonl``). Synthetic trajectory groups are pushed one step's
worth at a time; after each step the page must show one more point in the per-step charts, with the
values the trainer logged. Then ``llds report`` turns the run's ``train_log.jsonl`` into plots.
Screenshot in ``$LLDS_ARTIFACTS_DIR`` (or the test's tmp dir).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_testkit import artifacts_dir, chrome, dashboard, wait_page

from llds_server.http import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 3
GROUPS_PER_STEP = 2


@pytest.fixture()
def browser() -> Iterator[Any]:
    with chrome() as driver:
        yield driver


def _push(redis_url: str, groups: list[Any]) -> None:
    import redis

    from llds_proto import streams
    from llds_proto.codec import encode_group

    r = redis.Redis.from_url(redis_url)
    for g in groups:
        r.xadd(streams.DEFAULT_KEYS.stream, {streams.GROUP_FIELD: encode_group(g)})


def test_dashboard_follows_a_real_trainer_and_report_plots_its_log(
    browser: Any, tiny_model_dir: Path, redis_url: str, tokenizer: Any, tmp_path: Path
) -> None:
    from llds import report
    from llds_trainer.synthetic import synthetic_groups

    def groups_for(step: int) -> list[Any]:
        # Sampled by the policy of the previous step, so none is over the staleness bound.
        return synthetic_groups(tokenizer, GROUPS_PER_STEP, 3, seed=step, version=step - 1,
                                start_index=(step - 1) * GROUPS_PER_STEP, think_words=3, doc_words=8)  # fmt: skip

    port = free_port()
    cmd = [sys.executable, "-m", "llds_trainer", "--model", str(tiny_model_dir), "--redis-url", redis_url,
           "--run-dir", str(tmp_path / "run"), "--weights-root", str(tmp_path / "weights"),
           "--steps", str(STEPS), "--port", str(port), "--set", f"groups_per_step={GROUPS_PER_STEP}",
           "--set", "micro_batch_size=3", "--set", "optimizer.lr=1e-3", "--set", "read_block_ms=200",
           "--set", "num_threads=1"]  # fmt: skip
    log = (tmp_path / "trainer.log").open("ab")
    trainer = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "LLDS_ADMIN_TOKEN": "t"}
    )
    try:
        train_log = tmp_path / "run" / "train_log.jsonl"
        # --train-log: the trainer exits right after its last step, possibly before the next poll.
        with dashboard({"trainer": f"http://127.0.0.1:{port}"}, 0.5, ("--train-log", str(train_log))) as url:
            browser.get(url + "/")
            wait_page(browser, lambda p: p["services"].get("trainer") == "ok", timeout=180)
            readings = []
            for step in range(1, STEPS + 1):
                _push(redis_url, groups_for(step))
                try:
                    page = wait_page(
                        browser, lambda p, s=step: p["panels"]["reward"]["lastX"] == s, timeout=240
                    )
                except AssertionError as e:
                    raise AssertionError(
                        f"{e}\ntrainer log:\n{(tmp_path / 'trainer.log').read_text()[-3000:]}"
                    ) from e
                readings.append(page)
            # Open the folded trainer-gauges section too, so the screenshot shows every kind of panel.
            browser.execute_script("document.querySelectorAll('details').forEach((d) => (d.open = true))")
            time.sleep(1.0)
            artifacts = artifacts_dir(tmp_path)
            browser.save_screenshot(str(artifacts / "dashboard_real_trainer.png"))
    finally:
        trainer.terminate()
        trainer.wait(timeout=60)

    records = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    # One more point per step, and the page shows exactly what the trainer logged for that step.
    assert [p["panels"]["reward"]["points"] for p in readings] == [1, 2, 3]
    for page, rec in zip(readings, records, strict=True):
        assert page["step"] == str(rec["step"])
        assert page["panels"]["reward"]["values"]["reward/mean"] == pytest.approx(rec["reward/mean"])
        assert page["panels"]["loss_llds"]["values"]["loss/llds"] == pytest.approx(rec["loss/llds"])
        assert page["panels"]["lld_logp"]["values"]["lld/correct_logp_token"] == pytest.approx(
            rec["lld/correct_logp_token"]
        )
        assert page["panels"]["weights_step"]["values"]["weights/version"] == rec["weights/version"]
        assert page["alarm"] == str(int(rec["lld/alarm"]))
    # The live trainer-step chart (from /metrics) moved with training.
    step_chart = readings[-1]["panels"]["trainer_step"]
    assert step_chart["firsts"]["llds_trainer_step"] == 0
    assert (
        step_chart["values"]["llds_trainer_step"] >= STEPS - 1
    )  # the trainer may exit before the last scrape

    written = report.build(tmp_path / "run")
    assert {"reward", "lld", "training", "summary"} <= set(written)
    assert "step records: 3 (steps 1-3)" in written["summary"].read_text()
