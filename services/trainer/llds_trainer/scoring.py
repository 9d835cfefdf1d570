"""The trainer's forward passes: token log-probs (and entropy) of the sampled tokens, scored over a
step's samples in micro-batches across data-parallel ranks, and placed back at a micro-batch's target
positions. Used by the step (``llds_trainer.core``) for pi_old, the reference model, the update's
pi_theta and the LLD probe; it knows nothing of losses or corrections.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from llds_trainer.batch import MicroBatch, Sample, collate, response_slice
from llds_trainer.dist import DistContext
from llds_trainer.loss import entropy_from_logits, token_logprobs


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

    def logp(
        self, model: torch.nn.Module, mb: MicroBatch, want_entropy: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs ``[B, L-1]`` of the targets (and entropy), zero before the first response token."""
        Lm1 = mb.targets.shape[1]
        start = max(0, int(mb.loss_mask.nonzero()[:, 1].min()) if mb.loss_mask.any() else Lm1 - 1)
        keep = Lm1 + 1 - start  # positions start..L-1; the last one predicts past the end
        with torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            out = model(
                input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False, logits_to_keep=keep
            )
        # Only loss-mask positions are ever used; the vocabulary-wide softmax dominates the cost of
        # a small model, so it runs on those rows alone.
        sel = mb.loss_mask[:, start:].bool()  # [B, L-1-start]
        logits = out.logits[:, :-1][sel].float()  # [N, V]
        if self.temperature != 1.0:
            logits = logits / self.temperature
        logp = torch.zeros(mb.targets.shape, dtype=torch.float32, device=logits.device)  # [B, L-1]
        logp[:, start:][sel] = token_logprobs(logits[None], mb.targets[:, start:][sel][None])[0]
        ent = None
        if want_entropy:
            ent = torch.zeros_like(logp)  # [B, L-1]
            ent[:, start:][sel] = entropy_from_logits(logits[None])[0]
        return logp, ent

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
        self, samples: list[Sample], *, entropy: bool, ref: bool
    ) -> tuple[list[Tensor], list[Tensor] | None, list[Tensor] | None]:
        """Response-aligned log-probs of every sample under the policy (and entropy, reference)."""
        self.model.eval()
        mine: dict[int, tuple[list[float], list[float] | None, list[float] | None]] = {}
        for idx, real in self.mine(self.micro_batches(range(len(samples)))):
            mb = collate([samples[i] for i in idx], idx, self.pad_id).to(self.device)
            logp, ent = self.logp(self.model, mb, entropy)
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
        lp = [torch.tensor(merged[i][0]) for i in range(len(samples))]
        en = [torch.tensor(merged[i][1]) for i in range(len(samples))] if entropy else None
        rf = [torch.tensor(merged[i][2]) for i in range(len(samples))] if ref and self.ref_model else None
        return lp, en, rf

    def place(self, mb: MicroBatch, samples: list[Sample], values: list[Tensor]) -> Tensor:
        """Put response-aligned per-sample values at the micro-batch's target positions."""
        out = torch.zeros(mb.targets.shape, dtype=torch.float32)  # [B, L-1]
        for b, i in enumerate(mb.index):
            out[b, response_slice(samples[i])] = values[i]
        return out.to(self.device)
