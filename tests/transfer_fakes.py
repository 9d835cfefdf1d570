"""A rollout engine that pretends to receive weights over NCCL (no vLLM, no GPU), shared by the
trainer's sync tests and the vLLM-env handshake tests (``tests/`` is on sys.path via its conftest)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llds_rollout.engine.base import Engine, GenerationRequest, GenerationResult, WeightLoadError


class Receiver(Engine):
    """Records inits, checks and receives; ``check_transfer`` accepts exactly ``spec`` (name -> shape)."""

    def __init__(self, workers: int, spec: dict[str, tuple[int, ...]]) -> None:
        super().__init__()
        self.workers, self.spec = workers, spec
        self.inits: list[dict[str, Any]] = []
        self.checks: list[list[str]] = []
        self.received: list[int] = []

    @property
    def ready(self) -> bool:
        return True

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        raise AssertionError("not used")

    async def update_weights(self, tensors: Any, folder: Path, version: int) -> None:
        raise AssertionError("not used")

    @property
    def transfer_enabled(self) -> bool:
        return True

    @property
    def transfer_workers(self) -> int:
        return self.workers

    async def init_weight_transfer(self, init_info: Any) -> None:
        self.inits.append(dict(init_info))

    def check_transfer(self, names: Sequence[str], shapes: Sequence[Sequence[int]]) -> None:
        self.checks.append(list(names))
        if {n: tuple(s) for n, s in zip(names, shapes, strict=True)} != self.spec:
            raise WeightLoadError("checkpoint does not match the served model's tensors")

    async def receive_weights(self, names: Any, dtype_names: Any, shapes: Any, version: int) -> None:
        self.received.append(version)
        self._version = version
