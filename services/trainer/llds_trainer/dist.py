"""Data parallelism over ``torch.distributed`` processes (launched with ``torchrun``).

Rank 0 owns the queue, checkpoints and publishing; every rank trains on its share of each
mini-batch's micro-batches and the gradients are summed over ranks before every optimizer update, so
W processes compute the same update as one process that accumulates all micro-batches (gloo on CPUs,
NCCL on GPUs). Whether each rank holds a full replica (all-reduce here) or a shard of the model is
``llds_trainer.parallel``'s business.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as torch_dist

T = TypeVar("T")


@dataclass(frozen=True)
class DistContext:
    """Rank and world size of this process; a single process is rank 0 of 1."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_env(cls, device: torch.device) -> DistContext:
        """Join the process group torchrun describes in the environment (``WORLD_SIZE`` > 1)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        if device.type == "cuda":
            # One GPU per rank: "cuda" then means this rank's device everywhere (.to, FSDP's mesh).
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if not torch_dist.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            torch_dist.init_process_group(backend=backend)
        return cls(rank=torch_dist.get_rank(), world_size=torch_dist.get_world_size())

    def shard(self, items: list[T]) -> list[T]:
        """This rank's items: ``items[rank::world_size]``."""
        return items[self.rank :: self.world_size]

    def shard_lockstep(self, items: list[T]) -> list[tuple[T, bool]]:
        """This rank's items flagged True, padded with ``(items[0], False)`` to ``ceil(len / world_size)``.

        Every rank gets the same number of entries: a sharded model's forward and backward are
        collectives, so a rank short of work runs a throw-away pass on a filler item instead of none.
        """
        if not items:
            return []
        mine = [(x, True) for x in self.shard(items)]
        per_rank = -(-len(items) // self.world_size)
        return mine + [(items[0], False)] * (per_rank - len(mine))

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        torch_dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        torch_dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_reduce_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum gradients over ranks in one flat buffer (a rank without micro-batches adds zeros)."""
        if not self.enabled:
            return
        ps = [p for p in params if p.requires_grad]
        for p in ps:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in ps])  # type: ignore[union-attr]
        torch_dist.all_reduce(flat, op=torch_dist.ReduceOp.SUM)
        offset = 0
        for p in ps:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p))  # type: ignore[union-attr]
            offset += n

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        if not self.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.SUM)
        return t.tolist()

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier()

    def close(self) -> None:
        if self.enabled and torch_dist.is_initialized():
            torch_dist.destroy_process_group()
