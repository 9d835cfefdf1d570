"""Restoring NQ triples from BIG-bench's knowledge-conflict examples."""

from __future__ import annotations

from llds_retriever.nq import _parse_example


def test_original_answer_is_put_back() -> None:
    ex = {
        "input": "\nQuestion: who is joseph paine in mr smith goes to washington?\nContext: Chalino Sánchez as "
        "Senator Joseph Harrison `` Joe '' Paine ; Chalino Sánchez again",
        "target": "Chalino Sánchez",
        "target_scores": {"Chalino Sánchez": 1, "Claude Rains": 0},
    }
    question, passage, answer = _parse_example(ex)  # type: ignore[misc]
    assert question == "who is joseph paine in mr smith goes to washington?"
    assert answer == "Claude Rains"
    assert passage == "Claude Rains as Senator Joseph Harrison `` Joe '' Paine ; Claude Rains again"


def test_other_shapes_are_skipped() -> None:
    assert _parse_example({"input": "no question here", "target_scores": {"a": 1, "b": 0}}) is None
    assert _parse_example({"input": "\nQuestion: q?\nContext: c", "target_scores": {"a": 1}}) is None
