"""Trajectory groups -> padded tensors, token for token (nothing is re-tokenized).

A row is ``prompt_ids + response_ids``; tensors over *target* positions ``1..L-1`` (position ``j``
predicts token ``j + 1``) carry the loss mask, the sampler's log-probs, the sampling versions and the
answer-span mask, all zero on prompt, observation and padding positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from llds_proto.messages import TrajectoryGroup
from llds_trainer.loss import grpo_advantages


@dataclass(frozen=True)
class Sample:
    """One trajectory ready for the trainer, with its group advantage."""

    group_id: str
    trajectory_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    answer_span: tuple[int, int] | None
    reward: float
    exact_match: float
    num_valid_searches: int
    num_turns: int
    advantage: float
    overlong: bool = False
    """Truncated (``finish_reason`` ``length`` or ``context``) and masked out of the loss by
    ``overlong_filter``; its reward still counts in its group's advantage baseline."""

    @property
    def n_loss_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def correct(self) -> bool:
        """Counted as a correct response by the LLD monitor (exact match of the final answer)."""
        return self.exact_match >= 0.5


TRUNCATED = frozenset({"length", "context"})
"""``Trajectory.finish_reason`` values of a response cut off by a length limit."""


def samples_from_groups(groups: Sequence[TrajectoryGroup], overlong_filter: bool = False) -> list[Sample]:
    """Flatten groups to samples; the GRPO advantage is computed per group.

    ``overlong_filter`` (DAPO's overlong filtering): a truncated response keeps its place in its
    group's advantage, but its loss mask is zeroed, so no loss, regulariser or update sees it.
    """
    rewards: list[float] = []
    index: list[int] = []
    for gi, g in enumerate(groups):
        for t in g.trajectories:
            rewards.append(t.reward)
            index.append(gi)
    adv = grpo_advantages(torch.tensor(rewards), torch.tensor(index)).tolist() if rewards else []
    out: list[Sample] = []
    k = 0
    for g in groups:
        for t in g.trajectories:
            overlong = overlong_filter and t.finish_reason in TRUNCATED
            out.append(
                Sample(
                    group_id=g.group_id,
                    trajectory_id=t.trajectory_id,
                    prompt_ids=tuple(t.prompt_ids),
                    response_ids=tuple(t.response_ids),
                    loss_mask=tuple(0 if overlong else int(m) for m in t.loss_mask),
                    logprobs=tuple(t.logprobs),
                    versions=tuple(t.versions),
                    answer_span=tuple(t.answer_span) if t.answer_span else None,  # type: ignore[arg-type]
                    reward=t.reward,
                    exact_match=t.exact_match,
                    num_valid_searches=t.num_valid_searches,
                    num_turns=t.num_turns,
                    advantage=float(adv[k]),
                    overlong=overlong,
                )
            )
            k += 1
    return out


@dataclass
class MicroBatch:
    """Padded tensors of a few samples (right padding)."""

    input_ids: Tensor  # [B, L]
    attention_mask: Tensor  # [B, L]
    targets: Tensor  # [B, L-1]
    loss_mask: Tensor  # [B, L-1] float 0/1
    logp_sampler: Tensor  # [B, L-1]
    versions: Tensor  # [B, L-1] int64, -1 off the loss mask
    answer_mask: Tensor  # [B, L-1] float 0/1
    advantages: Tensor  # [B]
    index: list[int]
    """Positions of these samples in the step's sample list."""

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            targets=self.targets.to(device),
            loss_mask=self.loss_mask.to(device),
            logp_sampler=self.logp_sampler.to(device),
            versions=self.versions.to(device),
            answer_mask=self.answer_mask.to(device),
            advantages=self.advantages.to(device),
            index=self.index,
        )


def collate(samples: Sequence[Sample], index: Sequence[int], pad_id: int) -> MicroBatch:
    """Pad samples into one micro-batch.

    Args:
        samples: the samples.
        index: their positions in the step's sample list (carried through for bookkeeping).
        pad_id: token id used for padding (masked out of attention and every loss).
    """
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    B, L = len(samples), max(lengths)
    input_ids = torch.full((B, L), pad_id, dtype=torch.int64)  # [B, L]
    attention = torch.zeros((B, L), dtype=torch.int64)  # [B, L]
    loss_mask = torch.zeros((B, L - 1))  # [B, L-1]
    logp = torch.zeros((B, L - 1))  # [B, L-1]
    versions = torch.full((B, L - 1), -1, dtype=torch.int64)  # [B, L-1]
    answer = torch.zeros((B, L - 1))  # [B, L-1]
    for b, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[b, : p + r] = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.int64)
        attention[b, : p + r] = 1
        # response token j sits at input position p + j and is predicted at target position p + j - 1
        sl = slice(p - 1, p - 1 + r)
        loss_mask[b, sl] = torch.tensor(s.loss_mask, dtype=torch.float32)
        logp[b, sl] = torch.tensor(s.logprobs, dtype=torch.float32)
        versions[b, sl] = torch.tensor(s.versions, dtype=torch.int64)
        if s.answer_span is not None:
            a, e = s.answer_span
            answer[b, p - 1 + a : p - 1 + e] = 1.0
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention,
        targets=input_ids[:, 1:].clone(),
        loss_mask=loss_mask,
        logp_sampler=logp,
        versions=versions,
        answer_mask=answer * loss_mask,
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        index=list(index),
    )


def response_slice(sample: Sample) -> slice:
    """Target positions of a sample's response tokens inside its micro-batch row."""
    p = len(sample.prompt_ids)
    return slice(p - 1, p - 1 + len(sample.response_ids))
