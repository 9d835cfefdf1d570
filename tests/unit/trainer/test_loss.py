"""The loss functions against hand-computed numbers, the spec's worked example and a loop reference."""

from __future__ import annotations

import math
import random

import pytest
import torch

from llds_trainer.loss import (
    action_ids,
    aggregate,
    answer_weight,
    grpo_advantages,
    gspo_loss,
    llds_details,
    llds_term,
    low_var_kl,
    ppo_clip_loss,
    token_logprobs,
    truncated_is_weights,
)

# The worked example of llds.md section 4 ("x" positions are off the loss mask: any value).
MASK = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 1]])
OLD = torch.full((1, 8), -1.0)
NEW = torch.tensor([[-1.5, -0.9, -1.0, 7.0, -3.0, -1.2, -1.1, -0.5]])


@pytest.mark.parametrize(
    ("gate", "expected"), [("action", 0.2 * 0.5 / 6), ("response", 0.2 * 0.8 / 6), ("token", 0.2 * 0.8 / 6)]
)
def test_worked_example_every_gate(gate: str, expected: float) -> None:
    term = llds_term(NEW, OLD, torch.tensor([0.5]), MASK, gate=gate, lam=0.2)  # type: ignore[arg-type]
    assert term.item() == pytest.approx(expected, abs=1e-6)


def test_worked_example_numbers_as_printed() -> None:
    a = llds_term(NEW, OLD, torch.tensor([0.0]), MASK, gate="action").item()
    r = llds_term(NEW, OLD, torch.tensor([0.0]), MASK, gate="response").item()
    assert round(a, 6) == 0.016667
    assert round(r, 6) == 0.026667


@pytest.mark.parametrize("gate", ["action", "response", "token"])
def test_negative_advantage_gives_zero(gate: str) -> None:
    term = llds_term(NEW, OLD, torch.tensor([-0.1]), MASK, gate=gate)  # type: ignore[arg-type]
    assert term.item() == 0.0


def test_action_gate_statistics() -> None:
    d = llds_details(NEW, OLD, torch.tensor([1.0]), MASK, gate="action")
    assert (d.gated_units, d.total_units) == (1, 2)
    assert d.penalty[0].tolist() == pytest.approx([0.1, 0, 0, 0, 0, 0, 0, 0])


def test_answer_weight_applies_on_answer_span_and_is_capped() -> None:
    # Tokens 5-7 gated under the token gate: deltas 0.2, 0.1 there; answer span = tokens 5, 6.
    ans = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 0]])
    t = llds_term(NEW, OLD, torch.tensor([1.0]), MASK, gate="token", answer_mask=ans, answer_weight=0.05)
    assert t.item() == pytest.approx((0.2 * 0.5 + 0.05 * (0.2 + 0.1)) / 6, abs=1e-7)
    capped = llds_term(NEW, OLD, torch.tensor([1.0]), MASK, gate="token", answer_mask=ans, answer_weight=9.0)
    assert capped.item() == pytest.approx(0.2 * 0.8 / 6, abs=1e-7)


def test_paper_normalisation_averages_per_preserving_response() -> None:
    new = torch.cat([NEW, NEW, NEW])  # [3, 8]
    mask = torch.cat([MASK, MASK, torch.tensor([[1, 1, 0, 0, 0, 0, 0, 0]])])
    adv = torch.tensor([1.0, -1.0, 0.0])
    # Row 0: 0.2*0.5/6. Row 1: negative. Row 2: two loss tokens, one action with sum 0.4 > 0: 0.2*0.5/2.
    t = llds_term(new, OLD.expand(3, 8), adv, mask, gate="action", normalize="paper")
    assert t.item() == pytest.approx((0.2 * 0.5 / 6 + 0.2 * 0.5 / 2) / 2, abs=1e-7)
    tok = llds_term(new, OLD.expand(3, 8), adv, mask, gate="action", normalize="token")
    assert tok.item() == pytest.approx((0.2 * 0.5 + 0.2 * 0.5) / 14, abs=1e-7)


def test_answer_weight_modes() -> None:
    assert answer_weight("off", 0.2, 0.2, 3.0) is None
    assert answer_weight("fixed", 0.2, 0.05, 1.0) == pytest.approx(0.05)
    assert answer_weight("fixed", 0.2, 0.5, 1.0) == pytest.approx(0.2)
    assert answer_weight("adaptive_code", 0.2, 0.2, 1.0) == 0.0
    assert answer_weight("adaptive_code", 0.2, 0.2, 1.5) == pytest.approx(0.1)
    assert answer_weight("adaptive_code", 0.2, 0.2, 4.0) == pytest.approx(0.2)
    assert answer_weight("adaptive_paper", 0.2, 0.2, 1.0) == pytest.approx(0.1)
    assert answer_weight("adaptive_paper", 0.2, 0.2, 3.0) == pytest.approx(0.2)


def _loop_llds(new, old, adv, mask, gate, lam, ans, w_ans, normalize):  # type: ignore[no-untyped-def]
    """Straightforward reference: Python loops over rows, runs and tokens."""
    B, T = mask.shape
    total_tokens = sum(int(mask[b, t]) for b in range(B) for t in range(T))
    per_row = []
    grand = 0.0
    for b in range(B):
        n_b = sum(int(mask[b, t]) for t in range(T))
        row_pen = 0.0
        if adv[b] >= 0 and n_b:
            delta = [float(old[b, t] - new[b, t]) if mask[b, t] else 0.0 for t in range(T)]
            units: list[list[int]] = []
            if gate == "token":
                units = [[t] for t in range(T) if mask[b, t]]
            elif gate == "response":
                units = [[t for t in range(T) if mask[b, t]]]
            else:
                cur: list[int] = []
                for t in range(T):
                    if mask[b, t]:
                        cur.append(t)
                    elif cur:
                        units.append(cur)
                        cur = []
                if cur:
                    units.append(cur)
            for u in units:
                if sum(delta[t] for t in u) > 0:
                    for t in u:
                        if delta[t] > 0:
                            w = lam
                            if ans is not None and w_ans is not None and ans[b, t]:
                                w = min(w_ans, lam)
                            row_pen += w * delta[t]
            per_row.append(row_pen / n_b)
        grand += row_pen
    if normalize == "token":
        return grand / max(total_tokens, 1)
    return sum(per_row) / max(len(per_row), 1)


@pytest.mark.parametrize("seed", range(12))
def test_randomised_against_loop_reference(seed: int) -> None:
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    B, T = rng.randint(1, 6), rng.randint(1, 30)
    mask = (torch.rand(B, T, generator=g) < rng.uniform(0.3, 0.9)).long()
    old = -torch.rand(B, T, generator=g) * 3
    new = old + torch.randn(B, T, generator=g) * 0.3
    adv = torch.randn(B, generator=g)
    adv[rng.randrange(B)] = 0.0
    ans = (torch.rand(B, T, generator=g) < 0.2).long()
    for gate in ("action", "response", "token"):
        for normalize in ("token", "paper"):
            for a, w in ((None, None), (ans, rng.uniform(0, 0.4))):
                got = llds_term(
                    new,
                    old,
                    adv,
                    mask,
                    gate=gate,
                    lam=0.3,
                    answer_mask=a,
                    answer_weight=w,
                    normalize=normalize,
                )  # type: ignore[arg-type]
                want = _loop_llds(new, old, adv, mask, gate, 0.3, a, w, normalize)
                assert got.item() == pytest.approx(want, rel=1e-5, abs=1e-7), (gate, normalize, w)


def test_gradient_only_on_penalised_tokens_of_preserving_responses() -> None:
    new = torch.cat([NEW, NEW]).clone().requires_grad_(True)  # [2, 8]
    adv = torch.tensor([1.0, -1.0])
    llds_term(new, OLD.expand(2, 8), adv, torch.cat([MASK, MASK]), gate="action").backward()
    grad = new.grad
    assert grad is not None
    # d/d logp_new of lam * (old - new) / 12 = -lam / 12 on the one penalised token, 0 elsewhere.
    expected = torch.zeros(2, 8)
    expected[0, 0] = -0.2 / 12
    assert torch.allclose(grad, expected, atol=1e-8)


def test_old_logprobs_get_no_gradient() -> None:
    old = OLD.clone().requires_grad_(True)
    new = NEW.clone().requires_grad_(True)
    llds_term(new, old, torch.tensor([1.0]), MASK, gate="token").backward()
    assert old.grad is None or torch.all(old.grad == 0)


def test_action_ids_number_maximal_runs() -> None:
    ids = action_ids(torch.tensor([[0, 1, 1, 0, 1, 0, 0, 1], [1, 1, 1, 1, 0, 0, 0, 0]]))
    assert ids.tolist() == [[0, 1, 1, 0, 2, 0, 0, 3], [1, 1, 1, 1, 0, 0, 0, 0]]


def test_grpo_advantages_hand_computed() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    adv = grpo_advantages(rewards, groups)
    std = math.sqrt(4 * 0.25 / 3)  # unbiased std of [1, 0, 0, 1]
    assert adv[:4].tolist() == pytest.approx(
        [0.5 / (std + 1e-6), -0.5 / (std + 1e-6)] * 1 + [-0.5 / (std + 1e-6), 0.5 / (std + 1e-6)], rel=1e-6
    )
    assert adv[4:6].tolist() == [0.0, 0.0]  # equal rewards
    assert adv[6].item() == pytest.approx(0.5 / (1 + 1e-6))  # single sample: mean 0, std 1


def test_ppo_clip_hand_computed() -> None:
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    new = torch.log(torch.tensor([[0.75, 0.55, 0.25]]))  # ratios 1.5, 1.1, 0.5
    mask = torch.tensor([[1, 1, 1]])
    loss, stats = ppo_clip_loss(new, old, torch.tensor([2.0]), mask, clip_eps=0.2)
    # A > 0: per token -A * min(r, clip(r)) = -2 * [1.2, 1.1, 0.5]
    assert loss.item() == pytest.approx(-2 * (1.2 + 1.1 + 0.5) / 3, rel=1e-6)
    assert stats.clip_frac == pytest.approx(1 / 3)
    assert stats.ratio_max == pytest.approx(1.5, rel=1e-6)
    neg, _ = ppo_clip_loss(new, old, torch.tensor([-1.0]), mask, clip_eps=0.2)
    # A < 0: per token max(r, clip(r)) = [1.5, 1.1, 0.8]
    assert neg.item() == pytest.approx((1.5 + 1.1 + 0.8) / 3, rel=1e-6)
    w = torch.tensor([[1.0, 2.0, 0.5]])
    weighted, _ = ppo_clip_loss(new, old, torch.tensor([-1.0]), mask, is_weights=w)
    assert weighted.item() == pytest.approx((1.5 + 2.2 + 0.4) / 3, rel=1e-6)


def test_dual_clip_bounds_only_negative_advantage_tokens_hand_computed() -> None:
    old = torch.log(torch.tensor([[0.1, 0.1, 0.1, 0.1]]))
    new = torch.log(torch.tensor([[0.5, 0.25, 0.1, 0.05]]))  # ratios 5, 2.5, 1, 0.5
    mask = torch.tensor([[1, 1, 1, 1]])
    loss, stats = ppo_clip_loss(new, old, torch.tensor([-2.0]), mask, clip_eps=0.2, dual_clip_c=3.0)
    # A = -2: PPO per token -A * max(r, clip(r)) = 2 * [5, 2.5, 1, 0.8]; the dual clip caps it at
    # -A * c = 6: [6, 5, 2, 1.6]; only the first token hits the bound
    assert loss.item() == pytest.approx((6 + 5 + 2 + 1.6) / 4, rel=1e-6)
    assert stats.dual_clip_frac == pytest.approx(1 / 4)
    plain, plain_stats = ppo_clip_loss(new, old, torch.tensor([-2.0]), mask, clip_eps=0.2)
    assert plain.item() == pytest.approx((10 + 5 + 2 + 1.6) / 4, rel=1e-6)
    assert plain_stats.dual_clip_frac == 0.0
    # positive advantage: untouched by the dual clip (its ratio is already capped by 1 + eps)
    pos, pos_stats = ppo_clip_loss(new, old, torch.tensor([1.0]), mask, clip_eps=0.2, dual_clip_c=3.0)
    assert pos.item() == pytest.approx(-(1.2 + 1.2 + 1.0 + 0.5) / 4, rel=1e-6)
    assert pos_stats.dual_clip_frac == 0.0
    # the bound's gradient is zero: the exploded token no longer pushes its probability down
    new_p = new.clone().requires_grad_(True)
    ppo_clip_loss(new_p, old, torch.tensor([-2.0]), mask, clip_eps=0.2, dual_clip_c=3.0)[0].backward()
    assert new_p.grad is not None and new_p.grad[0, 0].item() == 0.0 and new_p.grad[0, 1].item() != 0.0
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        ppo_clip_loss(new, old, torch.tensor([-2.0]), mask, dual_clip_c=1.0)


def test_aggregations() -> None:
    v = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
    m = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert aggregate(v, m, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate(v, m, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)


def test_gspo_sequence_ratio() -> None:
    old = torch.zeros(1, 2)
    new = torch.tensor([[0.1, 0.3]])  # sequence ratio exp(0.2)
    loss, stats = gspo_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2), clip_eps=0.5, clip_eps_high=0.5)
    assert loss.item() == pytest.approx(-math.exp(0.2), rel=1e-6)
    assert stats.clip_frac == 0.0
    clipped, stats = gspo_loss(
        new, old, torch.tensor([1.0]), torch.ones(1, 2), clip_eps=3e-4, clip_eps_high=4e-4
    )
    assert clipped.item() == pytest.approx(-(1 + 4e-4), rel=1e-6)
    assert stats.clip_frac == 1.0


def test_low_var_kl_and_is_weights() -> None:
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.0, -1.0]])
    kl = low_var_kl(logp, ref)
    assert kl.tolist()[0] == pytest.approx([0.0, math.exp(1) - 1 - 1], rel=1e-6)
    w = truncated_is_weights(
        torch.tensor([[-1.0, -1.0, -1.0]]),
        torch.tensor([[-2.0, -1.5, -2.0]]),
        torch.tensor([[1, 1, 0]]),
        cap=2.0,
    )
    assert w.tolist()[0] == pytest.approx([2.0, math.exp(0.5), 1.0], rel=1e-6)


def test_token_logprobs_matches_log_softmax() -> None:
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[1, 2, 3], [10, 0, 5]])
    want = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets), want, atol=1e-6)
