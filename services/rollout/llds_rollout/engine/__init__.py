"""Engine backends behind :class:`~llds_rollout.engine.base.Engine`, chosen by ``engine.type``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llds_rollout.engine.base import Engine, EngineError, GenerationRequest, GenerationResult, WeightLoadError

if TYPE_CHECKING:
    from llds_rollout.config import EngineSettings

__all__ = [
    "Engine",
    "EngineError",
    "GenerationRequest",
    "GenerationResult",
    "WeightLoadError",
    "build_engine",
]


def build_engine(model: str, settings: EngineSettings, initial_version: int = 0) -> Engine:
    """The backend ``settings.type`` names; imports it lazily so the other backend's stack is not needed."""
    if settings.type == "transformers":
        from llds_rollout.engine.hf import TransformersEngine

        return TransformersEngine(
            model,
            max_batch_size=settings.max_batch_size,
            dtype=settings.dtype,
            device=settings.device,
            seed=settings.seed,
            torch_threads=settings.torch_threads,
            initial_version=initial_version,
        )
    if settings.type == "vllm":
        from llds_rollout.engine.vllm import VLLMEngine

        return VLLMEngine(model, settings, initial_version=initial_version)
    raise ValueError(f"unknown engine type {settings.type!r}")
