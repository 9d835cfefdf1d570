"""Off-policy corrections against the sampler: one small class per method, chosen by the config.

A trajectory is sampled by the rollout (``logp_sampler``, per token, and the policy version that
sampled each token), the trainer recomputes pi_old (``logp_old``); the two differ when the token was
sampled by an older version, and by a little on every token from engine-vs-trainer numerics. Each
correction reads the per-token ratio ``r_t = exp(logp_old_t - logp_sampler_t)`` of the tokens it is
applied to (``[correction] tokens``: the stale ones, or all, see :func:`apply_mask`) and
returns per-token weights for the policy loss and a keep mask:

- ``tis`` (:class:`TokenTIS`, the default): ``w_t = min(r_t, c)``, nothing dropped;
- ``seq_tis`` (:class:`SequenceTIS`): one weight per sequence ``min(prod_t r_t, c)`` over its applied
  tokens, on every loss token of the sequence;
- ``mis`` (:class:`TokenMIS`): tokens with ``r_t`` outside ``[low, high]`` are dropped, the others
  weighted by ``r_t`` (verl's ``rollout_is_mode = "mask"``: rejection through the mask, the kept
  ratios are not truncated);
- ``seq_mis`` (:class:`SequenceMIS`): sequences with ``prod_t r_t`` outside ``[low, high]`` are dropped,
  the others weighted by that product (the same mode at verl's sequence level);
- ``geo_reject`` (:class:`GeometricRejection`): sequences whose geometric mean ``exp(mean_t log r_t)``
  is outside ``[low, high]`` are dropped, the others weight 1 (pure rejection, verl's
  ``rollout_rs = "geometric"`` without IS weights: the geometric mean is no importance weight).

Tokens the correction is not applied to count as ratio 1 (weight 1 for the token methods, a factor 1
in a sequence's product or mean); a sequence with no applied token is never dropped. A dropped token
leaves the loss mask (``keep_mask`` false): the trainer aggregates every term of the loss over the
kept tokens only, so it is out of the token counts the aggregation divides by, not a weight-0 token
diluting them. Everything here is detached and runs on ``[B, T]`` tensors in any row layout (one row
per trajectory).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from llds_proto import steplog as K
from llds_trainer.loss import truncated_is_weights

Scope = Literal["off", "stale", "all"]


@dataclass(frozen=True)
class CorrectionStats:
    """Counts of one evaluation; ratios of them are the step record's ``is/*`` values."""

    corrected: int
    """Loss tokens the correction acted on: the applied tokens (token methods), or every loss token of
    a sequence with an applied token (sequence methods)."""
    kept_corrected: int
    """Of those, the ones kept in the loss."""
    weight_sum: float
    """Sum of the weights of the kept corrected tokens."""
    truncated: int | None
    """Corrected tokens whose weight the cap truncated; None for methods that never truncate."""
    loss_tokens: int
    """Loss tokens of the batch."""
    masked_tokens: int
    """Loss tokens dropped from the loss."""
    sequences: int
    """Rows with a loss token."""
    dropped_sequences: int
    """Rows with a loss token whose every loss token was dropped."""


@dataclass(frozen=True)
class CorrectionOut:
    """What a correction returns."""

    weights: Tensor
    """``[B, T]`` detached float32 weights of the policy loss (1 off the corrected tokens, 0 on dropped ones)."""
    keep_mask: Tensor
    """``[B, T]`` bool: the loss tokens kept (``loss_mask`` without the dropped ones)."""
    stats: CorrectionStats


class Correction(Protocol):
    """An off-policy correction; :func:`build_correction` picks one from the config."""

    def weights(
        self, logp_old: Tensor, logp_sampler: Tensor, apply_mask: Tensor, loss_mask: Tensor
    ) -> CorrectionOut:
        """Weights and keep mask of ``[B, T]`` log-probs.

        Args:
            logp_old: ``[B, T]`` the trainer's pi_old log-probs.
            logp_sampler: ``[B, T]`` the sampler's log-probs of the same tokens.
            apply_mask: ``[B, T]`` tokens to correct (only loss tokens count).
            loss_mask: ``[B, T]`` 0/1 loss mask.
        """
        ...


def apply_mask(scope: Scope, loss_mask: Tensor, versions: Tensor, version: int) -> Tensor:
    """``[B, T]`` bool: the loss tokens a correction applies to under ``[correction] tokens = scope``.

    ``stale``: sampled by a version older than the trainer's ``version``; ``all``: every loss token;
    ``off``: none.
    """
    m = loss_mask.bool()  # [B, T]
    if scope == "all":
        return m
    if scope == "stale":
        return m & (versions < version)
    if scope == "off":
        return torch.zeros_like(m)
    raise ValueError(f"unknown correction scope {scope!r}")


def _log_ratio(logp_old: Tensor, logp_sampler: Tensor, apply: Tensor) -> Tensor:
    """``[B, T]`` float64 ``logp_old - logp_sampler`` on applied tokens, 0 elsewhere."""
    d = (logp_old - logp_sampler).to(torch.float64)  # [B, T]
    return torch.where(apply, d, torch.zeros_like(d))  # [B, T]


def _inside(x: Tensor, low: float, high: float) -> Tensor:
    """``low <= x <= high`` (``inf`` and ``0`` from an overflowing ``exp`` fall outside)."""
    return (x >= low) & (x <= high)


def _finish(
    weights: Tensor, keep: Tensor, corrected: Tensor, loss: Tensor, truncated: int | None
) -> CorrectionOut:
    """Package weights and keep mask (bools ``[B, T]``) with their counts."""
    kc = corrected & keep  # [B, T]
    rows = loss.any(-1)  # [B]
    stats = CorrectionStats(
        corrected=int(corrected.sum()),
        kept_corrected=int(kc.sum()),
        weight_sum=float(weights[kc].to(torch.float64).sum()),
        truncated=truncated,
        loss_tokens=int(loss.sum()),
        masked_tokens=int((loss & ~keep).sum()),
        sequences=int(rows.sum()),
        dropped_sequences=int((rows & ~(keep & loss).any(-1)).sum()),
    )
    return CorrectionOut(weights=weights.detach(), keep_mask=keep, stats=stats)


class _Method:
    """The common part of :meth:`Correction.weights`: the masks as bools, the applied tokens on the loss."""

    def weights(
        self, logp_old: Tensor, logp_sampler: Tensor, apply_mask: Tensor, loss_mask: Tensor
    ) -> CorrectionOut:
        loss = loss_mask.bool()  # [B, T]
        return self._weights(logp_old.detach(), logp_sampler.detach(), apply_mask.bool() & loss, loss)

    def _weights(self, logp_old: Tensor, logp_sampler: Tensor, apply: Tensor, loss: Tensor) -> CorrectionOut:
        raise NotImplementedError


@dataclass(frozen=True)
class TokenTIS(_Method):
    """Token-level truncated IS: ``w_t = min(r_t, cap)`` on applied tokens, 1 elsewhere; keeps all."""

    cap: float

    def _weights(self, logp_old: Tensor, logp_sampler: Tensor, apply: Tensor, loss: Tensor) -> CorrectionOut:
        w = truncated_is_weights(logp_old, logp_sampler, apply, self.cap)  # [B, T]
        raw = torch.exp(logp_old - logp_sampler)  # [B, T]
        return _finish(w, loss, apply, loss, int((raw[apply] > self.cap).sum()))


@dataclass(frozen=True)
class SequenceTIS(_Method):
    """Sequence-level truncated IS: ``w = min(prod_t r_t, cap)`` per row, on all its loss tokens."""

    cap: float

    def _weights(self, logp_old: Tensor, logp_sampler: Tensor, apply: Tensor, loss: Tensor) -> CorrectionOut:
        log_seq = _log_ratio(logp_old, logp_sampler, apply).sum(-1)  # [B]
        w_row = torch.exp(log_seq).clamp(max=self.cap)  # [B]
        w = torch.where(loss, w_row.unsqueeze(-1).to(torch.float32), 1.0)  # [B, T]
        corrected = loss & apply.any(-1, keepdim=True)  # [B, T]
        cut = (log_seq > math.log(self.cap)).unsqueeze(-1)  # [B, 1]
        return _finish(w, loss, corrected, loss, int((corrected & cut).sum()))


@dataclass(frozen=True)
class _Bounded(_Method):
    """A masking method: ratios outside ``[low, high]`` are dropped (``0 < low < 1 < high``)."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not 0 < self.low < 1 < self.high:
            raise ValueError(
                f"the masking bounds need 0 < low < 1 < high, got low={self.low}, high={self.high}"
            )


@dataclass(frozen=True)
class TokenMIS(_Bounded):
    """Token-level masked IS: drop applied tokens with ``r_t`` outside ``[low, high]``, weight the rest ``r_t``."""

    def _weights(self, logp_old: Tensor, logp_sampler: Tensor, apply: Tensor, loss: Tensor) -> CorrectionOut:
        r = torch.exp(_log_ratio(logp_old, logp_sampler, apply))  # [B, T], 1 off the applied tokens
        keep = loss & (~apply | _inside(r, self.low, self.high))  # [B, T]
        w = torch.where(keep, r, torch.zeros_like(r)).to(torch.float32)  # [B, T]
        return _finish(torch.where(loss, w, 1.0), keep, apply, loss, None)


@dataclass(frozen=True)
class _RowRejection(_Bounded):
    """Keep the rows whose statistic (:meth:`_rows`) is inside ``[low, high]``, with its row weight."""

    def _rows(self, log_r: Tensor, apply: Tensor) -> tuple[Tensor, Tensor]:
        """``[B]`` statistic and ``[B]`` weight of each row from its ``[B, T]`` applied log-ratios."""
        raise NotImplementedError

    def _weights(self, logp_old: Tensor, logp_sampler: Tensor, apply: Tensor, loss: Tensor) -> CorrectionOut:
        stat, w_row = self._rows(_log_ratio(logp_old, logp_sampler, apply), apply)  # [B], [B]
        keep_row = _inside(stat, self.low, self.high)  # [B]
        w = torch.where(keep_row, w_row, torch.zeros_like(w_row)).unsqueeze(-1)  # [B, 1]
        w = torch.where(loss, w.to(torch.float32), 1.0)  # [B, T]
        corrected = loss & apply.any(-1, keepdim=True)  # [B, T]
        return _finish(w, loss & keep_row.unsqueeze(-1), corrected, loss, None)


@dataclass(frozen=True)
class SequenceMIS(_RowRejection):
    """Sequence-level masked IS: drop rows with ``prod_t r_t`` outside ``[low, high]``, weight the rest by it."""

    def _rows(self, log_r: Tensor, apply: Tensor) -> tuple[Tensor, Tensor]:
        r = torch.exp(log_r.sum(-1))  # [B], 1 without applied tokens
        return r, r


@dataclass(frozen=True)
class GeometricRejection(_RowRejection):
    """Drop rows whose geometric-mean ratio ``exp(mean_t log r_t)`` over applied tokens is outside
    ``[low, high]``; kept rows weight 1 (rejection only)."""

    def _rows(self, log_r: Tensor, apply: Tensor) -> tuple[Tensor, Tensor]:
        g = torch.exp(log_r.sum(-1) / apply.sum(-1).clamp(min=1))  # [B], 1 without applied tokens
        return g, torch.ones_like(g)


METHODS: Mapping[str, Callable[[Any], Correction]] = {
    "tis": lambda c: TokenTIS(c.cap),
    "seq_tis": lambda c: SequenceTIS(c.cap),
    "mis": lambda c: TokenMIS(c.low, c.high),
    "seq_mis": lambda c: SequenceMIS(c.low, c.high),
    "geo_reject": lambda c: GeometricRejection(c.low, c.high),
}
"""``[correction] type`` -> builder(section) of its correction."""


def build_correction(section: Any) -> Correction | None:
    """The correction of a ``[correction]`` section (``llds_trainer.config``); ``None`` for ``type = "none"``."""
    if section.type == "none":
        return None
    if section.type not in METHODS:
        raise ValueError(f"unknown correction type {section.type!r}")
    return METHODS[section.type](section)


RATIO_QUANTILES = (0.01, 0.5, 0.99)
"""Quantiles of the ratio logged per staleness bucket."""
RATIO_QUANTILE_KEYS: Mapping[int, tuple[str, str, str]] = {
    0: (K.IS_RATIO_P1_STALE0, K.IS_RATIO_P50_STALE0, K.IS_RATIO_P99_STALE0),
    1: (K.IS_RATIO_P1_STALE1, K.IS_RATIO_P50_STALE1, K.IS_RATIO_P99_STALE1),
    2: (K.IS_RATIO_P1_STALE2PLUS, K.IS_RATIO_P50_STALE2PLUS, K.IS_RATIO_P99_STALE2PLUS),
}
"""Step-record keys of the :data:`RATIO_QUANTILES` of each staleness bucket: 0 (the trainer's version,
or newer), 1, and 2 or more versions behind."""


def ratio_quantiles(log_ratio: Tensor, staleness: Tensor) -> dict[str, float | None]:
    """Quantiles of the ratio ``pi_old / sampler`` per staleness bucket, keyed by step-record key.

    A quantile is ``exp`` of the log-ratio's quantile (linear interpolation between order statistics,
    ``torch.quantile``'s default), so an overflowing ratio cannot turn it into NaN.

    Args:
        log_ratio: ``[N]`` ``logp_old - logp_sampler`` of the step's loss tokens.
        staleness: ``[N]`` trainer version minus the version that sampled each token.

    Returns:
        Every key of :data:`RATIO_QUANTILE_KEYS`; None where the bucket has no token.
    """
    bucket = staleness.clamp(min=0, max=2)  # [N]
    lr = log_ratio.detach().to(torch.float64)  # [N]
    qs = torch.tensor(RATIO_QUANTILES, dtype=torch.float64, device=lr.device)  # [3]
    out: dict[str, float | None] = {}
    for b, keys in RATIO_QUANTILE_KEYS.items():
        x = lr[bucket == b]  # [n_b]
        vals = torch.exp(torch.quantile(x, qs)).tolist() if x.numel() else [None] * len(keys)
        out.update(zip(keys, vals, strict=True))
    return out
