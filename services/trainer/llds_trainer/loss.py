"""Pure tensor functions of the GRPO + LLDS objective (spec: ``llds.md`` sections 2-3).

Every function takes padded ``[B, T]`` tensors over target positions (one row per trajectory,
``loss_mask`` 1 on model-generated tokens, 0 on prompt, observation and padding) and returns
tensors; nothing here touches a model, an optimizer or I/O. Shapes are annotated on each line
that builds a tensor: ``B`` trajectories, ``T`` positions, ``V`` vocabulary, ``S`` action slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

Gate = Literal["action", "response", "token"]
Normalize = Literal["token", "paper"]
Aggregation = Literal["token_mean", "seq_mean_token_mean"]
AnswerWeightMode = Literal["off", "fixed", "adaptive_code", "adaptive_paper"]

ADV_EPS = 1e-6
"""Added to the group std, as in Search-R1 (``torch.std`` + 1e-6)."""


def grpo_advantages(rewards: Tensor, group_index: Tensor) -> Tensor:
    """GRPO outcome advantage per trajectory: ``(r - mean_G) / (std_G + 1e-6)``, std unbiased.

    A group of one sample uses mean 0 and std 1 (Search-R1's convention); a group whose rewards
    are all equal gets advantage 0.

    Args:
        rewards: ``[N]`` scalar reward per trajectory.
        group_index: ``[N]`` int64 group number per trajectory (any labels ``0..G-1``).

    Returns:
        ``[N]`` advantages (float32).
    """
    r = rewards.to(torch.float64)  # [N]
    g = group_index.to(torch.int64)  # [N]
    n_groups = int(g.max().item()) + 1 if g.numel() else 0
    count = r.new_zeros(n_groups).scatter_add_(0, g, torch.ones_like(r))  # [G]
    total = r.new_zeros(n_groups).scatter_add_(0, g, r)  # [G]
    mean = total / count.clamp(min=1)  # [G]
    sq = r.new_zeros(n_groups).scatter_add_(0, g, (r - mean[g]) ** 2)  # [G]
    std = torch.sqrt(sq / (count - 1).clamp(min=1))  # [G]
    single = count <= 1  # [G]
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return ((r - mean[g]) / (std[g] + ADV_EPS)).to(torch.float32)  # [N]


def action_ids(loss_mask: Tensor) -> Tensor:
    """Number every maximal run of loss-mask tokens in each row: 1, 2, ...; 0 off the mask.

    Args:
        loss_mask: ``[B, T]`` 0/1 (any dtype).

    Returns:
        ``[B, T]`` int64 action index per position.
    """
    m = loss_mask.bool()  # [B, T]
    prev = torch.zeros_like(m)  # [B, T]
    prev[:, 1:] = m[:, :-1]
    starts = m & ~prev  # [B, T]
    return torch.cumsum(starts.to(torch.int64), dim=1) * m.to(torch.int64)  # [B, T]


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """Log-probability of each target token under ``logits``.

    Args:
        logits: ``[B, T, V]`` (already divided by the sampling temperature).
        targets: ``[B, T]`` token ids.

    Returns:
        ``[B, T]`` float32 log-probs.
    """
    logits = logits.float()
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [B, T]
    return picked - torch.logsumexp(logits, dim=-1)  # [B, T]


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution at each position.

    Args:
        logits: ``[B, T, V]``.

    Returns:
        ``[B, T]`` entropy in nats.
    """
    logits = logits.float()
    lse = torch.logsumexp(logits, dim=-1)  # [B, T]
    p = torch.softmax(logits, dim=-1)  # [B, T, V]
    return lse - (p * logits).sum(-1)  # [B, T]


def aggregate(values: Tensor, loss_mask: Tensor, agg: Aggregation = "token_mean") -> Tensor:
    """Reduce per-token values to a scalar over the loss mask.

    ``token_mean``: sum over all loss tokens of the micro-batch / their count (Search-R1).
    ``seq_mean_token_mean``: token mean per row, then mean over rows with any loss token.

    Args:
        values: ``[B, T]``.
        loss_mask: ``[B, T]`` 0/1.
        agg: aggregation mode.

    Returns:
        Scalar tensor.
    """
    m = loss_mask.to(values.dtype)  # [B, T]
    v = torch.where(loss_mask.bool(), values, torch.zeros_like(values))  # [B, T]
    if agg == "token_mean":
        return v.sum() / m.sum().clamp(min=1)
    if agg == "seq_mean_token_mean":
        per_row = v.sum(-1) / m.sum(-1).clamp(min=1)  # [B]
        has = (m.sum(-1) > 0).to(values.dtype)  # [B]
        return (per_row * has).sum() / has.sum().clamp(min=1)
    raise ValueError(f"unknown aggregation {agg!r}")


@dataclass(frozen=True)
class PolicyLossStats:
    """Detached diagnostics of one policy-loss evaluation."""

    clip_frac: float
    """Fraction of loss tokens (or sequences, for GSPO) where the clipped branch was taken."""
    ratio_max: float
    """Largest importance ratio pi_theta / pi_old over loss tokens."""
    ratio_mean: float
    """Mean ratio over loss tokens."""
    dual_clip_frac: float = 0.0
    """Fraction of loss tokens where the dual clip's bound was taken (negative advantage, huge ratio)."""


def ppo_clip_loss(
    logp_new: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip_c: float | None = None,
    agg: Aggregation = "token_mean",
    is_weights: Tensor | None = None,
) -> tuple[Tensor, PolicyLossStats]:
    """PPO-clip policy loss with ratio ``exp(logp_new - logp_old)``.

    Per token ``max(-A r, -A clip(r, 1 - eps, 1 + eps_high))``; with dual clip (Ye et al. 2020,
    arXiv 1912.09729) tokens with ``A < 0`` are further bounded by ``-A c``, so one token whose ratio
    exploded cannot dominate the loss of a negative sample.

    Args:
        logp_new: ``[B, T]`` current policy log-probs (with gradient).
        logp_old: ``[B, T]`` pi_old log-probs (no gradient).
        advantages: ``[B]`` one advantage per trajectory, shared by its tokens.
        loss_mask: ``[B, T]`` 0/1.
        clip_eps: lower clip range; also the upper one unless ``clip_eps_high`` is given.
        clip_eps_high: upper clip range (DAPO's clip-higher); ``None`` = symmetric.
        dual_clip_c: the dual clip's bound ``c`` (> 1; 3.0 is common), or None for none.
        agg: token aggregation.
        is_weights: ``[B, T]`` truncated importance weights against the sampler (detached), or None.

    Returns:
        Scalar loss and its diagnostics.
    """
    mask = loss_mask.bool()  # [B, T]
    log_ratio = torch.where(mask, logp_new - logp_old.detach(), torch.zeros_like(logp_new))  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    adv = advantages.detach().unsqueeze(-1).to(ratio.dtype)  # [B, 1]
    high = clip_eps if clip_eps_high is None else clip_eps_high
    unclipped = -adv * ratio  # [B, T]
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high)  # [B, T]
    per_token = torch.maximum(unclipped, clipped)  # [B, T]
    dual = torch.zeros_like(mask)  # [B, T]
    if dual_clip_c is not None:
        if dual_clip_c <= 1:
            raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
        bound = -adv * dual_clip_c  # [B, 1]
        dual = (adv < 0) & (per_token > bound) & mask  # [B, T]
        per_token = torch.where(adv < 0, torch.minimum(per_token, bound), per_token)  # [B, T]
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
    loss = aggregate(per_token, loss_mask, agg)
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        stats = PolicyLossStats(
            clip_frac=float(((clipped > unclipped) & mask).sum() / n),
            ratio_max=float(ratio[mask].max()) if mask.any() else 1.0,
            ratio_mean=float(ratio[mask].mean()) if mask.any() else 1.0,
            dual_clip_frac=float(dual.sum() / n),
        )
    return loss, stats


def gspo_loss(
    logp_new: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    clip_eps: float = 3e-4,
    clip_eps_high: float | None = 4e-4,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, PolicyLossStats]:
    """GSPO: PPO-clip on the sequence-level ratio ``exp(mean_t(logp_new - logp_old))``.

    The sequence ratio is length-normalised (GSPO, Zheng et al. 2025), so the clip range is
    orders of magnitude tighter than PPO's; the loss is a mean over sequences.

    Args:
        logp_new: ``[B, T]`` with gradient.
        logp_old: ``[B, T]``.
        advantages: ``[B]``.
        loss_mask: ``[B, T]`` 0/1.
        clip_eps: lower clip range of the sequence ratio.
        clip_eps_high: upper clip range; ``None`` = ``clip_eps``.
        is_weights: ``[B, T]`` truncated IS weights; applied as their per-sequence token mean.

    Returns:
        Scalar loss and its diagnostics.
    """
    mask = loss_mask.bool()  # [B, T]
    m = loss_mask.to(logp_new.dtype)  # [B, T]
    n_tok = m.sum(-1).clamp(min=1)  # [B]
    log_ratio = torch.where(mask, logp_new - logp_old.detach(), torch.zeros_like(logp_new))  # [B, T]
    seq_ratio = torch.exp(log_ratio.sum(-1) / n_tok)  # [B]
    adv = advantages.detach().to(seq_ratio.dtype)  # [B]
    high = clip_eps if clip_eps_high is None else clip_eps_high
    unclipped = -adv * seq_ratio  # [B]
    clipped = -adv * torch.clamp(seq_ratio, 1.0 - clip_eps, 1.0 + high)  # [B]
    per_seq = torch.maximum(unclipped, clipped)  # [B]
    if is_weights is not None:
        per_seq = per_seq * ((is_weights.detach() * m).sum(-1) / n_tok)
    has = (m.sum(-1) > 0).to(per_seq.dtype)  # [B]
    loss = (per_seq * has).sum() / has.sum().clamp(min=1)
    with torch.no_grad():
        nb = has.sum().clamp(min=1)
        stats = PolicyLossStats(
            clip_frac=float(((clipped > unclipped).to(has.dtype) * has).sum() / nb),
            ratio_max=float(seq_ratio[has.bool()].max()) if has.any() else 1.0,
            ratio_mean=float(seq_ratio[has.bool()].mean()) if has.any() else 1.0,
        )
    return loss, stats


def low_var_kl(logp: Tensor, ref_logp: Tensor, clamp: float = 10.0) -> Tensor:
    """k3 estimator of KL(pi || ref) per token: ``exp(ref - logp) - (ref - logp) - 1``, clamped.

    Args:
        logp: ``[B, T]`` policy log-probs (with gradient).
        ref_logp: ``[B, T]`` frozen reference log-probs.
        clamp: symmetric clamp, as in verl's ``low_var_kl``.

    Returns:
        ``[B, T]`` per-token KL estimate.
    """
    d = ref_logp.detach() - logp  # [B, T]
    return torch.clamp(torch.exp(d) - d - 1.0, min=-clamp, max=clamp)  # [B, T]


def truncated_is_weights(logp_old: Tensor, logp_sampler: Tensor, apply: Tensor, cap: float) -> Tensor:
    """Truncated importance weights ``min(exp(logp_old - logp_sampler), cap)`` where ``apply``.

    Corrects for trajectories sampled by a policy other than pi_old (an older version, or the
    inference engine's numerics); 1.0 elsewhere.

    Args:
        logp_old: ``[B, T]`` trainer's pi_old log-probs.
        logp_sampler: ``[B, T]`` the sampler's log-probs.
        apply: ``[B, T]`` bool, tokens to correct.
        cap: upper clamp of the weight.

    Returns:
        ``[B, T]`` detached weights.
    """
    w = torch.exp((logp_old - logp_sampler).detach()).clamp(max=cap)  # [B, T]
    return torch.where(apply.bool(), w, torch.ones_like(w))  # [B, T]


def answer_weight(
    mode: AnswerWeightMode, lam: float, w_ans: float, valid_searches_mean: float
) -> float | None:
    """LLDS weight on answer-span tokens (MA, spec section 3); ``None`` when MA is off.

    - ``fixed``: ``min(w_ans, lam)``.
    - ``adaptive_code``: ``min(w_ans * max(V_s - 1, 0), lam)`` (the authors' code).
    - ``adaptive_paper``: ``beta * lam`` with ``beta = min(V_s / 2, 1)`` (the paper).

    Args:
        mode: which rule.
        lam: the LLDS weight lambda.
        w_ans: the answer weight parameter of the code's rules.
        valid_searches_mean: V_s, mean valid searches per trajectory in the training batch.
    """
    if mode == "off":
        return None
    if mode == "fixed":
        return min(w_ans, lam)
    if mode == "adaptive_code":
        return min(w_ans * max(valid_searches_mean - 1.0, 0.0), lam)
    if mode == "adaptive_paper":
        return min(valid_searches_mean / 2.0, 1.0) * lam
    raise ValueError(f"unknown answer weight mode {mode!r}")


@dataclass(frozen=True)
class LLDSDetails:
    """The LLDS term with the quantities the monitor reports."""

    term: Tensor
    """Scalar term (with gradient through ``logp_new``)."""
    penalty: Tensor
    """``[B, T]`` weighted per-token penalty before normalisation."""
    gated_units: int
    """Gate units (actions, responses or tokens) of preserving responses that were gated."""
    total_units: int
    """Gate units of preserving responses."""


def llds_details(
    logp_new: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    gate: Gate = "action",
    lam: float = 0.2,
    answer_mask: Tensor | None = None,
    answer_weight: float | None = None,
    normalize: Normalize = "token",
    keep_mask: Tensor | None = None,
) -> LLDSDetails:
    """:func:`llds_term` plus gate statistics; see there for the arguments."""
    mask = loss_mask.bool()  # [B, T]
    ids = action_ids(mask)  # [B, T] actions of the full loss mask: a dropped token does not split one
    if keep_mask is not None:
        mask = mask & keep_mask.bool()
        ids = ids * mask.to(ids.dtype)
    zero = torch.zeros_like(logp_new)  # [B, T]
    delta = torch.where(mask, logp_old.detach() - logp_new, zero)  # [B, T]
    d = delta.detach()  # [B, T]
    preserve = (advantages.detach() >= 0).unsqueeze(-1) & mask  # [B, T]
    if gate == "token":
        gated = preserve & (d > 0)  # [B, T]
        gated_units, total_units = int(gated.sum()), int(preserve.sum())
    elif gate == "response":
        row_gate = d.sum(-1, keepdim=True) > 0  # [B, 1]
        gated = preserve & row_gate & (d > 0)  # [B, T]
        rows = preserve.any(-1)  # [B]
        gated_units, total_units = int((rows & row_gate.squeeze(-1)).sum()), int(rows.sum())
    elif gate == "action":
        n_slots = int(ids.max().item()) + 1 if ids.numel() else 1
        sums = d.new_zeros(d.shape[0], n_slots).scatter_add_(1, ids, d)  # [B, S]
        slot_gate = sums > 0  # [B, S]
        slot_gate[:, 0] = False
        gated = preserve & slot_gate.gather(1, ids) & (d > 0)  # [B, T]
        pres_row = (advantages.detach() >= 0).unsqueeze(-1)  # [B, 1]
        present = torch.zeros(d.shape[0], n_slots, dtype=torch.bool, device=d.device)  # [B, S]
        present.scatter_(1, ids, mask)
        present[:, 0] = False
        present = present & pres_row
        gated_units, total_units = int((present & slot_gate).sum()), int(present.sum())
    else:
        raise ValueError(f"unknown LLDS gate {gate!r}")
    weight = torch.full_like(d, lam)  # [B, T]
    if answer_mask is not None and answer_weight is not None:
        weight = torch.where(answer_mask.bool(), torch.full_like(d, min(answer_weight, lam)), weight)
    penalty = torch.where(gated, weight * torch.clamp(delta, min=0.0), zero)  # [B, T]
    if normalize == "token":
        term = penalty.sum() / mask.sum().clamp(min=1)
    elif normalize == "paper":
        rows = (advantages.detach() >= 0) & mask.any(-1)  # [B]
        per_row = penalty.sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
        term = (per_row * rows.to(per_row.dtype)).sum() / rows.sum().clamp(min=1)
    else:
        raise ValueError(f"unknown LLDS normalisation {normalize!r}")
    return LLDSDetails(term=term, penalty=penalty, gated_units=gated_units, total_units=total_units)


def llds_term(
    logp_new: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    gate: Gate = "action",
    lam: float = 0.2,
    answer_mask: Tensor | None = None,
    answer_weight: float | None = None,
    normalize: Normalize = "token",
    keep_mask: Tensor | None = None,
) -> Tensor:
    """The LLDS regulariser (spec ``llds.md`` section 3): penalise likelihood that fell.

    Per loss token ``delta = logp_old - logp_new``. Only responses with advantage >= 0 count.
    Gate ``action``: an action (maximal run of loss-mask tokens) whose summed delta is > 0 has
    each of its tokens with delta > 0 penalised by ``delta``; ``response``: the same with the
    whole response; ``token``: every token with delta > 0. Gates carry no gradient. Each penalty
    is weighted by ``lam`` (``min(answer_weight, lam)`` on answer-span tokens). ``token``
    normalisation divides the sum by the number of loss tokens of the micro-batch (the authors'
    code); ``paper`` averages per response over the preserving set (the paper's Eq. 4).

    Args:
        logp_new: ``[B, T]`` current policy log-probs (gradient flows through these only).
        logp_old: ``[B, T]`` pi_old log-probs.
        advantages: ``[B]`` per-trajectory advantage.
        loss_mask: ``[B, T]`` 0/1, 1 on model-generated tokens.
        gate: ``action`` | ``response`` | ``token``.
        lam: LLDS weight lambda.
        answer_mask: ``[B, T]`` 1 on answer-span tokens, or None.
        answer_weight: weight on answer-span tokens (capped at ``lam``), or None for ``lam``.
        normalize: ``token`` | ``paper``.
        keep_mask: ``[B, T]`` loss tokens an off-policy correction kept (``llds_trainer.correction``), or
            None for all: a dropped token is out of the gates, the penalty and the normalisation
            counts, as it is out of the policy loss; actions are still the runs of ``loss_mask``.

    Returns:
        Scalar tensor.
    """
    return llds_details(
        logp_new,
        logp_old,
        advantages,
        loss_mask,
        gate=gate,
        lam=lam,
        answer_mask=answer_mask,
        answer_weight=answer_weight,
        normalize=normalize,
        keep_mask=keep_mask,
    ).term
