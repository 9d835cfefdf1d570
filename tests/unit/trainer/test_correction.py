"""The off-policy corrections against hand-computed values, their builder and validation, the LLDS
term on dropped tokens, and one trainer step per method."""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from test_core import _cfg

from llds_proto import steplog as K
from llds_trainer.batch import samples_from_groups
from llds_trainer.config import TrainerConfig
from llds_trainer.core import Trainer
from llds_trainer.correction import (
    RATIO_QUANTILE_KEYS,
    GeometricRejection,
    SequenceMIS,
    SequenceTIS,
    TokenMIS,
    TokenTIS,
    apply_mask,
    build_correction,
    ratio_quantiles,
)
from llds_trainer.loss import llds_details
from llds_trainer.synthetic import synthetic_groups

# Three trajectories, the ratios r = pi_old / sampler of their tokens; row 0's last position is padding.
RATIOS = [[2.0, 0.5, 1.25, 1.0], [1.5, 3.0, 0.8, 1.0], [1.2, 1.2, 1.2, 1.2]]
LOSS = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.float32)
OLD = torch.full((3, 4), -1.0)
SAMPLER = OLD - torch.log(torch.tensor(RATIOS))  # logp_old - logp_sampler = log r
ALL = LOSS.bool()
# 11 loss tokens, 3 sequences.


def _check(out: Any, weights: list[list[float]], keep: list[list[int]]) -> None:
    assert out.weights.tolist() == [pytest.approx(row, rel=1e-6) for row in weights]
    assert out.keep_mask.tolist() == [[bool(k) for k in row] for row in keep]
    assert out.weights.dtype == torch.float32 and not out.weights.requires_grad


def test_token_tis_by_hand() -> None:
    out = TokenTIS(cap=1.8).weights(OLD, SAMPLER, ALL, LOSS)
    # min(r, 1.8) per token; the padding position keeps weight 1 (and is off the keep mask).
    _check(out, [[1.8, 0.5, 1.25, 1.0], [1.5, 1.8, 0.8, 1.0], [1.2] * 4], [[1, 1, 1, 0], [1] * 4, [1] * 4])
    st = out.stats
    assert (st.corrected, st.kept_corrected, st.truncated) == (11, 11, 2)  # r = 2.0 and r = 3.0 truncated
    # 1.8 + 0.5 + 1.25 + 1.5 + 1.8 + 0.8 + 1.0 + 4 * 1.2 = 13.45
    assert st.weight_sum == pytest.approx(13.45, rel=1e-6)
    assert (st.loss_tokens, st.masked_tokens, st.sequences, st.dropped_sequences) == (11, 0, 3, 0)


def test_sequence_tis_by_hand() -> None:
    out = SequenceTIS(cap=3.0).weights(OLD, SAMPLER, ALL, LOSS)
    # products: 2 * 0.5 * 1.25 = 1.25; 1.5 * 3 * 0.8 * 1 = 3.6 -> cap 3; 1.2^4 = 2.0736
    _check(out, [[1.25, 1.25, 1.25, 1.0], [3.0] * 4, [2.0736] * 4], [[1, 1, 1, 0], [1] * 4, [1] * 4])
    assert out.stats.truncated == 4  # every loss token of row 1
    # 3 * 1.25 + 4 * 3 + 4 * 2.0736 = 24.0444
    assert out.stats.weight_sum == pytest.approx(24.0444, rel=1e-6)
    assert out.stats.masked_tokens == 0


def test_token_mis_by_hand() -> None:
    out = TokenMIS(low=0.6, high=2.5).weights(OLD, SAMPLER, ALL, LOSS)
    # r = 0.5 < 0.6 and r = 3.0 > 2.5 dropped (weight 0, off the keep mask); the rest weighted r.
    _check(
        out, [[2.0, 0.0, 1.25, 1.0], [1.5, 0.0, 0.8, 1.0], [1.2] * 4], [[1, 0, 1, 0], [1, 0, 1, 1], [1] * 4]
    )
    st = out.stats
    assert (st.corrected, st.kept_corrected, st.truncated) == (11, 9, None)
    # 2 + 1.25 + 1.5 + 0.8 + 1 + 4 * 1.2 = 11.35 over the 9 kept tokens
    assert st.weight_sum == pytest.approx(11.35, rel=1e-6)
    assert (st.masked_tokens, st.dropped_sequences) == (2, 0)


def test_sequence_mis_by_hand() -> None:
    out = SequenceMIS(low=0.5, high=2.0).weights(OLD, SAMPLER, ALL, LOSS)
    # products 1.25 (kept, weight 1.25), 3.6 and 2.0736 (> 2: both rows dropped)
    _check(out, [[1.25, 1.25, 1.25, 1.0], [0.0] * 4, [0.0] * 4], [[1, 1, 1, 0], [0] * 4, [0] * 4])
    st = out.stats
    assert (st.kept_corrected, st.weight_sum, st.truncated) == (3, pytest.approx(3.75), None)
    assert (st.masked_tokens, st.dropped_sequences, st.sequences) == (8, 2, 3)


def test_geometric_rejection_by_hand() -> None:
    out = GeometricRejection(low=0.9, high=1.3).weights(OLD, SAMPLER, ALL, LOSS)
    # geometric means: 1.25^(1/3) = 1.0772 (kept), 3.6^(1/4) = 1.3774 (dropped), 1.2 (kept: its
    # product 2.0736 is what seq_mis rejects, the per-token mean is mild); kept rows weight 1.
    assert 1.25 ** (1 / 3) == pytest.approx(1.0772, abs=1e-4) and 3.6**0.25 == pytest.approx(1.3774, abs=1e-4)
    _check(out, [[1.0] * 4, [0.0] * 4, [1.0] * 4], [[1, 1, 1, 0], [0] * 4, [1] * 4])
    assert (out.stats.masked_tokens, out.stats.dropped_sequences, out.stats.weight_sum) == (4, 1, 7.0)


def test_stale_scope_treats_fresh_tokens_as_ratio_one() -> None:
    versions = torch.tensor([[0, 0, 0, -1], [0, 1, 0, 0], [1, 1, 1, 1]])  # trainer at version 1
    apply = apply_mask("stale", LOSS, versions, 1)
    assert apply.tolist() == [[True, True, True, False], [True, False, True, True], [False] * 4]
    assert apply_mask("all", LOSS, versions, 1).tolist() == ALL.tolist()
    assert not apply_mask("off", LOSS, versions, 1).any()
    tis = TokenTIS(cap=1.8).weights(OLD, SAMPLER, apply, LOSS)
    # row 1's r = 3.0 is fresh: weight 1, not truncated; row 2 is all fresh: weights 1.
    _check(tis, [[1.8, 0.5, 1.25, 1.0], [1.5, 1.0, 0.8, 1.0], [1.0] * 4], [[1, 1, 1, 0], [1] * 4, [1] * 4])
    assert (tis.stats.corrected, tis.stats.truncated) == (6, 1)  # 3 + 3 applied tokens
    seq = SequenceTIS(cap=3.0).weights(OLD, SAMPLER, apply, LOSS)
    # row 1: 1.5 * 0.8 * 1 = 1.2 on all of its loss tokens; row 2 has no applied token: 1, uncorrected.
    _check(seq, [[1.25, 1.25, 1.25, 1.0], [1.2] * 4, [1.0] * 4], [[1, 1, 1, 0], [1] * 4, [1] * 4])
    assert seq.stats.corrected == 7
    geo = GeometricRejection(low=0.9, high=1.1).weights(OLD, SAMPLER, apply, LOSS)
    # row 0: 1.25^(1/3) = 1.077; row 1: (1.5 * 0.8 * 1)^(1/3) = 1.2^(1/3) = 1.063; row 2: none, 1.
    assert geo.keep_mask.tolist() == ALL.tolist()
    mis = TokenMIS(low=0.6, high=2.5).weights(OLD, SAMPLER, apply, LOSS)
    # the fresh r = 3.0 stays (weight 1); only r = 0.5 (stale) is dropped
    _check(mis, [[2.0, 0.0, 1.25, 1.0], [1.5, 1.0, 0.8, 1.0], [1.0] * 4], [[1, 0, 1, 0], [1] * 4, [1] * 4])


def test_an_overflowing_ratio_is_dropped_or_capped_not_nan() -> None:
    old, sampler, loss = torch.tensor([[0.0, 0.0]]), torch.tensor([[-900.0, -1.0]]), torch.ones(1, 2)
    # log r = 900 overflows exp even in float64
    mis = TokenMIS(0.5, 2.0).weights(old, sampler, loss.bool(), loss)
    assert mis.keep_mask.tolist() == [[False, False]]  # inf > 2 and e = 2.718 > 2
    seq = SequenceTIS(cap=2.0).weights(old, sampler, loss.bool(), loss)
    assert seq.weights.tolist() == [[2.0, 2.0]] and seq.stats.truncated == 2
    assert SequenceMIS(0.5, 2.0).weights(old, sampler, loss.bool(), loss).stats.dropped_sequences == 1


def _built(correction: Any) -> Any:
    return build_correction(TrainerConfig(correction=correction).correction)


def test_builder_and_validation() -> None:
    assert _built("none") is None
    assert _built({"type": "tis", "cap": 2.0}) == TokenTIS(2.0)
    assert _built({"type": "seq_tis", "tokens": "all", "cap": 3.0}) == SequenceTIS(3.0)
    assert _built({"type": "mis", "low": 0.5, "high": 2.0}) == TokenMIS(0.5, 2.0)
    assert _built({"type": "seq_mis", "low": 0.4}) == SequenceMIS(0.4, 2.0)
    assert _built({"type": "geo_reject", "low": 0.999, "high": 1.001}) == GeometricRejection(0.999, 1.001)
    with pytest.raises(ValueError, match="unknown correction type 'nope'"):
        build_correction(SimpleNamespace(type="nope"))
    for low, high in [(1.0, 2.0), (0.5, 1.0), (0.0, 2.0), (1.5, 2.0)]:
        with pytest.raises(ValueError, match="low < 1 < high"):
            TokenMIS(low, high)
    cfg = TrainerConfig()
    assert cfg.correction.model_dump() == {"type": "tis", "tokens": "stale", "cap": 2.0}  # today's default
    for bad in [{"type": "mis", "low": 1.0}, {"type": "mis", "high": 0.9}, {"type": "seq_mis", "low": 0.0},
                {"type": "geo_reject", "low": 1.2, "high": 1.5}]:  # fmt: skip
        with pytest.raises(ValidationError, match=r"less than 1|greater than 1|greater than 0"):
            TrainerConfig(correction=bad)
    with pytest.raises(ValidationError, match="'token' found using"):
        TrainerConfig(correction="token")
    with pytest.raises(ValidationError, match="cap"):  # a key the chosen method does not have
        TrainerConfig(correction={"type": "mis", "cap": 2.0})


def test_ratio_quantiles_by_hand() -> None:
    log_r = torch.log(torch.tensor([1.0, 2.0, 4.0, 0.5, 3.0, 1 / 3]))
    staleness = torch.tensor([0, -1, 0, 1, 2, 5])  # bucket 0 (<= 0), 1, 2+ (2 and 5)
    q = ratio_quantiles(log_r, staleness)
    # bucket 0: log r = [0, ln 2, ln 4]; linear interpolation at 0.01 * 2 = 0.02 -> 0.02 ln 2, at 1 -> ln 2,
    # at 0.99 * 2 = 1.98 -> ln 2 + 0.98 (ln 4 - ln 2) = 1.98 ln 2
    assert q[K.IS_RATIO_P1_STALE0] == pytest.approx(2**0.02, rel=1e-6)
    assert q[K.IS_RATIO_P50_STALE0] == pytest.approx(2.0, rel=1e-6)
    assert q[K.IS_RATIO_P99_STALE0] == pytest.approx(2**1.98, rel=1e-6)
    # bucket 1: one token, every quantile is its ratio
    assert [q[k] for k in RATIO_QUANTILE_KEYS[1]] == pytest.approx([0.5] * 3, rel=1e-6)
    # bucket 2+: ln 3 and -ln 3; median exp(0) = 1, p1 at 0.01 -> -ln 3 + 0.01 * 2 ln 3 = -0.98 ln 3
    assert q[K.IS_RATIO_P50_STALE2PLUS] == pytest.approx(1.0, abs=1e-6)
    assert q[K.IS_RATIO_P1_STALE2PLUS] == pytest.approx(3**-0.98, rel=1e-6)
    empty = ratio_quantiles(log_r[:3], staleness[:3])
    assert all(empty[k] is None for k in (*RATIO_QUANTILE_KEYS[1], *RATIO_QUANTILE_KEYS[2]))
    assert set(q) == {k for keys in RATIO_QUANTILE_KEYS.values() for k in keys} <= K.KEYS


def test_llds_skips_dropped_tokens_without_splitting_their_action() -> None:
    # One action of three tokens, pi_old = -1: delta = old - new = [0.3, 1.0, -0.5].
    old, new, mask, adv = (
        torch.full((1, 3), -1.0),
        torch.tensor([[-1.3, -2.0, -0.5]]),
        torch.ones(1, 3),
        torch.ones(1),
    )
    full = llds_details(new, old, adv, mask, gate="action", lam=0.2)
    # all kept: action sum 0.8 > 0, tokens with delta > 0 penalised: 0.2 * (0.3 + 1.0) / 3 tokens
    assert full.term.item() == pytest.approx(0.2 * 1.3 / 3, rel=1e-6)
    keep = torch.tensor([[True, False, True]])
    d = llds_details(new, old, adv, mask, gate="action", lam=0.2, keep_mask=keep)
    # token 1 dropped: the action (still one, not two) sums 0.3 - 0.5 = -0.2: not gated, term 0
    assert (d.term.item(), d.gated_units, d.total_units) == (0.0, 0, 1)
    tok = llds_details(new, old, adv, mask, gate="token", lam=0.2, keep_mask=keep)
    # token gate: only token 0 (delta 0.3) is penalised, normalised by the 2 kept tokens
    assert tok.term.item() == pytest.approx(0.2 * 0.3 / 2, rel=1e-6)
    assert tok.penalty.tolist()[0] == pytest.approx([0.06, 0.0, 0.0])
    # keep_mask all true is the same as none
    same = llds_details(
        new, old, adv, mask, gate="action", lam=0.2, keep_mask=torch.ones(1, 3, dtype=torch.bool)
    )
    assert same.term.item() == full.term.item()


# ---------------------------------------------------------------------------- trainer steps


@pytest.fixture(scope="module")
def plain_groups(tokenizer: Any) -> list[Any]:
    return synthetic_groups(tokenizer, 2, 3, seed=11, think_words=3, doc_words=6)


@pytest.fixture(scope="module")
def pi_old(tiny_model_dir: Path, plain_groups: list[Any]) -> list[list[float]]:
    """The initial policy's log-probs of every trajectory's response tokens, in sample order."""
    samples = samples_from_groups(plain_groups)
    return [
        x.tolist() for x in Trainer(_cfg(tiny_model_dir)).scorer.score(samples, entropy=False, ref=False)[0]
    ]


def _resampled(groups: list[Any], logprobs: Any, versions: Any = None) -> list[Any]:
    """``groups`` with ``logprobs(k, traj)`` (and ``versions(k, traj)``) for trajectory number ``k``."""
    out, k = [], 0
    for g in groups:
        trajs = []
        for t in g.trajectories:
            upd = {"logprobs": logprobs(k, t)} | ({"versions": versions(k, t)} if versions else {})
            trajs.append(t.model_copy(update=upd))
            k += 1
        out.append(g.model_copy(update={"trajectories": trajs}))
    return out


@pytest.fixture(scope="module")
def near_groups(plain_groups: list[Any], pi_old: list[list[float]]) -> list[Any]:
    """The groups with the initial policy's log-probs plus noise (sd 0.4) as the sampler's, tokens
    sampled by versions 0 and 1 at random: ratios around 1, as from a real near-policy sampler."""
    rng = random.Random(3)
    return _resampled(
        plain_groups,
        lambda k, t: [
            o + (rng.gauss(0, 0.4) if m else 0.0) for o, m in zip(pi_old[k], t.loss_mask, strict=True)
        ],
        lambda k, t: [rng.choice([0, 1]) if m else v for v, m in zip(t.versions, t.loss_mask, strict=True)],
    )


NEW_KEYS = [
    K.IS_MASKED_TOKEN_FRAC,
    K.IS_DROPPED_SEQ_FRAC,
    *(k for keys in RATIO_QUANTILE_KEYS.values() for k in keys),
]


def test_default_reproduces_the_truncated_is_of_before(tiny_model_dir: Path, near_groups: list[Any]) -> None:
    # Pinned at f6b5a94 (before llds_trainer.correction), same groups and configs, trainer at version 1.
    for kw, pinned in [
        ({"cap": 1.2}, [0.16487575322389603, 0.022030780091881752, 0.981894887936343, 0.3821656050955414]),
        ({"tokens": "all", "cap": 1.1}, [0.1496540978550911, 0.01762988790869713, 0.9419997321234809,
                                         0.49206349206349204]),
    ]:  # fmt: skip
        tr = Trainer(_cfg(tiny_model_dir, correction=kw))
        tr.state.version = 1
        r1, r2 = tr.train_step(near_groups), tr.train_step(near_groups)
        got = [r1[K.LOSS_TOTAL], r2[K.LOSS_TOTAL], r1[K.IS_WEIGHT_MEAN], r1[K.IS_TRUNCATED_FRAC]]
        assert got == pytest.approx(pinned, rel=1e-4), kw
        assert r1[K.IS_MASKED_TOKEN_FRAC] == 0.0 and r1[K.IS_DROPPED_SEQ_FRAC] == 0.0


@pytest.mark.parametrize(
    ("method", "bounds"),
    [("tis", {}), ("seq_tis", {"cap": 5.0}), ("mis", {"low": 0.7, "high": 1.4}),
     ("seq_mis", {"low": 0.05, "high": 20.0}), ("geo_reject", {"low": 0.95, "high": 1.05})],
)  # fmt: skip
def test_one_step_per_method(
    tiny_model_dir: Path, near_groups: list[Any], method: str, bounds: dict[str, float]
) -> None:
    correction = {"type": method, "tokens": "all", **bounds}
    tr = Trainer(_cfg(tiny_model_dir, correction=correction, lld={"probe": False}))
    tr.state.version = 2  # tokens of version 0 are 2 behind, of version 1 one behind
    rec = tr.train_step(near_groups)
    assert set(NEW_KEYS) <= set(rec) and set(NEW_KEYS) <= K.KEYS
    assert math.isfinite(rec[K.LOSS_TOTAL]) and rec[K.ACTOR_UPDATES] == 2
    masked, dropped = rec[K.IS_MASKED_TOKEN_FRAC], rec[K.IS_DROPPED_SEQ_FRAC]
    assert 0.0 <= masked <= 1.0 and 0.0 <= dropped <= 1.0
    if method in ("tis", "seq_tis"):
        assert masked == 0.0 and 0.0 <= rec[K.IS_TRUNCATED_FRAC] <= 1.0
    else:
        assert 0.0 < masked < 1.0, (method, masked)  # the bounds drop some of it, not all
        assert rec[K.IS_TRUNCATED_FRAC] is None
    if method in ("seq_mis", "geo_reject"):
        assert 0.0 < dropped < 1.0
    assert rec[K.IS_RATIO_P50_STALE0] is None  # nothing sampled by version 2
    for b in (1, 2):
        p1, p50, p99 = (rec[k] for k in RATIO_QUANTILE_KEYS[b])
        assert 0 < p1 <= p50 <= p99 and 0.5 < p50 < 2.0  # noise sd 0.4 around pi_old


def test_a_dropped_trajectory_is_out_of_every_term(
    tiny_model_dir: Path, plain_groups: list[Any], pi_old: list[list[float]]
) -> None:
    """geo_reject dropping two trajectories trains exactly like masking them out of the loss.

    Two far-off trajectories get ratios e^2 (dropped), the others exactly 1 (kept, weight 1); the same
    step with no correction and those two zeroed by the overlong filter (which keeps them in their
    group's advantage baseline too) must log the same losses and gradient: no dropped token is in the
    policy loss, the LLDS term, the KL or entropy term, or any token count they divide by.
    """
    far = {1, 5}
    groups = _resampled(
        plain_groups,
        lambda k, t: [
            o + (2.0 * m if k in far else 0.0) for o, m in zip(pi_old[k], t.loss_mask, strict=True)
        ],
    )
    cut = [
        g.model_copy(update={"trajectories": [
            t.model_copy(update={"finish_reason": "length" if 3 * gi + ti in far else "stop"})
            for ti, t in enumerate(g.trajectories)]})
        for gi, g in enumerate(groups)
    ]  # fmt: skip
    kw: dict[str, Any] = {
        "kl_coef": 0.01,
        "entropy_coef": 0.01,
        "epochs_per_step": 2,
        "lld": {"probe": False},
    }
    geo = Trainer(
        _cfg(
            tiny_model_dir, correction={"type": "geo_reject", "tokens": "all", "low": 0.5, "high": 1.5}, **kw
        )
    )
    masked = Trainer(_cfg(tiny_model_dir, correction="none", overlong_filter=True, **kw))
    for step in range(2):
        rec, ref = geo.train_step(cut), masked.train_step(cut)
        assert rec[K.IS_DROPPED_SEQ_FRAC] == pytest.approx(2 / 6) and rec[K.IS_WEIGHT_MEAN] == 1.0
        assert ref[K.DATA_OVERLONG] == 2 and rec[K.DATA_OVERLONG] == 0
        for k in (K.LOSS_TOTAL, K.LOSS_POLICY, K.LOSS_LLDS, K.LOSS_KL, K.LOSS_ENTROPY, K.ACTOR_GRAD_NORM,
                  K.LLDS_GATED_FRACTION, K.ACTOR_CLIP_FRAC):  # fmt: skip
            assert rec[k] == pytest.approx(ref[k], rel=1e-5, abs=1e-9), (step, k)
    assert rec[K.LOSS_LLDS] > 0  # the comparison covers a live LLDS term
