"""Response bodies of the trainer's own HTTP routes (``/status``); ``/health`` uses llds_proto."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class StatusResponse(BaseModel):
    """Body of ``GET /status``."""

    state: Literal["starting", "waiting", "training", "done", "failed", "stopped"]
    """What the trainer is doing."""
    step: int
    """RL steps completed."""
    target_steps: int
    """Steps the run trains to (0 = forever)."""
    weights_version: int
    """Newest published version."""
    groups_consumed: int
    """Groups trained on over the whole run (resumes included)."""
    lld_alarm: Literal["ok", "warning", "alarm"]
    """State of the LLD alarm."""
    last_step: dict[str, object] | None = None
    """The newest step record."""
    error: str | None = None
    """Why the trainer failed, if it did."""
    world_size: int = 1
    """Data-parallel processes."""
