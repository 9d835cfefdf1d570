"""Answer normalisation and scoring (search-protocol spec, Reward)."""

import pytest

from llds_proto.reward import (
    exact_match,
    extract_answer,
    f1_score,
    normalize_answer,
    score_response,
    substring_match,
)


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  a  Cat,  an apple ", "cat apple"),
        ("Theory", "theory"),
        ("U.S.A.", "usa"),
    ],
)
def test_normalize(raw: str, norm: str) -> None:
    assert normalize_answer(raw) == norm


def test_last_answer_of_the_response_is_scored() -> None:
    resp = "<think>x</think><answer> London </answer> hmm <answer>the Paris</answer>"
    assert extract_answer(resp) == "the Paris"
    assert score_response(resp, ["Paris"]) == (1.0, 1.0, "the Paris")


def test_no_answer_scores_zero() -> None:
    assert score_response("<search> x </search>", ["x"]) == (0.0, 0.0, None)


def test_f1_and_substring() -> None:
    assert f1_score("Paris France", ["Paris"]) == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert substring_match("in Paris France", ["paris"]) == 1.0
    assert exact_match("in Paris France", ["paris"]) == 0.0


@pytest.mark.parametrize(
    ("resp", "reward"),
    [
        ("<think>a</think><answer>Paris</answer>", 1.0),
        ("<think>a<answer>Paris</answer>", 0.8),
        ("<think>a</think><answer>Rome</answer>", 0.2),
        ("<think>a<answer>Rome</answer>", 0.1),
        ("<think>a</think>", 0.0),
    ],
)
def test_format_aware_reward(resp: str, reward: float) -> None:
    assert score_response(resp, ["Paris"], kind="format")[0] == reward
