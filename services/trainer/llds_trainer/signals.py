"""The step's likelihood-displacement signals (the spec's section 5): pure functions of the samples
and the per-sample, response-aligned log-probs the scoring passes produced; nothing here touches a
model."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from llds_proto import steplog as K
from llds_trainer.batch import Sample


def mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def lld_signals(
    samples: list[Sample], old: list[Tensor], ent: list[Tensor] | None, after: list[Tensor] | None
) -> dict[str, float | None]:
    """Spec section 5 signals on correct responses (log-probs under pi_old, displacement after the step;
    ``after`` is read on correct responses alone)."""
    corr_tok, corr_n, corr_resp = 0.0, 0, []
    inc_tok, inc_n = 0.0, 0
    first_lp, first_n, later_lp, later_n = 0.0, 0, 0.0, 0
    disp: list[float] = []
    act_fell, act_n = 0, 0
    first_d, first_dn, later_d, later_dn = 0.0, 0, 0.0, 0
    ent_sum, ent_n = 0.0, 0
    for i, s in enumerate(samples):
        m = torch.tensor(s.loss_mask, dtype=torch.bool)
        if not m.any():
            continue
        lp = old[i]
        if ent is not None:
            ent_sum += float(ent[i][m].sum())
            ent_n += int(m.sum())
        if not s.correct:
            inc_tok += float(lp[m].sum())
            inc_n += int(m.sum())
            continue
        corr_tok += float(lp[m].sum())
        corr_n += int(m.sum())
        corr_resp.append(float(lp[m].sum()))
        runs = runs_of(s.loss_mask)
        a0, e0 = runs[0]
        first_lp += float(lp[a0:e0].sum())
        first_n += e0 - a0
        for a, e in runs[1:]:
            later_lp += float(lp[a:e].sum())
            later_n += e - a
        if after is not None:
            d = after[i] - lp
            disp.append(float(d[m].sum()))
            for k, (a, e) in enumerate(runs):
                da = float(d[a:e].sum())
                act_fell += int(da < 0)
                act_n += 1
                if k == 0:
                    first_d, first_dn = first_d + da, first_dn + (e - a)
                else:
                    later_d, later_dn = later_d + da, later_dn + (e - a)
    c_tok = corr_tok / corr_n if corr_n else None
    i_tok = inc_tok / inc_n if inc_n else None
    return {
        K.LLD_N_CORRECT: float(len(corr_resp)),
        K.LLD_CORRECT_LOGP_TOKEN: c_tok,
        K.LLD_CORRECT_LOGP_RESPONSE: mean(corr_resp),
        K.LLD_INCORRECT_LOGP_TOKEN: i_tok,
        K.LLD_CORRECT_INCORRECT_GAP: c_tok - i_tok if c_tok is not None and i_tok is not None else None,
        K.LLD_FIRST_ACTION_LOGP: first_lp / first_n if first_n else None,
        K.LLD_LATER_ACTION_LOGP: later_lp / later_n if later_n else None,
        K.LLD_DISPLACEMENT_MEAN: mean(disp),
        K.LLD_FELL_FRACTION_RESPONSES: sum(1 for x in disp if x < 0) / len(disp) if disp else None,
        K.LLD_FELL_FRACTION_ACTIONS: act_fell / act_n if act_n else None,
        K.LLD_FIRST_ACTION_DISPLACEMENT: first_d / first_dn if first_dn else None,
        K.LLD_LATER_ACTION_DISPLACEMENT: later_d / later_dn if later_dn else None,
        K.ACTOR_ENTROPY: ent_sum / ent_n if ent_n else None,
    }


def runs_of(mask: Sequence[int]) -> list[tuple[int, int]]:
    """Maximal runs of 1s in ``mask`` as half-open spans."""
    out: list[tuple[int, int]] = []
    start = None
    for j, m in enumerate(mask):
        if m and start is None:
            start = j
        elif not m and start is not None:
            out.append((start, j))
            start = None
    if start is not None:
        out.append((start, len(mask)))
    return out
