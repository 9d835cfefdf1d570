"""`llds up`'s console: a line per step from the step log and the rollout's counters, a child's errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from llds.console import STALE_DROPS, SWAP_SECONDS, ErrorEcho, RolloutCounters, StepReporter, step_line

REC = {"step": 3, "reward/mean": 0.625, "reward/exact_match": 0.5, "loss/llds": 1.25e-4, "lld/alarm": 1.0,
       "perf/step_s": 12.34}  # fmt: skip


def test_step_line_shows_the_signals_of_a_step() -> None:
    line = step_line(REC, 20, 0.412, 2.0)
    assert line.startswith("step  3/20 [##--------]  reward 0.625  EM 0.500  llds 0.00013  alarm warning")
    assert line.endswith("swap 0.41 s  stale 2  12.3 s/step")
    # a record without a signal (an older log) and no rollout reading: dashes, not a crash
    assert step_line({"step": 1}, 0, None, None) == (
        "step   1  reward -  EM -  llds -  alarm ok       swap -  stale -  - s/step"
    )


def test_rollout_counters_are_read_from_real_prometheus_text() -> None:
    reg = CollectorRegistry()
    swap = Histogram(SWAP_SECONDS, "swap", registry=reg)
    drops = Counter(STALE_DROPS.removesuffix("_total"), "drops", ["reason"], registry=reg)
    swap.observe(0.5)
    swap.observe(1.5)
    drops.labels(reason="too_old").inc(3)
    drops.labels(reason="lineage").inc(1)
    c = RolloutCounters.parse(generate_latest(reg).decode())
    assert (c.swaps, c.swap_seconds, c.stale_drops) == (2.0, 2.0, 4.0)


def test_step_reporter_prints_each_new_record_once_and_waits_for_a_whole_line(tmp_path: Path) -> None:
    log = tmp_path / "train_log.jsonl"
    out = io.StringIO()
    rep = StepReporter(log, total_steps=3, rollout_url=None, out=out)
    assert rep.poll() == 0  # no log yet
    log.write_text(json.dumps({**REC, "step": 1}) + "\n" + json.dumps({**REC, "step": 2})[:20])
    assert rep.poll() == 1
    with log.open("a") as f:  # the half-written record is completed
        f.write(json.dumps({**REC, "step": 2})[20:] + "\n")
    assert rep.poll() == 1
    assert rep.poll() == 0
    lines = out.getvalue().splitlines()
    assert [ln.split()[1] for ln in lines] == ["1/3", "2/3"]
    # a resumed run starts after what the log holds
    again = StepReporter(log, total_steps=3, out=io.StringIO())
    again.skip_existing()
    assert again.poll() == 0


def test_step_reporter_after_a_restarted_trainer_cut_its_log_prints_the_steps_trained_again(
    tmp_path: Path,
) -> None:
    log = tmp_path / "train_log.jsonl"
    out = io.StringIO()
    rep = StepReporter(log, total_steps=4, out=out)
    log.write_text("".join(json.dumps({**REC, "step": s}) + "\n" for s in (1, 2, 3)))
    assert rep.poll() == 3
    log.write_text(json.dumps({**REC, "step": 1}) + "\n")  # restarted from the step-1 checkpoint
    assert rep.poll() == 0  # step 1 was printed already
    with log.open("a") as f:
        f.write(json.dumps({**REC, "step": 2}) + "\n")
    assert rep.poll() == 1
    assert [ln.split()[1] for ln in out.getvalue().splitlines()] == ["1/4", "2/4", "3/4", "2/4"]


def test_errors_reach_the_console_with_the_log_path_once_and_tracebacks_whole(tmp_path: Path) -> None:
    echo = ErrorEcho(tmp_path / "trainer.log")
    lines = [
        "2026-12-01 INFO llds_trainer step 1 reward 0.5",
        'INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK',
        "2026-12-01 ERROR llds_trainer publish failed",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "    boom()",
        "RuntimeError: boom",
        "2026-12-01 INFO llds_trainer step 2 reward 0.5",
    ]
    shown = [echo(ln) for ln in lines]
    assert shown[0] is None and shown[1] is None and shown[-1] is None
    assert (
        shown[2] == f"2026-12-01 ERROR llds_trainer publish failed   (full log: {tmp_path / 'trainer.log'})"
    )
    assert shown[3:7] == lines[3:7]  # the traceback, header to exception, without the path again
