"""Fault injection for the reliability tests.

``LLDS_TRAINER_FAILPOINT=<point>:<step>``: the process kills itself with SIGKILL at that point of that
step (``after_fetch``, ``after_train``, ``after_log``, ``after_checkpoint``, ``after_ack``,
``after_publish``), which is what a power cut or an OOM kill does.

``LLDS_FAULT_POISON_GROUPS=<group id>,...`` (not a ``LLDS_TRAINER_`` setting, so it reaches a trainer that
``llds up`` starts): a training step (or the check of one group) that holds
one of these groups raises, as a step does on data the policy cannot take (what the dead-letter
stream is for).

Unset, both do nothing.
"""

from __future__ import annotations

import os
import signal

ENV = "LLDS_TRAINER_FAILPOINT"
POISON_ENV = "LLDS_FAULT_POISON_GROUPS"


class InjectedFailure(RuntimeError):
    """The training failure ``LLDS_FAULT_POISON_GROUPS`` asks for."""


def raise_for_groups(group_ids: list[str]) -> None:
    spec = os.environ.get(POISON_ENV)
    if not spec:
        return
    hit = sorted(set(spec.split(",")) & set(group_ids))
    if hit:
        raise InjectedFailure(f"injected training failure for group {hit[0]} ({POISON_ENV})")


def failpoint(name: str, step: int) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, _, at = spec.partition(":")
    if point == name and (not at or int(at) == step):
        os.kill(os.getpid(), signal.SIGKILL)
