"""The Search-R1 protocol: byte-exact prompt and observations, action parsing, token-level assembly."""

import pytest

from llds_proto.search_protocol import (
    INVALID_ACTION_TEXT,
    TrajectoryBuilder,
    find_answer_span,
    format_question,
    observation_ids,
    observation_text,
    parse_action,
    prompt_ids,
    prompt_text,
)

# Written out independently of the module (the spec's text, including "as your want").
EXPECTED_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine "
    "by <search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: who wrote hamlet?\n"
)


def test_prompt_is_byte_exact() -> None:
    assert prompt_text("  who wrote hamlet ") == EXPECTED_PROMPT
    assert format_question("who?") == "who?"


def test_prompt_ids_use_the_chat_template(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = prompt_ids(tokenizer, "who wrote hamlet")
    text = tokenizer.decode(ids)
    assert EXPECTED_PROMPT in text
    assert text.endswith("<|im_start|>assistant\n")


def test_observation_format() -> None:
    docs = [
        {"id": "1", "contents": '"Paris"\nCapital of France.'},
        {"id": "2", "contents": '"Lyon"\nA city.'},
    ]
    assert observation_text(docs) == (
        '\n\n<information>Doc 1(Title: "Paris") Capital of France.\nDoc 2(Title: "Lyon") A city.</information>\n\n'
    )


def test_observation_is_truncated_to_budget_keeping_tags(tokenizer) -> None:  # type: ignore[no-untyped-def]
    docs = [{"id": str(i), "contents": f'"T{i}"\n' + "word " * 300} for i in range(3)]
    ids = observation_ids(tokenizer, docs, max_tokens=100)
    assert len(ids) <= 100
    text = tokenizer.decode(ids)
    assert text.startswith("\n\n<information>") and text.endswith("</information>\n\n")


def test_invalid_action_text_is_byte_exact() -> None:
    assert INVALID_ACTION_TEXT == (
        "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
        "</search>. If I want to give the final answer, I should put the answer between <answer> and "
        "</answer>. Let me try again.\n"
    )


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("<think>hm</think>\n<search> capital of France </search>", ("search", "capital of France")),
        ("<answer> Paris </answer>", ("answer", "Paris")),
        ("<search>a</search><answer>b</answer>", ("search", "a")),
        ("<search> unterminated", None),
        ("<search>x</answer>", None),
    ],
)
def test_parse_first_action(text: str, action: object) -> None:
    assert parse_action(text) == action


def test_answer_span_covers_tags(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = tokenizer.encode("<think>so it is</think>\n<answer> Paris </answer>", add_special_tokens=False)
    s, e = find_answer_span(tokenizer.decode, ids)
    assert tokenizer.decode(ids[s:e]).strip() == "<answer> Paris </answer>"
    assert find_answer_span(tokenizer.decode, tokenizer.encode("no answer", add_special_tokens=False)) is None


def test_builder_tracks_masks_spans_versions(tokenizer) -> None:  # type: ignore[no-untyped-def]
    b = TrajectoryBuilder()
    t1 = [10, 11, 12]
    assert b.add_generated(t1, [-0.1, -0.2, -0.3], version=4) == (0, 3)
    b.add_observation([7, 8])
    ans = tokenizer.encode("<answer> x </answer>", add_special_tokens=False)
    b.add_generated(ans, [-0.5] * len(ans), version=5)
    assert b.response_ids == [*t1, 7, 8, *ans]
    assert b.loss_mask == [1, 1, 1, 0, 0] + [1] * len(ans)
    assert b.versions == [4, 4, 4, -1, -1] + [5] * len(ans)
    assert b.logprobs[3:5] == [0.0, 0.0]
    assert b.action_spans == [(0, 3), (5, 5 + len(ans))]
    assert b.answer_span(tokenizer.decode) == (5, 5 + len(ans))
    with pytest.raises(ValueError):
        b.add_generated([1, 2], [0.0], version=0)
