"""The trainer's forward passes: token log-probs (and entropy) of the sampled tokens, scored over a
step's samples in micro-batches across data-parallel ranks, and placed back at a micro-batch's target
positions. Used by the step (``llds_trainer.core``) for pi_old, the reference model, the update's
pi_theta and the LLD probe; it knows nothing of losses or corrections.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from llds_trainer.batch import MicroBatch, Sample, collate, response_slice
from llds_trainer.dist import DistContext
from llds_trainer.loss import entropy_from_logits, token_logprobs


def target_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    targets: Tensor,
    loss_mask: Tensor,
    *,
    temperature: float = 1.0,
    autocast: torch.dtype | None = None,
    want_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs of the targets on loss-mask positions (and the entropy there), zero elsewhere.

    The language-model head and the vocabulary-wide softmax run on the loss-mask positions alone
    (the union over the rows, passed to the model as ``logits_to_keep``): prompt and retrieved
    documents are most of a trajectory's tokens, and on a small model the head and softmax over a
    49k vocabulary cost about as much as the layers, in float32 ``[B, L, V]`` memory.

    Args:
        input_ids: ``[B, L]``; attention_mask: ``[B, L]``.
        targets: ``[B, L-1]`` (position ``j`` predicts ``input_ids[:, j + 1]``).
        loss_mask: ``[B, L-1]`` 0/1.

    Returns:
        ``[B, L-1]`` float32 log-probs and, if asked, entropies (nats).
    """
    logp = torch.zeros(targets.shape, dtype=torch.float32, device=targets.device)  # [B, L-1]
    ent = torch.zeros_like(logp) if want_entropy else None
    positions = loss_mask.bool().any(0).nonzero().squeeze(1)  # [P] target positions any row scores
    if positions.numel() == 0:
        # The forward still runs (one position, nothing selected): a backward through it must find
        # a graph, and a sharded model's forward is a collective every rank joins.
        positions = torch.tensor([targets.shape[1] - 1], device=targets.device)
    with torch.autocast(input_ids.device.type, dtype=autocast, enabled=autocast is not None):
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=positions
        )
    sel = loss_mask[:, positions].bool()  # [B, P]
    logits = out.logits[sel].float()  # [N, V]
    if temperature != 1.0:
        logits = logits / temperature
    picked = torch.zeros(sel.shape, dtype=torch.float32, device=logp.device)  # [B, P]
    picked[sel] = token_logprobs(logits[None], targets[:, positions][sel][None])[0]
    logp[:, positions] = picked
    if ent is not None:
        e = torch.zeros_like(picked)  # [B, P]
        e[sel] = entropy_from_logits(logits[None])[0]
        ent[:, positions] = e
    return logp, ent


@dataclass
class Scorer:
    """Log-probs of a policy (and a frozen reference) on collated micro-batches."""

    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    temperature: float
    micro_batch_size: int
    pad_id: int
    device: torch.device
    dist: DistContext
    autocast: torch.dtype | None = None
    """Compute dtype of the forward passes (``torch.autocast``); None: the parameters' own."""
    lockstep: bool = False
    """Every rank runs the same number of forwards (a sharded model's forward is a collective)."""
    before_forward: Callable[[], None] | None = None
    """Called before every forward (the service sets the CPU thread count by the rollout's activity)."""

    def logp(
        self, model: torch.nn.Module, mb: MicroBatch, want_entropy: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs ``[B, L-1]`` of the targets (and entropy), zero off the loss mask."""
        if self.before_forward is not None:
            self.before_forward()
        return target_logprobs(
            model, mb.input_ids, mb.attention_mask, mb.targets, mb.loss_mask,
            temperature=self.temperature, autocast=self.autocast, want_entropy=want_entropy,
        )  # fmt: skip

    def micro_batches(self, order: Sequence[int]) -> list[list[int]]:
        k = self.micro_batch_size
        return [list(order[i : i + k]) for i in range(0, len(order), k)]

    def mine(self, micros: list[list[int]]) -> list[tuple[list[int], bool]]:
        """This rank's micro-batches, each flagged whether it counts; in lockstep padded to the same
        number on every rank with filler passes (flag False) whose results are thrown away."""
        if self.lockstep:
            return self.dist.shard_lockstep(micros)
        return [(m, True) for m in self.dist.shard(micros)]

    @torch.no_grad()
    def score(
        self,
        samples: list[Sample],
        *,
        entropy: bool,
        ref: bool,
        only: set[int] | None = None,
        policy: bool = True,
    ) -> tuple[list[Tensor], list[Tensor] | None, list[Tensor] | None]:
        """Response-aligned log-probs of every sample under the policy (and entropy, reference).

        ``only``: score just the micro-batches that hold one of these samples (the others' rows come
        back empty). The micro-batches are the ones a full pass makes, so a sample's values are the
        bits a full pass gives: unchanged weights give a displacement of exactly zero. ``policy``
        False: the reference model alone (the policy's rows come back empty).
        """
        self.model.eval()
        micros = self.micro_batches(range(len(samples)))
        if only is not None:
            micros = [m for m in micros if any(i in only for i in m)]
        mine: dict[int, tuple[list[float], list[float] | None, list[float] | None]] = {}
        for idx, real in self.mine(micros):
            mb = collate([samples[i] for i in idx], idx, self.pad_id).to(self.device)
            logp, ent = self.logp(self.model, mb, entropy) if policy else (mb.targets[:, :0].float(), None)
            ref_lp = self.logp(self.ref_model, mb, False)[0] if ref and self.ref_model is not None else None
            if not real:
                continue
            for b, i in enumerate(idx):
                sl = response_slice(samples[i])
                mine[i] = (
                    logp[b, sl].cpu().tolist(),
                    ent[b, sl].cpu().tolist() if ent is not None else None,
                    ref_lp[b, sl].cpu().tolist() if ref_lp is not None else None,
                )
        merged: dict[int, Any] = {}
        for part in self.dist.all_gather_object(mine):
            merged.update(part)
        none = ([], [], [])
        lp = [torch.tensor(merged.get(i, none)[0]) for i in range(len(samples))]
        en = [torch.tensor(merged.get(i, none)[1]) for i in range(len(samples))] if entropy else None
        rf = (
            [torch.tensor(merged.get(i, none)[2]) for i in range(len(samples))]
            if ref and self.ref_model
            else None
        )
        return lp, en, rf

    def place(self, mb: MicroBatch, samples: list[Sample], values: list[Tensor]) -> Tensor:
        """Put response-aligned per-sample values at the micro-batch's target positions."""
        out = torch.zeros(mb.targets.shape, dtype=torch.float32)  # [B, L-1]
        for b, i in enumerate(mb.index):
            out[b, response_slice(samples[i])] = values[i]
        return out.to(self.device)
