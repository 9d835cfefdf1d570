"""Synthetic groups from token ids alone (the random-weight benchmark's): exact lengths, the rollout's
masks and spans, and a learning signal in every group."""

from __future__ import annotations

import pytest

from llds_trainer.batch import samples_from_groups
from llds_trainer.synthetic import TokenLayout, synthetic_token_groups


def test_token_groups_have_the_layout_exactly() -> None:
    lay = TokenLayout(prompt=7, search_turns=2, turn=5, observation=4, answer=6)
    assert (lay.total, lay.loss_tokens) == (7 + 2 * 9 + 6, 16)
    groups = synthetic_token_groups(50, lay, n_groups=2, group_size=3, seed=1)
    assert [len(g.trajectories) for g in groups] == [3, 3]
    for g in groups:
        assert len({tuple(t.prompt_ids) for t in g.trajectories}) == 1  # one prompt per group
        assert [t.reward for t in g.trajectories] == [1.0, 0.0, 1.0]
        for t in g.trajectories:
            assert len(t.prompt_ids) + len(t.response_ids) == lay.total
            assert t.loss_mask == [1] * 5 + [0] * 4 + [1] * 5 + [0] * 4 + [1] * 6
            assert t.action_spans == [(0, 5), (9, 14), (18, 24)]
            assert t.answer_span == (18, 24)  # shorter than 8 tokens: the whole answer turn
            assert all(0 <= i < 50 for i in t.prompt_ids + t.response_ids)
            assert (t.num_valid_searches, t.num_turns) == (2, 3)
    samples = samples_from_groups(groups)
    assert all(s.advantage != 0 for s in samples)
    assert synthetic_token_groups(50, lay, 2, 3, seed=1)[0].trajectories[0].response_ids == (
        groups[0].trajectories[0].response_ids
    )


def test_a_long_answer_turn_has_an_eight_token_answer_span() -> None:
    lay = TokenLayout(prompt=1, search_turns=0, turn=0, observation=0, answer=20)
    (t,) = synthetic_token_groups(10, lay, 1, 1)[0].trajectories
    assert t.answer_span == (12, 20) and t.action_spans == [(0, 20)]


def test_a_layout_without_prompt_or_answer_is_refused() -> None:
    with pytest.raises(ValueError, match="prompt and an answer"):
        synthetic_token_groups(10, TokenLayout(prompt=0, search_turns=1, turn=2, observation=2, answer=2), 1)
