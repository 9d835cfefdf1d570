"""One RL step with the KL and entropy terms on: every logged part recomputed independently.

With one mini-batch of one micro-batch, the only forward pass of the update runs before any weight
changes, so pi_theta = pi_old: the PPO ratio is 1 (policy loss = -mean advantage over loss tokens),
LLDS is 0, and the KL and entropy are those of the initial policy, which the test computes with a
plain forward pass over the whole sequence (no trainer code).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

from llds_proto import steplog
from llds_trainer.config import TrainerConfig
from llds_trainer.core import Trainer
from llds_trainer.loss import low_var_kl
from llds_trainer.synthetic import synthetic_groups

KL, ENT = 0.05, 0.01


def test_k3_direction_and_clamp_by_hand() -> None:
    logp = torch.tensor([[-1.0, -2.0, -0.5]])  # [B, T]
    ref = torch.tensor([[-2.0, -1.0, -0.5]])
    # d = ref - logp = [-1, 1, 0]; k3 = exp(d) - d - 1 = [e^-1, e - 2, 0]; e - 2 = 0.718 clamped at 0.5.
    got = low_var_kl(logp, ref, clamp=0.5)
    assert got.tolist()[0] == pytest.approx([math.exp(-1), 0.5, 0.0])
    assert low_var_kl(logp, ref, clamp=10.0).tolist()[0] == pytest.approx([math.exp(-1), math.e - 2, 0.0])


@pytest.fixture(scope="module")
def ref_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reference model far enough from the policy that KL(pi || ref) != KL(ref || pi) is visible."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
        m.lm_head.weight.mul_(4.0)  # sharper next-token distributions: log-prob gaps of order 1
    out = tmp_path_factory.mktemp("ref")
    m.save_pretrained(out)
    return out


def _per_token(model: Any, traj: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each response token and the entropy of its predictive distribution, ``[R]`` each."""
    ids = torch.tensor([list(traj.prompt_ids) + list(traj.response_ids)])
    with torch.no_grad():
        lp = model(input_ids=ids).logits[0].float().log_softmax(-1)  # [L, V]
    p, n = len(traj.prompt_ids), len(traj.response_ids)
    rows = lp[p - 1 : p - 1 + n]  # response token j is predicted at position p + j - 1
    logp = rows.gather(1, ids[0, p:, None])[:, 0]
    ent = -(rows.exp() * rows).sum(-1)
    return logp, ent


def _cfg(model: Path, ref: Path, **kw: Any) -> TrainerConfig:
    base = dict(model=str(model), reference_model=str(ref), kl_coef=KL, entropy_coef=ENT,
                optimizer={"lr": 1e-3}, minibatches_per_step=1, micro_batch_size=16, correction="none",
                lld={"probe": False}, num_threads=1, seed=1)  # fmt: skip
    base.update(kw)
    return TrainerConfig(**base)


def test_step_with_kl_and_entropy_matches_hand_computation(
    tiny_model_dir: Path, ref_dir: Path, tokenizer: Any
) -> None:
    from transformers import AutoModelForCausalLM

    groups = synthetic_groups(tokenizer, 2, 3, seed=21, think_words=2, doc_words=4)
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    ref = AutoModelForCausalLM.from_pretrained(str(ref_dir))
    adv_tok, k3, k3_reversed, k3_all_tokens, ent = [], [], [], [], []
    for g in groups:
        rewards = [t.reward for t in g.trajectories]
        mu, sd = statistics.mean(rewards), statistics.stdev(rewards)
        for t in g.trajectories:
            a = (t.reward - mu) / (sd + 1e-6)
            lp, h = _per_token(policy, t)
            lr_, _ = _per_token(ref, t)
            d = lr_ - lp  # ref - logp
            k = (torch.exp(d) - d - 1).clamp(-10, 10)
            m = torch.tensor(t.loss_mask, dtype=torch.bool)
            assert (~m).any()  # observation tokens exist, so masking matters
            adv_tok += [a] * int(m.sum())
            k3 += k[m].tolist()
            k3_reversed += (torch.exp(-d) + d - 1).clamp(-10, 10)[m].tolist()
            k3_all_tokens += k.tolist()
            ent += h[m].tolist()
    want_policy = -statistics.mean(adv_tok)
    want_kl, want_ent = statistics.mean(k3), statistics.mean(ent)
    # The checks below (rel 1e-4) can tell the right KL from its mirror image and from an unmasked mean.
    assert abs(statistics.mean(k3_reversed) - want_kl) > 1e-2 * want_kl
    assert abs(statistics.mean(k3_all_tokens) - want_kl) > 1e-2 * want_kl

    rec = Trainer(_cfg(tiny_model_dir, ref_dir)).train_step(groups)
    assert set(rec) <= steplog.KEYS, sorted(set(rec) - steplog.KEYS)  # every key has its constant
    assert rec["actor/updates"] == 1
    assert rec["loss/llds"] == 0.0
    assert rec["loss/policy"] == pytest.approx(want_policy, abs=1e-5)
    assert rec["loss/kl"] == pytest.approx(want_kl, rel=1e-4)
    assert rec["loss/entropy"] == pytest.approx(want_ent, rel=1e-4)
    assert rec["actor/entropy"] == pytest.approx(want_ent, rel=1e-4)
    assert rec["loss/total"] == pytest.approx(want_policy + KL * want_kl - ENT * want_ent, rel=1e-4, abs=1e-6)
    # The entropy bonus lowers the loss; the KL penalty raises it.
    no_bonus = Trainer(_cfg(tiny_model_dir, ref_dir, entropy_coef=0.0)).train_step(groups)
    assert no_bonus["loss/entropy"] is None
    assert no_bonus["loss/total"] - rec["loss/total"] == pytest.approx(ENT * want_ent, rel=1e-3)


def test_total_is_the_signed_sum_of_its_logged_parts_over_several_updates(
    tiny_model_dir: Path, ref_dir: Path, tokenizer: Any
) -> None:
    groups = synthetic_groups(tokenizer, 2, 3, seed=22, think_words=2, doc_words=4)
    # 2 epochs of 2 mini-batches: every sample is scored again after pi_theta moved, so the LLDS term
    # is non-zero for certain. With one epoch it hung on whether the first update happened to lower
    # a token of the second mini-batch's preserved responses, which Adam's first step (about lr per
    # weight, whatever the gradient's size) decides differently on different CPUs' kernels.
    tr = Trainer(_cfg(tiny_model_dir, ref_dir, minibatches_per_step=2, epochs_per_step=2, micro_batch_size=2,
                      optimizer={"lr": 5e-3}))  # fmt: skip
    rec = tr.train_step(groups)
    assert rec["actor/updates"] == 4 and rec["loss/llds"] > 0
    parts = rec["loss/policy"] + KL * rec["loss/kl"] - ENT * rec["loss/entropy"] + rec["loss/llds"]
    assert rec["loss/total"] == pytest.approx(parts, rel=1e-6, abs=1e-9)
