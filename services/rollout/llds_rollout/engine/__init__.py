"""Engine backends behind :class:`~llds_rollout.engine.base.Engine`, chosen by ``engine.type``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llds_rollout.engine.base import (
    Engine,
    EngineError,
    GenerationRequest,
    GenerationResult,
    WeightLoadError,
    WeightSwapError,
)

if TYPE_CHECKING:
    from llds_rollout.config import EngineSettings

__all__ = [
    "Engine",
    "EngineError",
    "GenerationRequest",
    "GenerationResult",
    "WeightLoadError",
    "WeightSwapError",
    "build_engine",
]


def build_engine(model: str, settings: EngineSettings, initial_version: int = 0) -> Engine:
    """The backend ``settings.type`` names, built by its settings class (which imports that backend
    alone, so the other backend's stack is not needed)."""
    engine: Engine = settings.build(model, initial_version)
    return engine
