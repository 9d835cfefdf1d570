"""A service started by a launcher ends when the launcher does, however it ends.

``llds up`` puts its own pid in ``LLDS_PARENT_PID`` of every child it starts (each in a session of
its own, so that a Ctrl-C reaches the launcher first and it stops them in order). Without a lifeline,
a launcher killed by ``kill -9``, the OOM killer or a closed terminal leaves its children running as
orphans holding the run's ports, the CPU and (the rollout) a vLLM engine core and its workers.

:func:`install` starts a thread that notices the launcher is gone (this process was re-parented)
and sends SIGTERM to this process and what it started (its own graceful stop: uvicorn's shutdown, the
trainer's "stop after the step"; an engine's processes), and SIGKILL to all of them if this process
is still alive ``LLDS_PARENT_GRACE_S`` seconds later (default 10) or, before that, when it exits:
what a crash does, which the run's delivery guarantees are built for.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time

log = logging.getLogger("llds.lifeline")

ENV = "LLDS_PARENT_PID"
"""The launcher's pid; unset: no lifeline (a service started by hand, compose or Kubernetes)."""
GRACE_ENV = "LLDS_PARENT_GRACE_S"
"""Seconds between the graceful stop and the SIGKILL of the process tree."""
DEFAULT_GRACE_S = 10.0
POLL_S = 0.5


def signal_tree(sig: int) -> None:
    """``sig`` to this process and everything it started: its process group when it leads one (what
    ``llds up`` gives each child, and what an engine's processes stay in), else its descendants and
    itself one by one."""
    import psutil

    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), sig)
        return
    for k in psutil.Process().children(recursive=True):
        try:
            k.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    os.kill(os.getpid(), sig)


def _end(name: str, parent: int, grace_s: float) -> None:
    log.error(
        "%s: its launcher (pid %d) is gone; stopping (SIGTERM now, SIGKILL in %.0f s)", name, parent, grace_s
    )
    atexit.register(signal_tree, signal.SIGKILL)  # a graceful exit takes what is left with it
    signal_tree(signal.SIGTERM)
    time.sleep(grace_s)
    log.error("%s: still running %.0f s after SIGTERM; SIGKILL", name, grace_s)
    logging.shutdown()
    signal_tree(signal.SIGKILL)


def _watch(name: str, parent: int, grace_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    _end(name, parent, grace_s)


def install(name: str) -> threading.Thread | None:
    """Watch the launcher named by ``LLDS_PARENT_PID`` (none: returns None). The parent must be this
    process's parent when called; a launcher already gone ends this process at once."""
    raw = os.environ.get(ENV)
    if not raw:
        return None
    try:
        parent = int(raw)
        grace_s = float(os.environ.get(GRACE_ENV) or DEFAULT_GRACE_S)
    except ValueError as e:
        raise ValueError(f"{ENV}={raw!r} / {GRACE_ENV}: {e}") from e
    t = threading.Thread(target=_watch, args=(name, parent, grace_s), name="llds-lifeline", daemon=True)
    t.start()
    return t
