"""NCCL weight transfer: the capability an engine may offer beside folder swaps, and its errors.

Only the vLLM backend started with ``engine.weight_transfer = "nccl"`` (on GPUs) receives weights
over NCCL; the service asks :func:`collective_receiver` for it and answers 409 for every other engine.
The wire protocol (packed broadcast from the trainer's rank 0) is vLLM's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from llds_rollout.config import EngineSettings


class WeightTransferStateError(RuntimeError):
    """This replica cannot take part in an NCCL transfer now: not configured for it, or no group
    joined yet; the message says which setting or call is missing (-> 409)."""


class WeightTransferError(RuntimeError):
    """Joining the group or receiving over it failed after it started (-> 502)."""


class CollectiveReceiver(Protocol):
    """An engine that receives weights broadcast by the trainer over an NCCL group."""

    @property
    def transfer_enabled(self) -> bool:
        """True when the engine was started with NCCL weight transfer."""
        ...

    @property
    def transfer_workers(self) -> int:
        """NCCL ranks the engine's workers occupy in the group."""
        ...

    async def init_weight_transfer(self, init_info: Mapping[str, Any]) -> None:
        """Join the trainer's group (vLLM ``NCCLWeightTransferInitInfo`` fields); leaves an old one first."""
        ...

    def check_transfer(self, names: Sequence[str], shapes: Sequence[Sequence[int]]) -> None:
        """Raise ``WeightLoadError`` if these tensors do not fit the served model, or
        :class:`WeightTransferStateError` if no group is joined."""
        ...

    async def receive_weights(
        self,
        names: Sequence[str],
        dtype_names: Sequence[str],
        shapes: Sequence[Sequence[int]],
        version: int,
    ) -> None:
        """Between requests (gate, drain), receive the broadcast, then serve it as ``version``."""
        ...


def collective_receiver(engine: object, settings: EngineSettings) -> CollectiveReceiver:
    """``engine`` as a :class:`CollectiveReceiver`, or :class:`WeightTransferStateError` naming the setting."""
    if getattr(engine, "transfer_enabled", False):
        return cast(CollectiveReceiver, engine)
    raise WeightTransferStateError(
        f"this replica does not receive weights over NCCL (engine.type = {settings.type!r}"
        + (f", engine.weight_transfer = {settings.weight_transfer!r}" if settings.type == "vllm" else "")
        + "): start it with "
        "engine.type = 'vllm', engine.weight_transfer = 'nccl' and engine.device = 'cuda', or use the "
        "trainer's weight_sync = 'filesystem'"
    )
