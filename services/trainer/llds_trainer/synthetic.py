"""Synthetic trajectory groups in the rollout's exact token layout, for the benchmark and tests.

:func:`synthetic_groups`: each trajectory is a real Search-R1 conversation assembled with
:class:`llds_proto.search_protocol.TrajectoryBuilder`: a think+search turn, a retrieved-documents
observation, an optional second search, then a think+answer turn whose answer is right or wrong at
random (reward = exact match). Sampler log-probs are random negatives: the trainer recomputes pi_old
itself, and the mismatch it reports is then large by design.

:func:`synthetic_token_groups`: the same layout from random token ids and exact token counts, with no
tokenizer (a random-weight model has none), so every trajectory has the same, chosen length.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from llds_proto.messages import Trajectory, TrajectoryGroup
from llds_proto.reward import score_response
from llds_proto.search_protocol import TrajectoryBuilder, observation_ids, prompt_ids

_WORDS = "river castle engine summer violet harbor meadow signal copper lantern orbit glacier".split()


def synthetic_groups(
    tokenizer: Any,
    n_groups: int,
    group_size: int = 5,
    *,
    seed: int = 0,
    version: int = 0,
    think_words: int = 6,
    doc_words: int = 30,
    epoch: int = 0,
    start_index: int = 0,
) -> list[TrajectoryGroup]:
    """``n_groups`` groups of ``group_size`` trajectories sampled by policy ``version``."""
    rng = random.Random(seed)
    groups = []
    for gi in range(start_index, start_index + n_groups):
        gold = rng.choice(_WORDS)
        question = f"which word is number {gi}"
        p_ids = prompt_ids(tokenizer, question)
        trajs = []
        for k in range(group_size):
            b = TrajectoryBuilder()
            searches = rng.randint(1, 2)
            text = ""
            for s in range(searches):
                think = " ".join(rng.choice(_WORDS) for _ in range(think_words))
                turn = f"<think> {think} </think>\n<search> {question} part {s} </search>"
                ids = tokenizer.encode(turn, add_special_tokens=False)
                b.add_generated(ids, [-rng.uniform(0.05, 3.0) for _ in ids], version)
                docs = [
                    {"contents": f'"Doc {j}"\n' + " ".join(rng.choice(_WORDS) for _ in range(doc_words))}
                    for j in range(3)
                ]
                b.add_observation(observation_ids(tokenizer, docs))
                text += turn
            answer = gold if rng.random() < 0.5 else rng.choice(_WORDS)
            turn = f"<think> {rng.choice(_WORDS)} </think>\n<answer> {answer} </answer>"
            ids = tokenizer.encode(turn, add_special_tokens=False)
            b.add_generated(ids, [-rng.uniform(0.05, 3.0) for _ in ids], version)
            text += turn
            reward, em, ans = score_response(text, [gold])
            trajs.append(
                Trajectory(
                    trajectory_id=f"synthetic:{gi}:{epoch}:{k}",
                    sample_index=k,
                    prompt_ids=p_ids,
                    response_ids=b.response_ids,
                    logprobs=b.logprobs,
                    loss_mask=b.loss_mask,
                    versions=b.versions,
                    action_spans=b.action_spans,
                    answer_span=b.answer_span(tokenizer.decode),
                    reward=reward,
                    exact_match=em,
                    num_valid_searches=searches,
                    num_turns=searches + 1,
                    answer=ans,
                )
            )
        groups.append(
            TrajectoryGroup(
                group_id=f"synthetic:{gi}:{epoch}",
                prompt_id=f"synthetic:{gi}",
                question=question,
                gold_answers=[gold],
                trajectories=trajs,
                created_at=time.time(),
                producer="synthetic",
            )
        )
    return groups


@dataclass(frozen=True)
class TokenLayout:
    """Token counts of one synthetic trajectory: the prompt, ``search_turns`` x (generated turn +
    retrieved documents), then the generated answer turn."""

    prompt: int
    search_turns: int
    turn: int
    """Generated tokens of each search turn."""
    observation: int
    """Retrieved-document tokens after each search turn."""
    answer: int
    """Generated tokens of the final answer turn."""

    @property
    def total(self) -> int:
        """Tokens of the whole sequence (prompt + response)."""
        return self.prompt + self.search_turns * (self.turn + self.observation) + self.answer

    @property
    def loss_tokens(self) -> int:
        """Generated (trained) tokens."""
        return self.search_turns * self.turn + self.answer


ANSWER_SPAN_TOKENS = 8
"""Tokens of the ``<answer>...</answer>`` span at the end of a token-level trajectory's last turn."""


def synthetic_token_groups(
    vocab_size: int,
    layout: TokenLayout,
    n_groups: int,
    group_size: int = 5,
    *,
    seed: int = 0,
    version: int = 0,
) -> list[TrajectoryGroup]:
    """``n_groups`` groups of ``group_size`` trajectories of random token ids in ``layout``.

    Even sample indices are correct (reward 1), odd ones wrong, so every group of two or more has a
    non-zero advantage; the answer span is the last :data:`ANSWER_SPAN_TOKENS` tokens of the answer turn.
    """
    if min(layout.prompt, layout.answer) < 1 or min(layout.search_turns, layout.turn, layout.observation) < 0:
        raise ValueError(f"a trajectory needs a prompt and an answer turn: {layout}")
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(vocab_size) for _ in range(n)]

    def logprobs(n: int) -> list[float]:
        return [-rng.uniform(0.05, 3.0) for _ in range(n)]

    groups = []
    for gi in range(n_groups):
        p_ids = ids(layout.prompt)
        trajs = []
        for k in range(group_size):
            b = TrajectoryBuilder()
            for _ in range(layout.search_turns):
                b.add_generated(ids(layout.turn), logprobs(layout.turn), version)
                b.add_observation(ids(layout.observation))
            _, end = b.add_generated(ids(layout.answer), logprobs(layout.answer), version)
            reward = float(k % 2 == 0)
            trajs.append(
                Trajectory(
                    trajectory_id=f"synthetic-tokens:{gi}:{k}",
                    sample_index=k,
                    prompt_ids=p_ids,
                    response_ids=b.response_ids,
                    logprobs=b.logprobs,
                    loss_mask=b.loss_mask,
                    versions=b.versions,
                    action_spans=b.action_spans,
                    answer_span=(max(end - ANSWER_SPAN_TOKENS, end - layout.answer), end),
                    reward=reward,
                    exact_match=reward,
                    num_valid_searches=layout.search_turns,
                    num_turns=layout.search_turns + 1,
                )
            )
        groups.append(
            TrajectoryGroup(
                group_id=f"synthetic-tokens:{gi}",
                prompt_id=f"synthetic-tokens:{gi}",
                question=f"synthetic question {gi}",
                gold_answers=["synthetic"],
                trajectories=trajs,
                created_at=time.time(),
                producer="synthetic",
            )
        )
    return groups
