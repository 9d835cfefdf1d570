"""Crash injection for the queue-semantics tests: ``LLDS_TRAINER_FAILPOINT=<point>:<step>``.

When set, the process kills itself with SIGKILL at that point of that step (``after_fetch``,
``after_train``, ``after_log``, ``after_checkpoint``, ``after_ack``, ``after_publish``), which is what
a power cut or an OOM kill does. Unset, :func:`failpoint` does nothing.
"""

from __future__ import annotations

import os
import signal

ENV = "LLDS_TRAINER_FAILPOINT"


def failpoint(name: str, step: int) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, _, at = spec.partition(":")
    if point == name and (not at or int(at) == step):
        os.kill(os.getpid(), signal.SIGKILL)
