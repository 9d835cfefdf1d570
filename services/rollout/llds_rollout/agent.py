"""The Search-R1 multi-turn loop of one trajectory, at token level (search-protocol.md "The loop").

Per turn the engine continues ``prompt + response so far`` as token ids, stopping at ``</search>`` or
``</answer>``; the sampled ids and log-probs go into a :class:`TrajectoryBuilder` unchanged. The first
``<(search|answer)>`` of the turn's text decides: a search calls the retriever and appends the
observation's token ids, an answer ends the trajectory, anything else appends the invalid-action
feedback. After ``max_turns`` search-enabled turns one final turn runs with search disabled; a
trajectory whose generated tokens reach ``max_new_tokens`` ends there (``finish_reason = "length"``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from llds_proto.messages import AnswerTurn, Document, Trajectory
from llds_proto.reward import RewardKind, score_response
from llds_proto.search_protocol import (
    STOP_STRINGS,
    TrajectoryBuilder,
    invalid_action_ids,
    observation_ids,
    parse_action,
    prompt_ids,
)
from llds_rollout.engine.base import Engine, GenerationRequest, GenerationResult

FinishReason = Literal["answer", "max_turns", "length", "context"]


class Searcher(Protocol):
    """What the loop needs from a retriever client."""

    async def search(self, query: str, request_id: str | None = None) -> list[Document]: ...


@dataclass(frozen=True)
class LoopSettings:
    """Per-trajectory knobs."""

    max_turns: int = 3
    max_tokens_per_turn: int = 500
    max_context_tokens: int = 4096
    max_obs_tokens: int = 500
    temperature: float = 1.0
    """0 = greedy."""
    top_p: float = 1.0
    reward: RewardKind = "exact_match"
    max_new_tokens: int | None = None
    """Generated tokens over all turns (an OpenAI client's ``max_completion_tokens``); None: only the
    per-turn and context caps apply."""


@dataclass
class Episode:
    """A finished conversation: the trajectory plus what the engine returned, turn by turn."""

    trajectory: Trajectory
    turns: list[AnswerTurn]
    generations: list[GenerationResult] = field(default_factory=list)
    invalid_actions: int = 0


async def run_episode(
    engine: Engine,
    searcher: Searcher,
    tokenizer: Any,
    question: str,
    golds: Sequence[str],
    settings: LoopSettings,
    *,
    trajectory_id: str,
    sample_index: int = 0,
    prompt: list[int] | None = None,
    on_turn: Callable[[AnswerTurn], None] | None = None,
) -> Episode:
    """Run one conversation to its end. Retriever and engine errors propagate (the caller fails it).

    ``on_turn`` is called with each finished assistant turn (for streaming answers).
    """
    t_start = time.perf_counter()
    prompt = list(prompt) if prompt is not None else prompt_ids(tokenizer, question)
    b = TrajectoryBuilder()
    turns: list[AnswerTurn] = []
    generations: list[GenerationResult] = []
    valid_searches = invalid = 0
    t_gen = t_ret = 0.0
    finish: FinishReason = "max_turns"

    def _turn(t: AnswerTurn) -> None:
        turns.append(t)
        if on_turn is not None:
            on_turn(t)

    def room() -> int:
        return settings.max_context_tokens - len(prompt) - len(b)

    generated = 0

    def budget() -> int:
        per_turn = min(settings.max_tokens_per_turn, room())
        if settings.max_new_tokens is None:
            return per_turn
        return min(per_turn, settings.max_new_tokens - generated)

    for turn in range(settings.max_turns + 1):
        search_enabled = turn < settings.max_turns
        if room() <= 0:
            finish = "context"
            break
        t0 = time.perf_counter()
        res = await engine.generate(
            GenerationRequest(
                prompt_ids=prompt + b.response_ids,
                max_tokens=budget(),
                temperature=settings.temperature,
                top_p=settings.top_p,
                stop=STOP_STRINGS,
                request_id=f"{trajectory_id}/t{turn}",
            )
        )
        t_gen += time.perf_counter() - t0
        generations.append(res)
        generated += len(res.token_ids)
        b.add_generated(res.token_ids, res.logprobs, res.versions)
        text = tokenizer.decode(res.token_ids, skip_special_tokens=False)
        action = parse_action(text)
        if action is not None and action[0] == "answer":
            _turn(AnswerTurn(text=text))
            finish = "answer"
            break
        if not search_enabled:
            _turn(AnswerTurn(text=text))
            finish = "length" if res.finish_reason == "length" else "max_turns"
            break
        if settings.max_new_tokens is not None and generated >= settings.max_new_tokens:
            # Out of budget: a search would feed a turn that cannot run.
            _turn(AnswerTurn(text=text))
            finish = "length"
            break
        if action is not None and action[1]:
            query = action[1]
            t0 = time.perf_counter()
            docs = await searcher.search(query, request_id=f"{trajectory_id}/t{turn}")
            t_ret += time.perf_counter() - t0
            obs = observation_ids(tokenizer, [d.model_dump() for d in docs], settings.max_obs_tokens)
            valid_searches += 1
            _turn(AnswerTurn(text=text, search_query=query, documents=docs))
        else:
            # An empty <search></search> counts as invalid: there is nothing to look up.
            obs = invalid_action_ids(tokenizer)
            invalid += 1
            _turn(AnswerTurn(text=text))
        if len(obs) >= room():
            b.add_observation(obs[: room()])
            finish = "context"
            break
        b.add_observation(obs)

    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=False)

    response_text = decode(b.response_ids)
    reward, em, answer = score_response(response_text, list(golds), settings.reward)
    answer_span = b.answer_span(decode) if finish == "answer" else None
    traj = Trajectory(
        trajectory_id=trajectory_id,
        sample_index=sample_index,
        prompt_ids=prompt,
        response_ids=b.response_ids,
        logprobs=b.logprobs,
        loss_mask=b.loss_mask,
        versions=b.versions,
        action_spans=b.action_spans,
        answer_span=answer_span,
        reward=reward,
        exact_match=em,
        num_valid_searches=valid_searches,
        num_turns=len(turns),
        answer=answer,
        finish_reason=finish,
        timings={"generate": t_gen, "retrieve": t_ret, "total": time.perf_counter() - t_start},
    )
    return Episode(trajectory=traj, turns=turns, generations=generations, invalid_actions=invalid)
