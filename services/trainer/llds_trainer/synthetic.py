"""Synthetic trajectory groups in the rollout's exact token layout, for the benchmark and tests.

Each trajectory is a real Search-R1 conversation assembled with
:class:`llds_proto.search_protocol.TrajectoryBuilder`: a think+search turn, a retrieved-documents
observation, an optional second search, then a think+answer turn whose answer is right or wrong at
random (reward = exact match). Sampler log-probs are random negatives: the trainer recomputes pi_old
itself, and the mismatch it reports is then large by design.
"""

from __future__ import annotations

import random
import time
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
