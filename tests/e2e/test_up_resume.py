"""``llds up --resume`` after ``kill -9`` of the whole process tree (llds up, every child's process
group, the Redis server it started): the run continues in the same run dir with the same run id and
Redis data (the append-only file in RUN_DIR/redis), the trainer from its checkpoint, the rollout on
the newest published weights, up to the requested total steps, each step trained once. Then, with
``--restart-on-failure --max-restarts 1``, a ``kill -9`` of the rollout while it serves /answer
restarts it (on the newest published weights), and a second one, past the restarts allowed, makes
llds up exit non-zero naming it.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
from up_kit import FREE_PORTS, LLDS_UP_MARKS, LldsProcess, alive, train_log, wait_gone, wait_step

from llds.up import latest_weights

pytestmark = LLDS_UP_MARKS

TOTAL = 6


def test_resume_after_kill_9_of_the_tree_reaches_the_total_steps(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-r"
    # Redis is the one llds up starts: its append-only file in the run dir is what resumes
    first = LldsProcess(["up", "--preset", "tiny", "--steps", str(TOTAL), "--run-dir", str(run_dir),
                         "--no-dashboard", *FREE_PORTS], drop_env=("REDIS_URL",))  # fmt: skip
    try:
        wait_step(run_dir, 1, first, timeout_s=400)
        # checkpoint and publish are independent: wait for a published version too, the one the
        # resumed rollout must start on
        deadline = time.monotonic() + 60
        while latest_weights(run_dir / "weights") is None and time.monotonic() < deadline:
            time.sleep(0.1)
        published = latest_weights(run_dir / "weights")
        procs = first.kill_tree()
    finally:
        first.stop()
    assert not wait_gone(procs), f"kill -9 left {alive(procs)}"
    run_id = (run_dir / "run_id").read_text().strip()
    done_before = max(int(str(h["step"])) for h in train_log(run_dir))
    assert done_before < TOTAL, "the first run finished before the kill: nothing left to resume"

    again = LldsProcess(["up", "--resume", str(run_dir), "--restart-on-failure", "--max-restarts", "1"],
                        drop_env=("REDIS_URL",))  # fmt: skip
    children = []
    try:
        again.wait_line(rf"run id\s+{re.escape(run_id)} \(resumed at step \d+\)", timeout_s=120)
        m = again.wait_line(r"rollout\s+starts on published weights v(\d+)", timeout_s=120)
        assert published is not None and int(m.group(1)) >= published[0]
        rollout_url = again.wait_line(r"rollout\s+(http://\S+)/answer", timeout_s=400).group(1)
        children = again.descendants()
        again.wait_line("still serving /answer", timeout_s=300)
        steps = [int(str(h["step"])) for h in train_log(run_dir)]
        assert steps == list(range(1, TOTAL + 1)), steps  # each step once, none lost to the kill
        assert (run_dir / "run_id").read_text().strip() == run_id

        # a dead rollout while serving: restarted once, on the trained weights ...
        os.kill(again.child_pid("rollout serve"), signal.SIGKILL)
        again.wait_line(r"rollout died \(killed by SIGKILL; log \S+\); restarting it \(1/1\)", timeout_s=30)
        again.wait_line(r"rollout\s+restarted, healthy after", timeout_s=300)
        children += again.descendants()
        r = httpx.post(
            f"{rollout_url}/answer", json={"question": "Who founded the Kreixvelor Academy?"}, timeout=120
        )
        assert r.status_code == 200 and r.json()["weights_version"] >= TOTAL, r.text
        # ... and the next death, past the restarts allowed, is the run's end
        os.kill(again.child_pid("rollout serve"), signal.SIGKILL)
        code = again.wait_exit(120)
    finally:
        again.stop()
    out = again.output(200)
    assert code == 1, out
    assert re.search(r"llds up failed: rollout died \(killed by SIGKILL\); log \S+/logs/rollout\.log", out), (
        out
    )
    assert "no restarts left: 1 of 1 used" in out
    assert not wait_gone(children), f"left running after llds up exited: {alive(children)}"
