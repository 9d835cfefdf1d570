"""Running ``llds up`` (and ``llds bench soak``) as a real process tree in the e2e tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from llds.cli import vllm_python

FREE_PORTS = ["--retriever-port", "0", "--rollout-port", "0", "--trainer-port", "0", "--redis-port", "0",
              "--dashboard-port", "0"]  # fmt: skip


class LldsProcess:
    """``llds ARGS`` in its own session, its output collected line by line."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, drop_env: tuple[str, ...] = ()):
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        for k in drop_env:
            full_env.pop(k, None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llds.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=full_env,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self, last: int = 80) -> str:
        return "".join(self.lines[-last:])

    def wait_line(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """The first output line matching ``pattern``; fails if the process ends or time runs out."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while time.monotonic() < deadline:
            while seen < len(self.lines):
                if m := re.search(pattern, self.lines[seen]):
                    return m
                seen += 1
            if self.proc.poll() is not None and seen >= len(self.lines):
                self._reader.join(timeout=5)
                if seen >= len(self.lines):
                    raise AssertionError(
                        f"exited ({self.proc.returncode}) before {pattern!r}:\n{self.output()}"
                    )
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} after {timeout_s:.0f} s:\n{self.output()}")

    def wait_exit(self, timeout_s: float) -> int:
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout_s:.0f} s:\n{self.output()}") from None
        self._reader.join(timeout=10)
        return code

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def child_pid(self, cmdline_part: str) -> int:
        """The pid of the direct child whose command line contains ``cmdline_part`` (e.g. "trainer run")."""
        for p in psutil.Process(self.proc.pid).children():
            if cmdline_part in " ".join(p.cmdline()):
                return p.pid
        raise AssertionError(f"no child running {cmdline_part!r}")

    def kill_tree(self) -> list[psutil.Process]:
        """``kill -9`` of every process group this tree runs in, its own included: a machine crash as
        far as the run dir and Redis's append-only file can tell. Returns the processes it had."""
        procs = [psutil.Process(self.proc.pid), *self.descendants()]
        groups = set()
        for p in procs:
            try:
                groups.add(os.getpgid(p.pid))
            except ProcessLookupError:
                pass
        for g in groups:
            try:
                os.killpg(g, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)
        return procs

    def stop(self) -> None:
        """Ctrl-C, then SIGKILL of the whole tree if it does not end (test teardown)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.kill_tree()


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(procs: list[psutil.Process], timeout_s: float = 15.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while alive(procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(procs)


def train_log(run_dir: Path) -> list[dict[str, object]]:
    path = run_dir / "trainer" / "train_log.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # being written
    return out


def wait_step(run_dir: Path, step: int, proc: LldsProcess, timeout_s: float) -> None:
    """Until the trainer has logged ``step`` (and a checkpoint of it exists)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(int(str(h.get("step"))) >= step for h in train_log(run_dir)) and list(
            (run_dir / "trainer" / "checkpoints").glob("step_*")
        ):
            return
        if proc.proc.poll() is not None:
            raise AssertionError(
                f"llds up exited ({proc.proc.returncode}) before step {step}:\n{proc.output()}"
            )
        time.sleep(0.5)
    raise AssertionError(f"no step {step} after {timeout_s:.0f} s:\n{proc.output()}")


LLDS_UP_MARKS = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(
        vllm_python() is None,
        reason="the tiny preset's rollout runs on vLLM and no .venv-vllm is built: `make test` builds it",
    ),
]
"""Marks of every test that runs ``llds up`` (its tiny preset's rollout is on vLLM)."""
