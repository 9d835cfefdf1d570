"""The Search-R1 agent protocol: prompt, tags, observations, and token-level trajectory assembly.

Byte-exact where the published checkpoints depend on it (prompt, observation wrapper, invalid-action
feedback). Used by the rollout service to run conversations and by the warm-start to build
demonstrations, so both produce tokens the same way. Tokenizers are duck-typed (any object with
Hugging Face's ``encode``/``decode``/``apply_chat_template``), so this module needs no ML import.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

PROMPT_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every "
    "time you get new information. After reasoning, if you find you lack some knowledge, you can call a "
    "search engine by <search> query </search> and it will return the top searched results between "
    "<information> and </information>. You can search as many times as your want. If you find no "
    "further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)
"""The user message, byte-exact with Search-R1 (``as your want`` included)."""

INVALID_ACTION_TEXT = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> "
    "and </search>. If I want to give the final answer, I should put the answer between <answer> and "
    "</answer>. Let me try again.\n"
)
"""Feedback appended after a turn with neither a complete search nor an answer."""

STOP_STRINGS = ("</search>", "</answer>")
"""Generation stops at either; the stop string stays in the output."""

MAX_OBS_TOKENS = 500
"""Observation tokens per turn (Search-R1 default)."""

_ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_ANSWER_SPAN_RE = re.compile(r"<answer>.*?</answer>", re.DOTALL)


class Tokenizer(Protocol):
    """The slice of a Hugging Face tokenizer the protocol needs."""

    chat_template: Any

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


def format_question(question: str) -> str:
    """Strip, and add a trailing ``?`` if missing."""
    q = question.strip()
    return q if q.endswith("?") else q + "?"


def prompt_text(question: str) -> str:
    """The user message for a question."""
    return PROMPT_TEMPLATE.format(question=format_question(question))


def prompt_ids(tokenizer: Tokenizer, question: str) -> list[int]:
    """Prompt token ids: chat template with generation prompt if the tokenizer has one, else raw text."""
    text = prompt_text(question)
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return list(tokenizer.encode(rendered, add_special_tokens=False))
    return list(tokenizer.encode(text, add_special_tokens=False))


def split_contents(contents: str) -> tuple[str, str]:
    """``"Title"\\ntext`` -> (title, text); the title keeps its quotes as Search-R1 does."""
    title, _, text = contents.partition("\n")
    return title, text


def format_documents(docs: Sequence[Mapping[str, Any]]) -> str:
    """``Doc {i}(Title: {title}) {text}\\n`` for each document, numbered from 1."""
    out = []
    for i, doc in enumerate(docs, start=1):
        title, text = split_contents(str(doc["contents"]))
        out.append(f"Doc {i}(Title: {title}) {text}\n")
    return "".join(out)


def observation_text(docs: Sequence[Mapping[str, Any]]) -> str:
    """The observation appended after a search."""
    return "\n\n<information>" + format_documents(docs).strip() + "</information>\n\n"


def observation_ids(
    tokenizer: Tokenizer, docs: Sequence[Mapping[str, Any]], max_tokens: int = MAX_OBS_TOKENS
) -> list[int]:
    """Token ids of the observation, the document text cut so that the whole fits ``max_tokens``."""
    ids = list(tokenizer.encode(observation_text(docs), add_special_tokens=False))
    if len(ids) <= max_tokens:
        return ids
    head = list(tokenizer.encode("\n\n<information>", add_special_tokens=False))
    tail = list(tokenizer.encode("</information>\n\n", add_special_tokens=False))
    body = list(tokenizer.encode(format_documents(docs).strip(), add_special_tokens=False))
    keep = max(0, max_tokens - len(head) - len(tail))
    return head + body[:keep] + tail


def invalid_action_ids(tokenizer: Tokenizer) -> list[int]:
    """Token ids of the invalid-action feedback."""
    return list(tokenizer.encode(INVALID_ACTION_TEXT, add_special_tokens=False))


Action = tuple[Literal["search", "answer"], str]


def parse_action(text: str) -> Action | None:
    """First complete ``<search>..</search>`` or ``<answer>..</answer>`` in a turn, content stripped."""
    m = _ACTION_RE.search(text)
    if m is None:
        return None
    kind = m.group(1)
    assert kind in ("search", "answer")
    return (kind, m.group(2).strip())  # type: ignore[return-value]


def find_answer_span(decode: Callable[[Sequence[int]], str], ids: Sequence[int]) -> tuple[int, int] | None:
    """Token range ``[s, e)`` of ``ids`` covering the last complete ``<answer>...</answer>``.

    Found on the decoded text and mapped back to tokens by binary search over decoded prefixes
    (O(log n) decodes), so it works for any tokenizer without offset mappings.
    """
    text = decode(ids)
    matches = list(_ANSWER_SPAN_RE.finditer(text))
    if not matches:
        return None
    a, b = matches[-1].start(), matches[-1].end()
    n = len(ids)

    def prefix_len(k: int) -> int:
        return len(decode(ids[:k]))

    lo, hi = 0, n  # largest k with prefix_len(k) <= a
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if prefix_len(mid) <= a:
            lo = mid
        else:
            hi = mid - 1
    start = lo
    lo, hi = start + 1, n  # smallest k with prefix_len(k) >= b
    while lo < hi:
        mid = (lo + hi) // 2
        if prefix_len(mid) >= b:
            hi = mid
        else:
            lo = mid + 1
    return (start, max(lo, start + 1))


@dataclass
class TrajectoryBuilder:
    """Accumulates a conversation's response tokens turn by turn, at token level.

    Sampled tokens are appended with their log-probs and the policy version that sampled them
    (loss mask 1); observation tokens with log-prob 0.0, version -1 and loss mask 0. Every token id
    stored is one the engine produced or the environment appended: nothing is re-tokenized.
    """

    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    action_spans: list[tuple[int, int]] = field(default_factory=list)

    def add_generated(
        self, ids: Sequence[int], logprobs: Sequence[float], version: int | Sequence[int]
    ) -> tuple[int, int]:
        """Append one assistant turn; returns its span. ``version``: the one that sampled every token,
        or one per token (a turn that a weight swap reached while it ran)."""
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} token ids but {len(logprobs)} logprobs")
        versions = [version] * len(ids) if isinstance(version, int) else [int(v) for v in version]
        if len(versions) != len(ids):
            raise ValueError(f"{len(ids)} token ids but {len(versions)} versions")
        start = len(self.response_ids)
        self.response_ids.extend(int(i) for i in ids)
        self.logprobs.extend(float(x) for x in logprobs)
        self.loss_mask.extend([1] * len(ids))
        self.versions.extend(versions)
        span = (start, len(self.response_ids))
        if ids:
            self.action_spans.append(span)
        return span

    def add_observation(self, ids: Sequence[int]) -> None:
        """Append environment tokens (retrieved documents or invalid-action feedback)."""
        self.response_ids.extend(int(i) for i in ids)
        self.logprobs.extend([0.0] * len(ids))
        self.loss_mask.extend([0] * len(ids))
        self.versions.extend([-1] * len(ids))

    def __len__(self) -> int:
        return len(self.response_ids)

    def answer_span(self, decode: Callable[[Sequence[int]], str]) -> tuple[int, int] | None:
        """Span of the final answer inside the last action, in response coordinates."""
        if not self.action_spans:
            return None
        s, e = self.action_spans[-1]
        local = find_answer_span(decode, self.response_ids[s:e])
        return None if local is None else (s + local[0], s + local[1])
