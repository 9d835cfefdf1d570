"""Children end with their launcher however it dies (issue 30, item 7), with real processes: a
"launcher" that starts a service the way ``llds up`` does (its own session, ``LLDS_PARENT_PID``),
the service starting a grandchild (an engine's process), then ``kill -9`` of the launcher alone.
Also the Redis server ``llds up`` starts, and the port check that names a port's holder."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from llds.supervisor import port_holder

SERVICE = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    from llds_server import lifeline
    stubborn = sys.argv[1] == "stubborn"
    if stubborn:  # a service whose graceful stop hangs, with an engine process that ignores SIGTERM
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    lifeline.install("svc")
    kid = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN if %r else signal.SIG_DFL); time.sleep(300)"
        % stubborn])
    print(kid.pid, flush=True)
    time.sleep(300)
    """
)

LAUNCHER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    env = {**os.environ, "LLDS_PARENT_PID": str(os.getpid()), "LLDS_PARENT_GRACE_S": "2"}
    svc = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=env,
                           stdout=subprocess.PIPE, text=True, start_new_session=True)
    print(svc.pid, svc.stdout.readline().strip(), flush=True)
    time.sleep(300)
    """
)


def _gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [
            p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not left:
            return []
        time.sleep(0.1)
    return left


@pytest.mark.parametrize("kind", ["graceful", "stubborn"])
def test_a_service_and_its_engine_end_when_the_launcher_is_killed(kind: str) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, SERVICE, kind], stdout=subprocess.PIPE, text=True
    )
    svc, engine = (int(x) for x in launcher.stdout.readline().split())  # type: ignore[union-attr]
    try:
        time.sleep(1.0)
        assert _gone([svc, engine], 0.1) == [svc, engine]  # both alive while the launcher lives
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        # graceful: SIGTERM ends both at once; stubborn: SIGKILL after the 2 s grace
        left = _gone([svc, engine], 1.5 if kind == "graceful" else 8.0)
        assert left == [], f"left running after the launcher's kill -9: {left}"
    finally:
        for p in (svc, engine):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_without_a_launcher_variable_nothing_watches() -> None:
    from llds_server import lifeline

    os.environ.pop(lifeline.ENV, None)
    assert lifeline.install("x") is None


def test_the_redis_server_ends_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from llds.redis_server import RedisServer
        s = RedisServer(data_dir=Path({str(tmp_path)!r})).start()
        print(s.proc.pid, flush=True)
        time.sleep(300)
        """
    )
    starter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    redis_pid = int(starter.stdout.readline())  # type: ignore[union-attr]
    try:
        assert _gone([redis_pid], 0.5) == [redis_pid]
        starter.send_signal(signal.SIGKILL)
        starter.wait(10)
        assert _gone([redis_pid], 10.0) == [], "redis outlived the process that started it"
    finally:
        try:
            os.kill(redis_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_port_holder_names_the_process_listening() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen()
        held = port_holder("127.0.0.1", port)
        assert held is not None and held.startswith(f"pid {os.getpid()}: ") and "python" in held, held
    assert port_holder("127.0.0.1", port) is None


def test_llds_up_refuses_held_ports_naming_their_holder(tmp_path: Path) -> None:
    from llds.up import Up, UpConfig
    from llds_server.settings import ConfigError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        up = Up(UpConfig(run_dir=tmp_path / "run", rollout_port=port, retriever_port=0, trainer_port=0,
                         dashboard_port=0, redis_port=0, preset="tiny"))  # fmt: skip
        with pytest.raises(ConfigError) as e:
            up.check_ports()
    msg = str(e.value)
    assert f"rollout port {port} is held by pid {os.getpid()}: " in msg and "--rollout-port" in msg, msg
    assert "retriever" not in msg.split("stop what")[0]
