"""Fault injection for the reliability tests.

``LLDS_FAULT_SWAP_DELAY_S=<seconds>``: a weight update waits this long after its folder passed the
checks and before the engine reads it (and while the folder is pinned), which is where a folder
deleted or rewritten by someone else hurts. Unset, it does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os

log = logging.getLogger("llds.rollout.faults")

SWAP_DELAY_ENV = "LLDS_FAULT_SWAP_DELAY_S"


async def before_swap() -> None:
    delay = float(os.environ.get(SWAP_DELAY_ENV) or 0)
    if delay > 0:
        # logged as it starts: a test changes the folder inside this window, not before the checks
        log.warning("fault injection: the checked folder is read in %.1f s (%s)", delay, SWAP_DELAY_ENV)
        await asyncio.sleep(delay)
