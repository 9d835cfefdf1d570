"""The learner on the tiny model: pinned loss values, resume equality, LLDS zero on the first update."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from llds_server.settings import merged
from llds_trainer.config import TrainerConfig
from llds_trainer.core import Trainer
from llds_trainer.synthetic import synthetic_groups


@pytest.fixture(scope="module")
def groups(tokenizer: Any) -> list[Any]:
    return synthetic_groups(tokenizer, 4, 3, seed=11, think_words=3, doc_words=6)


def _cfg(model: Path, **kw: Any) -> TrainerConfig:
    base = dict(model=str(model), optimizer={"lr": 1e-3}, micro_batch_size=2, minibatches_per_step=2, num_threads=1,
                regularizer={"answer_weight_mode": "adaptive_code"}, seed=5)  # fmt: skip
    return TrainerConfig(**merged(base, kw))


def test_pinned_losses_of_a_deterministic_step(tiny_model_dir: Path, groups: list[Any]) -> None:
    tr = Trainer(_cfg(tiny_model_dir))
    r1 = tr.train_step(groups[:2])
    r2 = tr.train_step(groups[2:])
    got = [r1["loss/total"], r1["loss/llds"], r2["loss/total"], r2["loss/llds"], r2["lld/correct_logp_token"]]
    assert got == pytest.approx(PINNED, rel=1e-4, abs=1e-7)
    assert r1["actor/updates"] == 2


PINNED = [0.18449781090021133, 0.0, 0.11832885444164276, 0.011603218503296375, -10.608126583614865]


@pytest.mark.parametrize("chunk", [0, 5])
def test_pinned_losses_hold_under_any_head_chunking(
    tiny_model_dir: Path, groups: list[Any], chunk: int
) -> None:
    """The same step with the head over each micro-batch at once, and in chunks of 5 scored tokens (their
    logits recomputed in the backward pass): the pinned values (default 1024: one chunk here)."""
    tr = Trainer(_cfg(tiny_model_dir, logits_chunk_tokens=chunk))
    r1 = tr.train_step(groups[:2])
    r2 = tr.train_step(groups[2:])
    got = [r1["loss/total"], r1["loss/llds"], r2["loss/total"], r2["loss/llds"], r2["lld/correct_logp_token"]]
    assert got == pytest.approx(PINNED, rel=1e-4, abs=1e-7)


def test_llds_is_zero_with_a_single_update_per_step(tiny_model_dir: Path, groups: list[Any]) -> None:
    tr = Trainer(_cfg(tiny_model_dir, minibatches_per_step=1))
    rec = tr.train_step(groups[:2])
    # pi_theta == pi_old on the only update of a step: nothing is displaced yet.
    assert rec["loss/llds"] == 0.0
    assert rec["llds/gated_fraction"] == 0.0


def test_resume_gives_the_same_next_step(tiny_model_dir: Path, groups: list[Any], tmp_path: Path) -> None:
    a = Trainer(_cfg(tiny_model_dir))
    a.train_step(groups[:2])
    a.state.add_consumed(1, [g.group_id for g in groups[:2]])
    path = a.save_checkpoint(tmp_path / "run")
    want = a.train_step(groups[2:])
    b = Trainer(_cfg(tiny_model_dir))
    b.load_checkpoint(path)
    assert b.state.step == 1 and b.state.consumed == [g.group_id for g in groups[:2]]
    got = b.train_step(groups[2:])
    for k in ("loss/total", "loss/policy", "loss/llds", "actor/grad_norm", "lld/displacement_mean"):
        assert got[k] == pytest.approx(want[k], rel=1e-6, abs=1e-9), k
    for (n, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q), n


def test_checkpoints_keep_the_newest_n(tiny_model_dir: Path, groups: list[Any], tmp_path: Path) -> None:
    from llds_trainer.checkpoint import list_checkpoints

    tr = Trainer(_cfg(tiny_model_dir, keep_checkpoints=2, lld={"probe": False}))
    for s in range(3):
        tr.state.step = s + 1
        tr.save_checkpoint(tmp_path)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3]
    assert not list((tmp_path / "checkpoints").glob(".step_*"))


def test_stale_tokens_get_truncated_is_weights(tiny_model_dir: Path, tokenizer: Any) -> None:
    old = synthetic_groups(tokenizer, 2, 2, seed=2, version=1, think_words=2, doc_words=4)
    tr = Trainer(_cfg(tiny_model_dir, correction={"tokens": "stale", "cap": 2.0}, lld={"probe": False}))
    tr.state.version = 2
    rec = tr.train_step(old)
    # Random sampler log-probs (about -1.5) vs a random policy's (about -10.8): weights far below the cap.
    assert rec["data/stale_tokens"] == rec["data/loss_tokens"]
    assert 0 < rec["is/weight_mean"] < 1 and rec["is/truncated_frac"] == 0.0
    assert rec["mismatch/kl"] > 1.0
    fresh = Trainer(_cfg(tiny_model_dir, lld={"probe": False})).train_step(old)
    assert fresh["is/weight_mean"] is None  # version 1 is not older than a trainer at version 0


def test_kl_entropy_gspo_and_seq_mean_variants_run(tiny_model_dir: Path, groups: list[Any]) -> None:
    tr = Trainer(_cfg(tiny_model_dir, kl_coef=0.001, entropy_coef=0.001, policy_loss="gspo", lld={"probe": False},
                      regularizer={"gate": "response", "normalize": "paper", "answer_weight_mode": "adaptive_paper"}))  # fmt: skip
    assert tr.ref_model is not None
    r = tr.train_step(groups[:2])
    r = tr.train_step(groups[2:])
    assert r["loss/kl"] is not None and r["loss/kl"] >= 0
    t2 = Trainer(
        _cfg(
            tiny_model_dir,
            loss_agg="seq_mean_token_mean",
            optimizer={"warmup_steps": 4},
            lld={"probe": False},
        )
    )
    r2 = t2.train_step(groups[:2])
    assert r2["actor/lr"] == pytest.approx(1e-3 / 4)
    assert all(isinstance(v, (int, float)) or v is None for v in r2.values())


def _truncate(group: Any, which: set[int]) -> Any:
    """``group`` with its trajectories at ``which`` cut off by the length limit."""
    trajs = [t.model_copy(update={"finish_reason": "length"}) if i in which else t
             for i, t in enumerate(group.trajectories)]  # fmt: skip
    return group.model_copy(update={"trajectories": trajs})


def test_overlong_filter_masks_truncated_responses_but_keeps_them_in_the_baseline(
    tiny_model_dir: Path, groups: list[Any]
) -> None:
    from llds_trainer.batch import samples_from_groups
    from llds_trainer.core import TrainerError

    cut = [_truncate(groups[0], {0}), _truncate(groups[1], {1, 2})]
    plain = samples_from_groups(cut)
    kept = samples_from_groups(cut, overlong_filter=True)
    assert [s.overlong for s in kept] == [True, False, False, False, True, True]
    assert [s.advantage for s in kept] == [s.advantage for s in plain]  # same group baselines
    for p, k in zip(plain, kept, strict=True):
        assert k.loss_mask == (tuple(0 for _ in p.loss_mask) if k.overlong else p.loss_mask)
        assert not p.overlong
    rec = Trainer(_cfg(tiny_model_dir, overlong_filter=True)).train_step(cut)
    assert rec["data/overlong"] == 3
    assert rec["data/loss_tokens"] == sum(s.n_loss_tokens for s in kept) < sum(s.n_loss_tokens for s in plain)
    assert Trainer(_cfg(tiny_model_dir)).train_step(cut)["data/overlong"] == 0  # off: trained as before
    with pytest.raises(TrainerError, match="overlong_filter masked every truncated one"):
        Trainer(_cfg(tiny_model_dir, overlong_filter=True)).train_step([_truncate(groups[0], {0, 1, 2})])


def test_dual_clip_is_logged_only_when_on(tiny_model_dir: Path, groups: list[Any]) -> None:
    on = Trainer(_cfg(tiny_model_dir, policy_loss={"dual_clip_c": 3.0}, optimizer={"lr": 5e-2})).train_step(
        groups[:2]
    )
    assert 0.0 <= on["actor/dual_clip_frac"] <= 1.0
    assert Trainer(_cfg(tiny_model_dir)).train_step(groups[:2])["actor/dual_clip_frac"] is None
    with pytest.raises(ValueError, match="dual_clip_c"):
        _cfg(tiny_model_dir, policy_loss={"dual_clip_c": 0.5})


def test_bf16_autocast_keeps_float32_master_weights(tiny_model_dir: Path, groups: list[Any]) -> None:
    """``autocast = "bfloat16"`` (the GPU presets): the forward passes run in bfloat16, the weights,
    their gradients and AdamW's state stay float32, so an update of lr 1e-6 lands. A bfloat16 weight
    (``dtype = "bfloat16"``) would round most such updates away."""
    tr = Trainer(
        _cfg(tiny_model_dir, autocast="bfloat16", gradient_checkpointing=True, optimizer={"lr": 1e-6})
    )
    seen: list[torch.dtype] = []
    tr.model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    before = [p.detach().clone() for p in tr.model.parameters()]
    rec = tr.train_step(groups[:2])
    assert set(seen) == {torch.bfloat16} and rec["actor/updates"] == 2
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
    assert all(s.dtype == torch.float32 for st in tr.optimizer.state.values() for s in st.values() if s.ndim)
    changed = sum(int((p.detach() != b).sum()) for p, b in zip(tr.model.parameters(), before, strict=True))
    assert changed > 0.9 * sum(b.numel() for b in before)
    w = torch.randn(4096) * 0.02
    assert int((w.bfloat16() + 1e-6).ne(w.bfloat16()).sum()) < 0.05 * w.numel()  # bf16 loses the step


def test_the_probe_scores_correct_responses_alone_with_the_full_passes_values(
    tiny_model_dir: Path, groups: list[Any]
) -> None:
    from llds_trainer.batch import samples_from_groups
    from llds_trainer.signals import lld_signals

    tr = Trainer(_cfg(tiny_model_dir))
    tr.train_step(groups[:2])
    samples = samples_from_groups(groups[2:])
    samples.sort(key=lambda s: s.correct)  # wrong ones first: whole micro-batches without a correct one
    assert 2 <= sum(not s.correct for s in samples) and any(s.correct for s in samples)
    probe = tr._probe(samples, [[], list(range(len(samples)))])
    full = tr.scorer.score(samples, entropy=False, ref=False)[0]
    pairs = [i for i in range(0, len(samples), 2) if not (samples[i].correct or samples[i + 1].correct)]
    assert pairs  # some micro-batch (2 samples) holds no correct response: it is not scored
    for i, (s, p, f) in enumerate(zip(samples, probe, full, strict=True)):
        if s.correct:
            assert torch.equal(p, f)  # the full pass's bits: same micro-batches
        elif i - i % 2 in pairs:
            assert p.numel() == 0
    old = tr.scorer.score(samples, entropy=True, ref=False)
    assert lld_signals(samples, old[0], old[1], probe) == lld_signals(samples, old[0], old[1], full)
    # Unchanged weights: nothing fell, exactly.
    assert lld_signals(samples, old[0], old[1], probe)["lld/fell_fraction_responses"] == 0.0


def test_pi_old_from_the_first_update_is_the_passes_value(tiny_model_dir: Path, groups: list[Any]) -> None:
    """The first mini-batch's pi_old taken from the first update's forward: the step equals the one
    with a pi_old pass over every trajectory (float noise apart), on half the pass's forwards."""
    on = Trainer(_cfg(tiny_model_dir, epochs_per_step=2))
    off = Trainer(_cfg(tiny_model_dir, epochs_per_step=2, old_from_first_update=False))
    for g in (groups[:2], groups[2:]):
        a, b = on.train_step(g), off.train_step(g)
        assert a["perf/old_from_update_frac"] == 0.5 and b["perf/old_from_update_frac"] == 0.0
        for key in ("loss/total", "loss/policy", "loss/llds", "actor/grad_norm", "mismatch/kl",
                    "lld/correct_logp_token", "actor/entropy", "lld/fell_fraction_responses"):  # fmt: skip
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
    for p, q in zip(on.model.parameters(), off.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    # One mini-batch: no pass at all, every pi_old from the update's forward.
    one = Trainer(_cfg(tiny_model_dir, minibatches_per_step=1))
    assert one.train_step(groups[:2])["perf/old_from_update_frac"] == 1.0


def _uniform(group: Any) -> Any:
    """``group`` with every trajectory rewarded alike: advantage 0 everywhere, no policy gradient."""
    trajs = [t.model_copy(update={"reward": 0.0, "exact_match": 0.0}) for t in group.trajectories]
    return group.model_copy(update={"trajectories": trajs})


@pytest.mark.parametrize("mode", ["never", "zero_grad", "no_signal"])
def test_skip_updates_leaves_the_weights_alone_on_a_step_without_signal(
    tiny_model_dir: Path, groups: list[Any], mode: str
) -> None:
    """Plain GRPO on uniform groups: the gradient is exactly zero, yet AdamW (momentum from an earlier
    step, weight decay) moves the weights unless ``optimizer.skip_updates`` says otherwise."""
    tr = Trainer(_cfg(tiny_model_dir, regularizer={"type": "none"}, optimizer={"skip_updates": mode}))
    first = tr.train_step(groups[:2])  # a step with signal: Adam has momentum now
    assert first["actor/skipped_updates"] == 0 and first["actor/updates"] == 2
    before = [p.detach().clone() for p in tr.model.parameters()]
    rec = tr.train_step([_uniform(g) for g in groups[2:]])
    assert rec["actor/grad_norm"] == 0.0
    moved = any(not torch.equal(a, p.detach()) for a, p in zip(before, tr.model.parameters(), strict=True))
    assert moved == (mode == "never")
    assert rec["actor/skipped_updates"] == (0 if mode == "never" else 2)
    assert rec["actor/updates"] == (2 if mode == "never" else 0)


def test_no_signal_skips_even_with_a_kl_gradient(tiny_model_dir: Path, groups: list[Any]) -> None:
    """With KL on, uniform groups still give a (KL) gradient: ``zero_grad`` steps, ``no_signal`` does not."""
    for mode, skipped in (("zero_grad", 0), ("no_signal", 2)):
        tr = Trainer(_cfg(tiny_model_dir, regularizer={"type": "none"}, kl_coef=0.1,
                          optimizer={"skip_updates": mode}))  # fmt: skip
        tr.train_step(groups[:2])
        rec = tr.train_step([_uniform(g) for g in groups[2:]])
        assert rec["actor/grad_norm"] > 0
        assert rec["actor/skipped_updates"] == skipped, mode


def test_the_fell_fraction_reads_zero_when_the_weights_did_not_move(
    tiny_model_dir: Path, groups: list[Any]
) -> None:
    """Groups all correct (advantage 0): with ``skip_updates`` the weights stay, and no correct response
    may read as having fallen; without it AdamW's momentum moves them and the signal sees that."""

    def all_right(group: Any) -> Any:
        trajs = [t.model_copy(update={"reward": 1.0, "exact_match": 1.0}) for t in group.trajectories]
        return group.model_copy(update={"trajectories": trajs})

    for mode in ("no_signal", "never"):
        tr = Trainer(_cfg(tiny_model_dir, regularizer={"type": "none"}, optimizer={"skip_updates": mode}))
        tr.train_step(groups[:2])
        rec = tr.train_step([all_right(g) for g in groups[2:]])
        fell = rec["lld/fell_fraction_responses"]
        assert (fell == 0.0) if mode == "no_signal" else (fell is not None and fell > 0), (mode, fell)
