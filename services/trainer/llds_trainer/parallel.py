"""How the policy lives on the data-parallel ranks (``TrainerConfig.parallel``): replicated or sharded.

- ``ddp`` (:class:`Replicated`): every rank holds the whole model, its gradients and the AdamW state;
  the summed gradients are all-reduced in one flat buffer before each update
  (:meth:`llds_trainer.dist.DistContext.all_reduce_grads`); rank 0 writes ``model.safetensors`` and
  ``optimizer.pt`` into a checkpoint.
- ``fsdp`` (:class:`Sharded`): PyTorch's FSDP2 (``fully_shard``) on every decoder layer and then the
  root, so parameters, gradients and AdamW state are sharded on dim 0 across ranks (DTensors, 1/W of
  each per rank). A forward all-gathers a layer's parameters and frees them after it; each backward
  reduce-scatters its gradients (a sum, like ``ddp``'s all-reduce) into the sharded gradients, which
  accumulate over micro-batches. Every rank writes its own shards of model and optimizer into a
  checkpoint with ``torch.distributed.checkpoint`` (DCP); a publish gathers the full state to rank 0.

Because a sharded forward and backward are collectives, ``fsdp`` runs the ranks in lockstep: every
rank runs the same number of forwards, a rank short of micro-batches joining with a zero-weight pass
(:meth:`llds_trainer.dist.DistContext.shard_lockstep`).

Both read and write the sharded checkpoint layout (DCP resharding on load), so a run can move from
``fsdp`` to ``ddp`` or to another world size; ``fsdp`` refuses the replicated layout.
"""

from __future__ import annotations

import logging
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch

from llds_trainer import checkpoint as ckpt
from llds_trainer.dist import DistContext

log = logging.getLogger("llds.trainer.parallel")

ParallelKind = Literal["ddp", "fsdp"]


class DataParallel(ABC):
    """Where parameters, gradients and optimizer state live, and what that changes in a step."""

    lockstep: bool = False
    """Every rank must run the same number of forwards and backwards (they are collectives)."""

    def __init__(self, dist: DistContext):
        self.dist = dist

    @abstractmethod
    def wrap(self, model: torch.nn.Module) -> None:
        """Prepare ``model`` (in place) before its optimizer is built over ``model.parameters()``."""

    @abstractmethod
    def reduce_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Make the accumulated gradients the sum over ranks (before clipping)."""

    @abstractmethod
    def clip_grad_norm(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
        """Clip to the global gradient norm over all ranks' parameters; returns that pre-clip norm."""

    @abstractmethod
    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
        """Write model and optimizer into the checkpoint folder ``folder`` (every rank calls this)."""

    @abstractmethod
    def load(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
        """Restore model and optimizer from the checkpoint folder ``folder`` (every rank calls this)."""

    @abstractmethod
    def full_state(self, model: torch.nn.Module) -> dict[str, Any] | None:
        """The full state dict to publish on rank 0, or None to publish the live model as it is.

        Every rank calls this (gathering shards is a collective); ranks other than 0 get None.
        """


class Replicated(DataParallel):
    """``ddp``: a full replica per rank, gradients all-reduced."""

    def wrap(self, model: torch.nn.Module) -> None:
        return None

    def reduce_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        self.dist.all_reduce_grads(params)

    def clip_grad_norm(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
        from safetensors.torch import save_model

        if not self.dist.is_main:
            return  # every replica is the same: rank 0's is the checkpoint
        save_model(model, str(folder / ckpt.MODEL_FILE))
        torch.save(optimizer.state_dict(), folder / ckpt.OPTIMIZER_FILE)

    def load(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
        from safetensors.torch import load_model

        if ckpt.is_sharded(folder):
            _dcp_load(model, optimizer, folder / ckpt.SHARDED_DIR)
            return
        device = next(model.parameters()).device
        missing, unexpected = load_model(
            model, str(folder / ckpt.MODEL_FILE), strict=False, device=str(device)
        )
        if missing or unexpected:
            raise ckpt.CheckpointError(
                f"checkpoint {folder} does not fit the model: missing {missing}, unexpected {unexpected}"
            )
        optimizer.load_state_dict(
            torch.load(folder / ckpt.OPTIMIZER_FILE, weights_only=True, map_location=device)
        )

    def full_state(self, model: torch.nn.Module) -> dict[str, Any] | None:
        return None


class Sharded(DataParallel):
    """``fsdp``: FSDP2 over the decoder layers and the root; DCP checkpoints; gathered publishing.

    With one process there is nothing to shard: the model stays as it is (``torch.distributed`` is
    not even initialised) and only the checkpoint layout is the sharded one, so the run can resume
    on more ranks.
    """

    lockstep = True

    def wrap(self, model: torch.nn.Module) -> None:
        if not self.dist.enabled:
            log.info("parallel = fsdp on a single process: nothing to shard, checkpoints in DCP layout")
            return
        from torch.distributed.fsdp import FSDPModule, fully_shard

        names = set(getattr(model, "_no_split_modules", None) or ())
        layers = [m for m in model.modules() if type(m).__name__ in names]
        if not layers:
            raise ValueError(
                f"parallel = fsdp: {type(model).__name__} names no decoder-layer class in _no_split_modules "
                f"({sorted(names)}); cannot tell which modules to shard"
            )
        # One FSDP unit per decoder layer: a forward holds one layer's full parameters at a time.
        # The root unit takes the rest (embeddings, final norm, a tied or untied head).
        for layer in layers:
            fully_shard(layer)
        fully_shard(model)
        for m in model.modules():
            if isinstance(m, FSDPModule):
                # Sum, not FSDP's default mean over ranks: each micro-batch loss is already scaled by
                # 1 / (micro-batches in the mini-batch), as under ddp's all-reduce.
                m.set_gradient_divide_factor(1.0)
                m.set_force_sum_reduction_for_comms(True)
        log.info(
            "parallel = fsdp: %d layer units + root sharded over %d ranks", len(layers), self.dist.world_size
        )

    def reduce_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        return None  # each backward reduce-scattered its gradients already

    def clip_grad_norm(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
        from torch.distributed.tensor import DTensor

        grads = [p.grad for p in params if p.grad is not None]
        # The norm of sharded gradients comes back as a DTensor reduced over ranks: the global norm.
        total = torch.nn.utils.get_total_norm(grads)
        if isinstance(total, DTensor):
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return float(total)

    def save(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(model, optimizer)
        # Each rank writes its own shards (fsynced) and rank 0 the metadata; a failure on any rank is
        # raised on every rank.
        with _single_process_dcp():
            dcp.save(
                {"model": msd, "optimizer": osd},
                storage_writer=dcp.FileSystemWriter(str(folder / ckpt.SHARDED_DIR), sync_files=True),
                no_dist=not self.dist.enabled,
            )

    def load(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
        if not ckpt.is_sharded(folder):
            raise ckpt.CheckpointError(
                f"checkpoint {folder} was written by parallel = 'ddp' ({ckpt.MODEL_FILE} and "
                f"{ckpt.OPTIMIZER_FILE}, whose AdamW state is keyed by parameter position, not name): "
                "resume it with parallel = 'ddp', or start the fsdp run in a fresh run_dir"
            )
        _dcp_load(model, optimizer, folder / ckpt.SHARDED_DIR)

    def full_state(self, model: torch.nn.Module) -> dict[str, Any] | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if not self.dist.enabled:
            return None
        # cpu_offload: only rank 0 keeps the gathered tensors, in host memory, one at a time on the GPU.
        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.dist.is_main:
            return None
        # Gathering copies each name separately; tied names must share one tensor again so that
        # save_pretrained writes the tie once (as a replicated model's folder does).
        first: dict[int, str] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            owner = first.setdefault(id(p), name)
            if owner != name and name in sd:
                sd[name] = sd[owner]
        return sd


@contextmanager
def _single_process_dcp() -> Iterator[None]:
    """Silence DCP's warning that it runs in one process: ``no_dist`` says so on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
        )
        yield


def _dcp_load(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Load a DCP model + optimizer checkpoint into ``model`` (sharded or not) and ``optimizer``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    # The state dicts of the live objects give DCP the shapes and shardings to read into.
    msd, osd = get_state_dict(model, optimizer)
    try:
        # Reads in place: into the tensors of msd and osd and the entries of their nested dicts.
        with _single_process_dcp():
            dcp.load(
                {"model": msd, "optimizer": osd},
                storage_reader=dcp.FileSystemReader(str(folder)),
                no_dist=not torch.distributed.is_initialized(),
            )
    except (OSError, RuntimeError, ValueError) as e:
        raise ckpt.CheckpointError(f"sharded checkpoint {folder} cannot be read into this model: {e}") from e
    set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd)


def build_parallel(kind: ParallelKind, dist: DistContext) -> DataParallel:
    """The implementation of ``TrainerConfig.parallel``."""
    return {"ddp": Replicated, "fsdp": Sharded}[kind](dist)
