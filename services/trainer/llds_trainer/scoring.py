"""The trainer's forward passes: token log-probs (and entropy) of the sampled tokens, scored over a
step's samples in micro-batches across data-parallel ranks, and placed back at a micro-batch's target
positions. Used by the step (``llds_trainer.core``) for pi_old, the reference model, the update's
pi_theta and the LLD probe; it knows nothing of losses or corrections.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from llds_trainer.batch import MicroBatch, Sample, collate, response_slice
from llds_trainer.dist import DistContext
from llds_trainer.loss import entropy_from_logits, token_logprobs


class ScoringError(RuntimeError):
    """The model cannot be scored the way the config asks (its logits are not its output head's)."""


def head_scores(
    logits: Tensor, targets: Tensor, temperature: float, want_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """Log-probs of ``targets`` and entropies from the output head's logits, in float32.

    Args:
        logits: ``[N, V]`` in the head's dtype (bfloat16 under autocast).
        targets: ``[N]`` token ids.

    Returns:
        ``[N]`` float32 log-probs and, if asked, ``[N]`` entropies (nats).
    """
    logits = logits.float()  # [N, V]
    if temperature != 1.0:
        logits = logits / temperature
    lp = token_logprobs(logits[None], targets[None])[0]  # [N]
    ent = entropy_from_logits(logits[None])[0] if want_entropy else None  # [N]
    return lp, ent


class ChunkedHead:
    """Stands in for a causal LM's output head during one forward: the head and the softmax run on
    ``chunk`` selected positions at a time, so no ``[N, V]`` tensor of the whole selection exists.

    Hooks on the head module (not a replacement module): the head is still called by the model's own
    forward, so under FSDP its parameters are the ones the root unit gathered. A forward pre-hook
    takes the hidden states ``[B, P, H]``, scores the ``[N, H]`` rows the selection picks chunk by
    chunk and hands the head an empty input; the forward hook returns the ``[N]`` log-probs as the
    head's output. With gradients and more than one chunk, each chunk runs under activation
    checkpointing: only its ``[C, H]`` input is kept, and its logits are recomputed in the backward
    pass, one chunk at a time.
    """

    def __init__(self, sel: Tensor, targets: Tensor, temperature: float, chunk: int, want_entropy: bool):
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.sel = sel  # [B, P] bool
        self.targets = targets  # [N]
        self.temperature = temperature
        self.chunk = chunk
        self.want_entropy = want_entropy
        self.lp: Tensor | None = None  # [N]
        self.ent: Tensor | None = None  # [N]

    def _scores(self, head: torch.nn.Module, h: Tensor, targets: Tensor) -> tuple[Tensor, Tensor | None]:
        logits = head.forward(h)  # [C, V], in the autocast dtype if any
        # The softmax in float32 whatever the surrounding autocast (as outside the model's forward).
        with torch.autocast(h.device.type, enabled=False):
            return head_scores(logits, targets, self.temperature, self.want_entropy)

    def _pre(self, head: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        from torch.utils.checkpoint import checkpoint

        hidden = args[0]  # [B, P, H]
        h = hidden[self.sel]  # [N, H]
        n = h.shape[0]
        recompute = torch.is_grad_enabled() and h.requires_grad and n > self.chunk
        lps: list[Tensor] = []
        ents: list[Tensor] = []
        # An empty selection still runs one (empty) chunk: the outputs keep a graph through the model.
        for s in range(0, max(n, 1), self.chunk):
            hc, tc = h[s : s + self.chunk], self.targets[s : s + self.chunk]  # [C, H], [C]
            if recompute:
                lp, ent = checkpoint(
                    self._scores, head, hc, tc, use_reentrant=False, preserve_rng_state=False
                )
            else:
                lp, ent = self._scores(head, hc, tc)
            lps.append(lp)
            if ent is not None:
                ents.append(ent)
        self.lp = torch.cat(lps) if len(lps) > 1 else lps[0]
        self.ent = (torch.cat(ents) if len(ents) > 1 else ents[0]) if ents else None
        return (hidden[:, :0], *args[1:])

    def _post(self, head: torch.nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
        return self.lp

    @contextmanager
    def attached(self, model: torch.nn.Module) -> Iterator[None]:
        """Hook the model's output head for the forwards run inside this block."""
        head = model.get_output_embeddings()  # type: ignore[operator]
        if not isinstance(head, torch.nn.Module):
            raise ScoringError(
                f"{type(model).__name__} has no output head (get_output_embeddings() is None): "
                "set logits_chunk_tokens = 0"
            )
        pre = head.register_forward_pre_hook(self._pre)
        post = head.register_forward_hook(self._post)
        try:
            yield
        finally:
            pre.remove()
            post.remove()

    def take(self, model: torch.nn.Module, logits: Tensor) -> tuple[Tensor, Tensor | None]:
        """The ``[N]`` log-probs and entropies, given the ``logits`` the model's forward returned."""
        if self.lp is None or logits is not self.lp:
            raise ScoringError(
                f"{type(model).__name__}'s forward does not return its output head's result as the logits "
                "(soft-capping or scaling after the head?): chunked scoring cannot be used with it, set "
                "logits_chunk_tokens = 0"
            )
        return self.lp, self.ent


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
    chunk_tokens: int = 0,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs of the targets on loss-mask positions (and the entropy there), zero elsewhere.

    The language-model head and the vocabulary-wide softmax run on the loss-mask positions alone
    (the union over the rows, passed to the model as ``logits_to_keep``): prompt and retrieved
    documents are most of a trajectory's tokens, and on a small model the head and softmax over a
    49k vocabulary cost about as much as the layers, in float32 ``[B, L, V]`` memory.

    ``chunk_tokens`` > 0 (``TrainerConfig.logits_chunk_tokens``): the head runs on the ``N`` scored
    tokens only, ``chunk_tokens`` of them at a time (:class:`ChunkedHead`), so the head's memory is
    that of one chunk whatever ``N``; 0: the head on every kept position of every row at once
    (``[B, P, V]`` logits and float32 ``[N, V]`` copies). The values agree to float32 rounding: a
    matrix product over fewer rows may take another kernel (on the development CPU the same bits for
    chunks of 7 tokens and more, 2e-6 nats off for chunks of 1; ``tests/unit/trainer/test_scoring.py``).

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
    sel = loss_mask[:, positions].bool()  # [B, P]
    picked_targets = targets[:, positions][sel]  # [N]
    amp = torch.autocast(input_ids.device.type, dtype=autocast, enabled=autocast is not None)
    kwargs = dict(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=positions
    )
    if chunk_tokens > 0:
        head = ChunkedHead(sel, picked_targets, temperature, chunk_tokens, want_entropy)
        with head.attached(model), amp:
            out = model(**kwargs)
        lp_n, ent_n = head.take(model, out.logits)  # [N], [N]
    else:
        with amp:
            out = model(**kwargs)
        lp_n, ent_n = head_scores(out.logits[sel], picked_targets, temperature, want_entropy)
    picked = torch.zeros(sel.shape, dtype=torch.float32, device=logp.device)  # [B, P]
    picked[sel] = lp_n
    logp[:, positions] = picked
    if ent is not None and ent_n is not None:
        e = torch.zeros_like(picked)  # [B, P]
        e[sel] = ent_n
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
    chunk_tokens: int = 0
    """Scored tokens per output-head chunk (``TrainerConfig.logits_chunk_tokens``); 0: all at once."""

    def logp(
        self, model: torch.nn.Module, mb: MicroBatch, want_entropy: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Log-probs ``[B, L-1]`` of the targets (and entropy), zero off the loss mask."""
        if self.before_forward is not None:
            self.before_forward()
        return target_logprobs(
            model, mb.input_ids, mb.attention_mask, mb.targets, mb.loss_mask,
            temperature=self.temperature, autocast=self.autocast, want_entropy=want_entropy,
            chunk_tokens=self.chunk_tokens,
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
