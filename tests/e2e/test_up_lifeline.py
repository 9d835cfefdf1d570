"""Issue 30, item 7, on a real ``llds up`` tiny run (vLLM): no process of a run outlives its launcher,
and the watchdog catches a child that lives but makes no progress.

1. ``kill -9`` of ``llds up`` alone at step 1: every process it started (retriever, rollout with its
   vLLM engine processes, trainer, the Redis server) is gone shortly after (each child's lifeline,
   Redis by its parent-death signal), without anyone killing them by hand.
2. ``llds up --resume --restart-on-failure --stall-timeout-s 30``: the rollout is frozen with SIGSTOP
   (alive, silent); the watchdog names it, with its log, kills and restarts it, and the run reaches
   its total steps, each step once.
3. ``kill -9`` of the launcher's process group while it serves: again nothing of the run is left.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from up_kit import FREE_PORTS, LLDS_UP_MARKS, LldsProcess, alive, train_log, wait_gone, wait_step

pytestmark = LLDS_UP_MARKS

TOTAL = 8
STALL_S = 30


def test_children_end_with_their_launcher_and_the_watchdog_restarts_a_frozen_rollout(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-l"
    first = LldsProcess(["up", "--preset", "tiny", "--steps", str(TOTAL), "--run-dir", str(run_dir),
                         "--no-dashboard", *FREE_PORTS], drop_env=("REDIS_URL",))  # fmt: skip
    try:
        wait_step(run_dir, 1, first, timeout_s=400)
        procs = first.descendants()
        assert any("redis" in " ".join(p.cmdline()) or "valkey" in " ".join(p.cmdline()) for p in procs)
        os.kill(first.proc.pid, signal.SIGKILL)  # the launcher alone
        first.proc.wait(30)
        left = wait_gone(procs, timeout_s=40)
        assert left == [], f"outlived their launcher: {[(p.pid, p.cmdline()) for p in left]}"
    finally:
        first.stop()
    done_before = max(int(str(h["step"])) for h in train_log(run_dir))
    assert done_before < TOTAL, "the first run finished before the kill"

    again = LldsProcess(["up", "--resume", str(run_dir), "--restart-on-failure", "--max-restarts", "1",
                         "--stall-timeout-s", str(STALL_S)], drop_env=("REDIS_URL",))  # fmt: skip
    try:
        again.wait_line(r"rollout\s+(http://\S+)/answer", timeout_s=400)
        rollout = again.child_pid("rollout serve")
        os.kill(rollout, signal.SIGSTOP)  # alive, and silent
        m = again.wait_line(r"rollout stalled \(pid (\d+)\): (.*); log (\S+)", timeout_s=STALL_S + 120)
        assert int(m.group(1)) == rollout and m.group(3).endswith("logs/rollout.log"), m.group(0)
        assert re.search(
            r"/health has not answered 200|no group reached the stream and no episode finished", m.group(2)
        ), m.group(0)
        again.wait_line(r"rollout\s+restarted, healthy after", timeout_s=300)
        again.wait_line("still serving /answer", timeout_s=600)
        steps = [int(str(h["step"])) for h in train_log(run_dir)]
        assert steps == list(range(1, TOTAL + 1)), steps
        procs = again.descendants()
        os.killpg(os.getpgid(again.proc.pid), signal.SIGKILL)  # the launcher's process group
        again.proc.wait(30)
        left = wait_gone(procs, timeout_s=40)
        assert left == [], f"outlived their launcher: {[(p.pid, p.cmdline()) for p in alive(left)]}"
    finally:
        again.stop()
