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
from llds_trainer.loss import gspo_loss, ppo_clip_loss


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


PLUGIN = '''
"""A regulariser of one module alone: lambda times the squared log-ratio of the loss tokens."""
from typing import Literal

from pydantic import Field

from llds_server.settings import ConfigModel


class Config(ConfigModel):
    type: Literal["square"] = "square"
    """The squared log-ratio."""
    coef: float = Field(default=0.1, ge=0)
    """Its weight."""


class Square:
    def __init__(self, lam):
        self.lam = lam

    def __call__(self, x, answer_weight):
        from llds_trainer.loss import LLDSDetails

        term = self.lam * ((x.logp_new - x.logp_old) ** 2 * x.loss_mask).sum()
        return LLDSDetails(term=term, penalty=term, gated_units=1, total_units=2)


def build(section, lam):
    return Square(lam)
'''

PLUGIN_RUN = """
import sys, tomllib
import torch
from llds_trainer import objective as O, regularizers
from llds_trainer.cli import build_parser
from llds_trainer.config import TrainerConfig
sys.path.insert(0, sys.argv[1])
from test_objective import _inputs

cfg = TrainerConfig.load(sys.argv[2])
assert cfg.regularizer.type == "square" and O.configured_lambda(cfg) == 0.5, cfg.regularizer
obj = O.Objective.from_config(cfg, O.configured_lambda(cfg))
x = _inputs()
_, stats, _ = obj(x, None)
want = 0.5 * float(((x.logp_new - x.logp_old) ** 2 * x.loss_mask).sum())
assert abs(stats.llds - want) < 1e-6 and (stats.gated, stats.gate_units) == (1, 2), stats
help = build_parser().format_help()
assert "square" in help and "--regularizer.coef" in help
print("types", sorted(regularizers.VARIANTS))
"""


def test_a_new_regulariser_is_one_module_of_its_own(tmp_path: Path) -> None:
    """The done-when of the config tree: a regulariser variant is its module (and its test) alone.
    A module dropped into an ``llds_trainer/regularizers`` folder on the path, and nothing else
    touched, is a ``[regularizer] type`` the config validates, the CLI offers and the objective runs."""
    import os
    import subprocess
    import sys

    plugin = tmp_path / "plugins" / "llds_trainer" / "regularizers"
    plugin.mkdir(parents=True)
    (plugin / "square.py").write_text(PLUGIN)
    cfg = tmp_path / "trainer.toml"
    cfg.write_text('[regularizer]\ntype = "square"\ncoef = 0.5\n')
    env = dict(os.environ)
    # The installed llds_trainer ahead of the plugin folder: with an editable install the package is not
    # on sys.path, and the plugin's llds_trainer/ (no __init__.py) would be taken for a namespace package.
    import llds_trainer

    src = str(Path(llds_trainer.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(
        [src, str(tmp_path / "plugins"), *filter(None, [env.get("PYTHONPATH")])]
    )
    run = subprocess.run([sys.executable, "-c", PLUGIN_RUN, str(Path(__file__).parent), str(cfg)], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "types ['llds', 'none', 'square']" in run.stdout
    # without the module on the path the same file is refused, naming the choices
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    bad = subprocess.run([sys.executable, "-c", PLUGIN_RUN, str(Path(__file__).parent), str(cfg)], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode != 0 and "square" in bad.stderr and "llds" in bad.stderr


def test_no_lambda_means_no_regulariser_and_the_default_is_llds() -> None:
    from llds_trainer.regularizers import NoRegularizer
    from llds_trainer.regularizers.llds import LLDSRegularizer

    assert isinstance(
        O.Objective.from_config(TrainerConfig(regularizer="none"), None).regularizer, NoRegularizer
    )
    obj = O.Objective.from_config(TrainerConfig(), 0.3)
    assert isinstance(obj.regularizer, LLDSRegularizer) and obj.regularizer.lam == 0.3


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
