"""Exactness on the vLLM engine: real multi-turn training trajectories of the rollout service on vLLM
(through a real retriever and Redis), scored by the trainer's collation and pi_old pass: the trainer's
log-probs equal vLLM's on every loss token (``TOLERANCES["vllm"]``), observation tokens are never
scored and never enter the loss, and the loss mask is exactly the agent's observation spans.
The checks and the reasoning behind the tolerance live in ``test_exactness.py``.

Needs vLLM: ``make test`` runs this file in ``.venv-vllm`` (make test-vllm); the main environment
skips it. One engine start (~1 min).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from test_exactness import (
    QUERY,
    check_collation_alignment,
    check_exactness,
    check_observation_spans,
    check_observations_never_enter_the_loss,
    logprob_deltas,
    produce_groups,
    searching_model,
)

from llds_proto.messages import TrajectoryGroup

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not importable in this environment; `make test` runs these in .venv-vllm (make test-vllm)",
    ),
]


@pytest.fixture(scope="module")
def searcher_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return searching_model(tiny_model_dir, tmp_path_factory.mktemp("searcher"), QUERY)


@pytest.fixture(scope="module")
def vllm_groups(
    searcher_dir: Path, redis_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[TrajectoryGroup]]:
    url = redis_server.url
    redis.Redis.from_url(url).flushall()
    engine = {"type": "vllm", "max_batch_size": 8, "max_model_len": 1024, "openai_api": False}
    yield produce_groups(searcher_dir, engine, url, tmp_path_factory.mktemp("vllm"), 2, 400.0)


def test_vllm_trajectories_are_multi_turn_and_the_mask_is_the_observation_spans(
    vllm_groups: list[TrajectoryGroup], tokenizer: Any
) -> None:
    assert check_observation_spans(vllm_groups, tokenizer) >= len(vllm_groups)
    assert any(t.num_valid_searches >= 1 and t.num_turns >= 2 for g in vllm_groups for t in g.trajectories)
    check_collation_alignment(vllm_groups, pad_id=tokenizer.pad_token_id or 0)


def test_vllm_trainer_logprobs_equal_the_samplers_on_every_loss_token(
    vllm_groups: list[TrajectoryGroup], searcher_dir: Path, tmp_path: Path
) -> None:
    check_exactness(logprob_deltas(vllm_groups, searcher_dir, tmp_path), "vllm")


def test_vllm_observation_tokens_never_enter_the_loss(
    vllm_groups: list[TrajectoryGroup], searcher_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_observations_never_enter_the_loss(vllm_groups, searcher_dir, tmp_path, monkeypatch)
