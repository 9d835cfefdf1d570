"""Child-process supervision for ``llds up``: start, prefix logs, wait for health, report a death,
restart, stop everything.

Each child runs in its own session (process group), so stopping it also stops whatever it spawned
(vLLM engine processes): nothing ``llds up`` started survives it. A trainer of several ranks runs
under ``python -m llds.supervisor torchrun ...`` (:func:`torchrun_main`): torchrun puts each rank in a
session of its own, out of reach of the group's signals, so each rank's lifeline watches torchrun.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from llds_proto.exits import EXIT_FAILED
from llds_server.lifeline import ENV as LIFELINE_ENV


def port_holder(host: str, port: int) -> str | None:
    """None when ``host:port`` can be listened on; else who holds it ("pid N: its command line"),
    as far as this user can see."""
    import errno
    import socket

    import psutil

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT is no holder
        try:
            s.bind((host, port))
            return None
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
    try:
        conns = psutil.net_connections(kind="inet")
    except psutil.AccessDenied:
        conns = []
    for c in conns:
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
            try:
                cmd = " ".join(psutil.Process(c.pid).cmdline())
            except psutil.Error:
                cmd = "?"
            return f"pid {c.pid}: {cmd[:300]}"
    return "a process this user cannot see"


class ChildFailed(RuntimeError):
    """A child exited or never became healthy; the message names it, its exit status, its log's path
    and last lines. ``exit_code`` is the status ``llds up`` exits with (one of :mod:`llds_proto.exits`)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_status(code: int | None) -> str:
    """``returncode`` in words: a negative code is the signal that killed the process."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exit code {code}"


def describe_death(name: str, code: int | None, log_path: Path, tail: list[str]) -> str:
    """The one message every unexpected exit is reported with."""
    lines = "\n".join(f"  {line}" for line in tail) or "  (no output)"
    return f"{name} died ({exit_status(code)}); log {log_path}; last lines:\n{lines}"


@dataclass
class Child:
    """One supervised process."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    clear_env: str | None = None
    """Inherited variables with this prefix are not passed on (``LLDS_TRAINER_``: the child's resolved
    config file already holds what they said, and they would override it)."""
    proc: subprocess.Popen[bytes] | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=40))
    restarts: int = 0
    _pump: threading.Thread | None = None

    def start(self, echo: bool = True) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        inherited = {
            k: v for k, v in os.environ.items() if not (self.clear_env and k.startswith(self.clear_env))
        }
        # The child ends when this process does, however it ends (llds_server.lifeline).
        env = {**inherited, "PYTHONUNBUFFERED": "1", LIFELINE_ENV: str(os.getpid()), **self.env}
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self._pump = threading.Thread(
            target=self._copy_output, args=(echo,), daemon=True, name=f"log-{self.name}"
        )
        self._pump.start()
        return self

    def _copy_output(self, echo: bool) -> None:
        """Every line into the child's log file; on the console all of them (``echo``) or only its
        errors and tracebacks (:class:`llds.console.ErrorEcho`)."""
        from llds.console import ErrorEcho

        assert self.proc is not None and self.proc.stdout is not None
        errors = ErrorEcho(self.log_path)
        with self.log_path.open("ab") as log:
            for raw in iter(self.proc.stdout.readline, b""):
                log.write(raw)
                log.flush()
                line = raw.decode(errors="replace").rstrip()
                self.tail.append(line)
                shown = line if echo else errors(line)
                if shown is not None:
                    sys.stdout.write(f"[{self.name:>9}] {shown}\n")
                    sys.stdout.flush()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def reap(self) -> None:
        """After the child died: kill what it left in its group (a vLLM engine process outlives a
        SIGKILLed parent and holds the log pipe open) and let the log pump drain."""
        self.signal_group(signal.SIGKILL)
        if self._pump is not None:
            self._pump.join(timeout=5)

    def describe_exit(self) -> str:
        return describe_death(self.name, self.returncode, self.log_path, list(self.tail)[-20:])

    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the child's process group; SIGKILL it after ``timeout_s``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.proc.wait()
        # Grandchildren that outlived their parent still belong to the group.
        self.reap()


def wait_healthy(child: Child, url: str, timeout_s: float) -> float:
    """Poll ``url`` until it answers 200; returns seconds waited. Raises if the child dies first."""
    t0 = time.monotonic()
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() - t0 < timeout_s:
            if not child.running():
                child.reap()
                raise ChildFailed(child.describe_exit())
            try:
                if client.get(url).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    tail = "\n".join(f"  {line}" for line in list(child.tail)[-20:])
    raise ChildFailed(
        f"{child.name} not healthy at {url} after {timeout_s:.0f} s; log {child.log_path}; last lines:\n{tail}"
    )


def torchrun_argv(nproc: int, command: list[str]) -> list[str]:
    """argv of a child running ``command`` (``-m MODULE ARGS...``) as ``nproc`` ranks on this machine,
    under :func:`torchrun_main`."""
    return [sys.executable, "-m", "llds.supervisor", "torchrun", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(nproc), *command]  # fmt: skip


def torchrun_main(argv: list[str]) -> int:
    """torchrun (``torch.distributed.run``) in this process, ending with ``llds up`` like any child:
    this process's lifeline watches ``llds up`` (its SIGTERM makes torchrun stop the ranks), and each
    rank's lifeline (installed by ``llds.cli``) watches this process, so a rank outlives neither, however
    they end. Exits with the first failed rank's exit status (a trainer out of learning signal stays
    distinguishable from a crash), 0 when every rank exits 0."""
    from llds_server import lifeline

    lifeline.install("torchrun")
    os.environ[LIFELINE_ENV] = str(os.getpid())
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
    except ChildFailedError as e:
        _, failure = e.get_first_failure()
        return failure.exitcode if failure.exitcode > 0 else EXIT_FAILED
    except SignalException as e:
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["torchrun"]:
        print("usage: python -m llds.supervisor torchrun TORCHRUN_ARGS...", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(torchrun_main(sys.argv[2:]))
