"""``llds up`` when its processes die, on a real tiny run (vLLM): the run goes on from where it was,
and nothing of it outlives its launcher. One run, three deaths (one ``llds up`` start fewer than a test
each: the suite's time):

1. ``kill -9`` of ``llds up`` and, in the same instant, of its trainer at step 1: every other process
   it started (retriever, rollout with its vLLM engine processes, the Redis server) is gone shortly
   after without anyone killing them by hand (each child's lifeline, Redis by its parent-death
   signal), and the trainer's work since its last checkpoint is lost the way a crash loses it.
2. ``llds up --resume --restart-on-failure --max-restarts 1 --stall-timeout-s 30``: the same run id and
   Redis data (the append-only file in RUN_DIR/redis), the trainer from its checkpoint, the rollout on
   the newest published weights. The rollout is frozen with SIGSTOP (alive, silent); the watchdog names
   it, with its log, kills and restarts it, and the run reaches its total steps, each step trained
   once. The restarted rollout answers on the trained weights.
3. A ``kill -9`` of the rollout while it serves, past the restarts allowed, is the run's end: llds up
   exits non-zero naming it, and leaves nothing running.

Through all three, an observer outside the run (``llds bench resume-audit``'s) reads the trajectory
stream and the data order's drop record from llds up's own Redis as they grow; at the end the audit
reads those, Redis's keys (the server started again on the run's append-only file) and the final
checkpoint: every position of the run's data order below its cursor reached the stream once, was
dropped with a reason or is still claimed; every trained group once; AdamW's step count equal to the
updates logged.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
from up_kit import FREE_PORTS, LLDS_UP_MARKS, LldsProcess, alive, train_log, wait_gone, wait_step

from llds.redis_server import RedisServer
from llds.resume_audit import Observer, audit
from llds.up import latest_weights

pytestmark = LLDS_UP_MARKS

TOTAL = 8
STALL_S = 30
REDIS_LINE = r"^redis\s+redis://:\*\*\*@([\d.]+):(\d+)/0 "


def test_a_run_survives_its_launchers_death_a_frozen_rollout_and_ends_at_the_restarts_allowed(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run-r"
    # Redis is the one llds up starts: its append-only file in the run dir is what resumes
    first = LldsProcess(["up", "--preset", "tiny", "--steps", str(TOTAL), "--run-dir", str(run_dir),
                         "--no-dashboard", *FREE_PORTS], drop_env=("REDIS_URL",))  # fmt: skip
    redis_at: list[str] = []

    def follow(proc: LldsProcess) -> None:  # the observer's URL: llds up's Redis, wherever it now is
        host, port = proc.wait_line(REDIS_LINE, timeout_s=120).groups()
        password = (run_dir / "redis" / "password").read_text().strip()
        redis_at[:] = [f"redis://:{password}@{host}:{port}/0"]

    observer = None
    try:
        follow(first)  # before any child starts: the trainer cannot have trimmed an entry yet
        observer = Observer(
            lambda: redis_at[0], (run_dir / "run_id").read_text().strip(), tmp_path / "observed.jsonl"
        )
        observer.start()
        wait_step(run_dir, 1, first, timeout_s=400)
        # checkpoint and publish are independent: wait for a published version too, the one the
        # resumed rollout must start on
        deadline = time.monotonic() + 60
        while latest_weights(run_dir / "weights") is None and time.monotonic() < deadline:
            time.sleep(0.1)
        published = latest_weights(run_dir / "weights")
        procs = first.descendants()
        assert any("redis" in " ".join(p.cmdline()) or "valkey" in " ".join(p.cmdline()) for p in procs)
        trainer = first.child_pid("trainer run")
        os.kill(first.proc.pid, signal.SIGKILL)  # the launcher ...
        os.kill(trainer, signal.SIGKILL)  # ... and the trainer, as a crash of the host would
        first.proc.wait(30)
        left = wait_gone(procs, timeout_s=40)
        assert left == [], f"outlived their launcher: {[(p.pid, p.cmdline()) for p in alive(left)]}"
    finally:
        first.stop()
    run_id = (run_dir / "run_id").read_text().strip()
    done_before = max(int(str(h["step"])) for h in train_log(run_dir))
    assert done_before < TOTAL, "the first run finished before the kill: nothing left to resume"

    again = LldsProcess(["up", "--resume", str(run_dir), "--restart-on-failure", "--max-restarts", "1",
                         "--stall-timeout-s", str(STALL_S)], drop_env=("REDIS_URL",))  # fmt: skip
    children = []
    try:
        follow(again)
        again.wait_line(rf"run id\s+{re.escape(run_id)} \(resumed at step \d+\)", timeout_s=120)
        m = again.wait_line(r"rollout\s+starts on published weights v(\d+)", timeout_s=120)
        assert published is not None and int(m.group(1)) >= published[0]
        rollout_url = again.wait_line(r"rollout\s+(http://\S+)/answer", timeout_s=400).group(1)
        children = again.descendants()
        rollout = again.child_pid("rollout serve")
        os.kill(rollout, signal.SIGSTOP)  # alive, and silent
        m = again.wait_line(r"rollout stalled \(pid (\d+)\): (.*); log (\S+)", timeout_s=STALL_S + 120)
        assert int(m.group(1)) == rollout and m.group(3).endswith("logs/rollout.log"), m.group(0)
        assert re.search(
            r"/health has not answered 200|no group reached the stream and no episode finished", m.group(2)
        ), m.group(0)
        again.wait_line(r"rollout\s+restarted, healthy after", timeout_s=300)
        children += again.descendants()
        again.wait_line("still serving /answer", timeout_s=600)
        steps = [int(str(h["step"])) for h in train_log(run_dir)]
        assert steps == list(range(1, TOTAL + 1)), steps  # each step once, none lost to the kills
        assert (run_dir / "run_id").read_text().strip() == run_id
        r = httpx.post(
            f"{rollout_url}/answer", json={"question": "Who founded the Kreixvelor Academy?"}, timeout=120
        )
        assert r.status_code == 200 and r.json()["weights_version"] >= TOTAL, r.text
        # the next death, past the restarts allowed, is the run's end
        children += again.descendants()
        os.kill(again.child_pid("rollout serve"), signal.SIGKILL)
        code = again.wait_exit(120)
    finally:
        again.stop()
        if observer is not None:
            observer.stop.set()
            observer.join(10)
    out = again.output(200)
    assert code == 1, out
    assert re.search(r"llds up failed: rollout died \(killed by SIGKILL\); log \S+/logs/rollout\.log", out), (
        out
    )
    assert "no restarts left: 1 of 1 used" in out
    assert not wait_gone(children), f"left running after llds up exited: {alive(children)}"

    # the data order, audited from outside the run: Redis again on the run's append-only file
    password = (run_dir / "redis" / "password").read_text().strip()
    redis = RedisServer(data_dir=run_dir / "redis", password=password).start()
    try:
        report = audit(tmp_path, run_dir, redis.url, TOTAL)
    finally:
        redis.stop()
    assert report["failures"] == [], report
    assert (
        report["cursor"] >= report["trained"] >= TOTAL
        and report["stream_entries_observed"] >= report["trained"]
    )
