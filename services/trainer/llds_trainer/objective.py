"""The objective of one micro-batch: the policy loss, the KL and entropy terms and the likelihood
regulariser, each an object chosen by the config once, and the small stats record a micro-step returns.

The step (``llds_trainer.core``) builds an :class:`Objective` from the config and calls it per micro-batch;
it never branches on a loss name. Adding a policy loss is a function in ``loss.py`` and an entry in
:data:`POLICY_LOSSES`; adding a regulariser is a module of ``llds_trainer.regularizers``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Protocol

from torch import Tensor

from llds_trainer import regularizers
from llds_trainer.config import EnableLLDSConfig, GSPOConfig, PPOConfig, TrainerConfig
from llds_trainer.loss import (
    PolicyLossStats,
    aggregate,
    gspo_loss,
    low_var_kl,
    ppo_clip_loss,
)
from llds_trainer.regularizers.llds import LLDSConfig


class PolicyLoss(Protocol):
    """The clipped policy-gradient surrogate of a micro-batch (``[B, T]`` inputs, scalar loss)."""

    def __call__(
        self, logp_new: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor, is_weights: Tensor | None
    ) -> tuple[Tensor, PolicyLossStats]: ...


@dataclass(frozen=True)
class PPOClip:
    """PPO's token-level clipped surrogate (optionally asymmetric and dual-clipped)."""

    clip_eps: float
    clip_eps_high: float | None
    dual_clip_c: float | None
    agg: Any

    @classmethod
    def from_config(cls, c: PPOConfig, agg: Any) -> PPOClip:
        return cls(c.clip_eps, c.clip_eps_high, c.dual_clip_c, agg)

    def __call__(
        self, logp_new: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor, is_weights: Tensor | None
    ) -> tuple[Tensor, PolicyLossStats]:
        return ppo_clip_loss(logp_new, logp_old, advantages, mask, clip_eps=self.clip_eps,
                             clip_eps_high=self.clip_eps_high, dual_clip_c=self.dual_clip_c, agg=self.agg,
                             is_weights=is_weights)  # fmt: skip


@dataclass(frozen=True)
class GSPO:
    """GSPO's sequence-level clipped surrogate (length-normalised sequence ratio)."""

    clip_eps: float
    clip_eps_high: float

    @classmethod
    def from_config(cls, c: GSPOConfig, agg: Any) -> GSPO:
        return cls(c.clip_eps, c.clip_eps_high)

    def __call__(
        self, logp_new: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor, is_weights: Tensor | None
    ) -> tuple[Tensor, PolicyLossStats]:
        return gspo_loss(logp_new, logp_old, advantages, mask, clip_eps=self.clip_eps,
                         clip_eps_high=self.clip_eps_high, is_weights=is_weights)  # fmt: skip


POLICY_LOSSES: dict[str, Callable[[Any, Any], PolicyLoss]] = {
    "ppo": PPOClip.from_config,
    "gspo": GSPO.from_config,
}
"""``[policy_loss] type`` -> the loss object's builder(section, loss_agg)."""


@dataclass(frozen=True)
class MicroInputs:
    """One micro-batch's tensors, aligned ``[B, T]`` at the target positions."""

    logp_new: Tensor
    logp_old: Tensor
    advantages: Tensor
    loss_mask: Tensor
    answer_mask: Tensor
    entropy: Tensor | None = None
    logp_ref: Tensor | None = None
    is_weights: Tensor | None = None
    keep_mask: Tensor | None = None


def active_regularizer(cfg: TrainerConfig) -> Any:
    """The ``[regularizer]`` section a run uses: its own, or for a run without one whose alarm switches
    LLDS on, ``[lld.alarm.llds]``."""
    alarm = cfg.lld.alarm
    if regularizers.weight(cfg.regularizer) is None and isinstance(alarm, EnableLLDSConfig):
        return alarm.llds
    return cfg.regularizer


def active_llds(cfg: TrainerConfig) -> LLDSConfig | None:
    """The LLDS section a run uses (:func:`active_regularizer`), whose answer-span weight the step
    computes; ``None`` when the run never runs LLDS."""
    section = active_regularizer(cfg)
    return section if isinstance(section, LLDSConfig) else None


def configured_lambda(cfg: TrainerConfig) -> float | None:
    """The regulariser weight a run starts with: ``[regularizer] coef``, or ``None`` without one."""
    return regularizers.weight(cfg.regularizer)


def build_regularizer(cfg: TrainerConfig, lam: float | None) -> regularizers.Regularizer:
    """The run's regulariser (:func:`active_regularizer`) with weight ``lam`` (the configured one, or
    what an acting alarm set); none when ``lam`` is ``None`` (no regulariser, or the alarm has not acted)."""
    return regularizers.build(active_regularizer(cfg), lam)


@dataclass
class MicroStats:
    """What the micro-steps of a step contribute to its record: sums and counts, added up over the
    step's micro-batches and then across ranks by field name (``ratio_max`` is a maximum, kept apart)."""

    micro: int = 0
    pg: float = 0.0
    total: float = 0.0
    clip: float = 0.0
    dual_clip: float = 0.0
    llds: float = 0.0
    llds_n: int = 0
    gated: int = 0
    gate_units: int = 0
    kl: float = 0.0
    kl_n: int = 0
    ent: float = 0.0
    ent_n: int = 0
    train_tokens: int = 0

    def add(self, other: MicroStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Objective:
    """policy loss + kl_coef * KL - entropy_coef * entropy + regulariser, on one micro-batch."""

    policy_loss: PolicyLoss
    regularizer: regularizers.Regularizer
    agg: Any
    kl_coef: float
    kl_clamp: float
    entropy_coef: float

    @classmethod
    def from_config(cls, cfg: TrainerConfig, lam: float | None) -> Objective:
        loss = POLICY_LOSSES[cfg.policy_loss.type](cfg.policy_loss, cfg.loss_agg)
        return cls(
            loss, build_regularizer(cfg, lam), cfg.loss_agg, cfg.kl_coef, cfg.kl_clamp, cfg.entropy_coef
        )

    def __call__(self, x: MicroInputs, answer_weight: float | None) -> tuple[Tensor, MicroStats, float]:
        """The micro-batch's loss (to scale and back-propagate), its stats and its largest ratio.

        Tokens the off-policy correction dropped (``keep_mask`` 0) leave the policy, KL and entropy
        aggregations; the regulariser gets the full loss mask and the keep mask (its actions are
        those of the full mask)."""
        mask = x.loss_mask if x.keep_mask is None else x.loss_mask * x.keep_mask.to(x.loss_mask.dtype)
        pg, st = self.policy_loss(x.logp_new, x.logp_old, x.advantages, mask, x.is_weights)
        stats = MicroStats(micro=1, pg=float(pg.detach()), clip=st.clip_frac, dual_clip=st.dual_clip_frac)
        loss = pg
        if x.logp_ref is not None:
            kl = aggregate(low_var_kl(x.logp_new, x.logp_ref, self.kl_clamp), mask, self.agg)
            loss = loss + self.kl_coef * kl
            stats.kl, stats.kl_n = float(kl.detach()), 1
        if x.entropy is not None:
            e = aggregate(x.entropy, mask, self.agg)
            loss = loss - self.entropy_coef * e
            stats.ent, stats.ent_n = float(e.detach()), 1
        det = self.regularizer(x, answer_weight)
        if det is not None:
            loss = loss + det.term
            stats.llds, stats.llds_n = float(det.term.detach()), 1
            stats.gated, stats.gate_units = det.gated_units, det.total_units
        stats.total = float(loss.detach())
        return loss, stats, st.ratio_max
