"""The micro-batch objective as objects chosen by config: the policy loss and regulariser come from
their registries, a new variant plugs in without the step knowing its name, the stats add up by name,
and the step itself never branches on a loss or regulariser name."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from llds_trainer import objective as O
from llds_trainer.config import TrainerConfig
from llds_trainer.loss import LLDSDetails, gspo_loss, ppo_clip_loss


def _inputs(seed: int = 0, **kw: Any) -> O.MicroInputs:
    g = torch.Generator().manual_seed(seed)
    B, T = 3, 6
    old = -torch.rand(B, T, generator=g)
    new = (old + 0.1 * torch.randn(B, T, generator=g)).requires_grad_()
    mask = torch.ones(B, T)
    mask[0, :2] = 0
    return O.MicroInputs(new, old, torch.tensor([1.0, -0.5, 0.0]), mask, torch.zeros(B, T), **kw)


@pytest.mark.parametrize("name", ["ppo", "gspo"])
def test_the_configured_policy_loss_is_the_objective_without_terms(name: str) -> None:
    cfg = TrainerConfig(policy_loss={"type": name, "clip_eps_high": 0.28}, regularizer="none")
    obj = O.Objective.from_config(cfg, None)
    x = _inputs()
    loss, stats, r_max = obj(x, None)
    if name == "ppo":
        want, st = ppo_clip_loss(
            x.logp_new, x.logp_old, x.advantages, x.loss_mask, clip_eps=0.2, clip_eps_high=0.28
        )
    else:
        want, st = gspo_loss(x.logp_new, x.logp_old, x.advantages, x.loss_mask, clip_eps=cfg.policy_loss.clip_eps,
                             clip_eps_high=0.28)  # fmt: skip
    assert torch.equal(loss, want) and r_max == st.ratio_max
    assert (stats.micro, stats.pg, stats.total, stats.llds_n, stats.kl_n, stats.ent_n) == (
        1,
        float(want),
        float(want),
        0,
        0,
        0,
    )


def test_terms_add_in_order_and_dropped_tokens_leave_the_policy_kl_and_entropy() -> None:
    cfg = TrainerConfig(regularizer={"coef": 0.5}, kl_coef=0.1, entropy_coef=0.01)
    obj = O.Objective.from_config(cfg, O.configured_lambda(cfg))
    keep = torch.ones(3, 6)
    keep[1, 3:] = 0
    ent = torch.rand(3, 6)
    x = _inputs(1, entropy=ent, logp_ref=-torch.rand(3, 6), keep_mask=keep)
    loss, stats, _ = obj(x, None)
    masked = x.loss_mask * keep
    pg, _ = ppo_clip_loss(x.logp_new, x.logp_old, x.advantages, masked)
    assert stats.pg == float(pg.detach()) and stats.kl_n == stats.ent_n == stats.llds_n == 1
    # entropy aggregated over the kept tokens only
    assert stats.ent == pytest.approx(float((ent * masked).sum() / masked.sum()))
    assert float(loss) == pytest.approx(stats.pg + 0.1 * stats.kl - 0.01 * stats.ent + stats.llds)


def test_a_new_regulariser_plugs_in_through_its_registry_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []

    class Squares:
        def __init__(self, lam: float) -> None:
            self.lam = lam

        def __call__(self, x: O.MicroInputs, answer_weight: float | None) -> LLDSDetails:
            seen.append(self.lam)
            term = self.lam * ((x.logp_new - x.logp_old) ** 2 * x.loss_mask).sum()
            return LLDSDetails(term=term, penalty=term, gated_units=1, total_units=2)

    monkeypatch.setitem(O.REGULARIZERS, "llds", lambda cfg, lam: Squares(lam))
    obj = O.Objective.from_config(TrainerConfig(regularizer={"type": "llds", "coef": 0.3}), 0.3)
    _, stats, _ = obj(_inputs(), None)
    assert seen == [0.3] and (stats.gated, stats.gate_units) == (1, 2) and stats.llds > 0
    # no lambda (regularizer none, no alarm): no regulariser at all
    assert isinstance(
        O.Objective.from_config(TrainerConfig(regularizer="none"), None).regularizer, O.NoRegularizer
    )


def test_micro_stats_add_up_by_name() -> None:
    a = O.MicroStats(micro=1, pg=0.5, gated=2, train_tokens=10)
    a.add(O.MicroStats(micro=1, pg=0.25, gated=1, train_tokens=5, kl=0.1, kl_n=1))
    assert (
        a.as_dict() | {} == O.MicroStats(micro=2, pg=0.75, gated=3, train_tokens=15, kl=0.1, kl_n=1).as_dict()
    )


def test_the_step_never_branches_on_a_loss_or_regulariser_name() -> None:
    core = (Path(O.__file__).parent / "core.py").read_text()
    assert not re.search(r"cfg\.(policy_loss|regularizer)\s*[=!]=", core)
    assert not re.search(r"[\"'](gspo|ppo)[\"']", core)
