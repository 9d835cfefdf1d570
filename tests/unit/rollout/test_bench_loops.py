"""The rollout benchmark's loops do what they claim, on a fake engine: every plan runs exactly once,
tokens are counted exactly, the async loop keeps ``concurrency`` trajectories in flight, and the
synchronous loop waits for each batch's slowest trajectory turn by turn."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from llds_bench.rollout import Plan, Workload, ideal_speedup, make_plans, retriever_app, tok_s_at
from llds_rollout.engine.base import GenerationRequest, GenerationResult
from llds_server.http import BackgroundServer


class FakeEngine:
    """Returns ``max_tokens`` tokens after ``max_tokens`` ms; records calls and concurrency."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls: list[tuple[float, float, int]] = []  # (start, end, max_tokens)
        self.resets = 0

    async def reset_cache(self) -> None:
        self.resets += 1

    async def generate(self, req: GenerationRequest) -> GenerationResult:
        loop = asyncio.get_running_loop()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        t0 = loop.time()
        await asyncio.sleep(req.max_tokens / 1000)
        self.in_flight -= 1
        self.calls.append((t0, loop.time(), req.max_tokens))
        return GenerationResult([7] * req.max_tokens, [-1.0] * req.max_tokens, 0, "length")


@pytest.fixture(scope="module")
def retriever_url() -> Any:
    with BackgroundServer(retriever_app(0.0)) as srv:
        yield srv.url


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_every_plan_runs_once_and_tokens_are_counted(tokenizer: Any, retriever_url: str, mode: str) -> None:
    plans = make_plans(23, max_turns=3, lo=2, hi=9, seed=1)
    engine = FakeEngine()
    work = Workload(engine, tokenizer, retriever_url, obs_tokens=16)
    run = work.run_async if mode == "async" else work.run_sync
    _, tokens = asyncio.run(run(plans, 5))
    want = sorted(n for p in plans for n in p.tokens)
    # every context the engine saw is recorded for the replay: the prompt, then turns and observations
    assert sorted(n for _, n in work.requests) == want
    assert all(ctx[: len(work.prompt)] == work.prompt for ctx, _ in work.requests)
    assert tokens == sum(want)
    assert sorted(c[2] for c in engine.calls) == want
    assert engine.max_in_flight == 5  # never above the limit, and the limit is reached


def test_sync_batches_wait_for_their_slowest_turn(tokenizer: Any, retriever_url: str) -> None:
    plans = make_plans(8, max_turns=2, lo=2, hi=30, seed=3)
    engine = FakeEngine()
    work = Workload(engine, tokenizer, retriever_url, obs_tokens=16)
    asyncio.run(work.run_sync(plans, 4))
    first_batch_calls = sum(len(p.tokens) for p in plans[:4])
    first, second = engine.calls[:first_batch_calls], engine.calls[first_batch_calls:]
    assert max(c[1] for c in first) <= min(c[0] for c in second)  # batch 2 starts after batch 1 ends


def test_plain_replay_runs_the_same_requests(tokenizer: Any, retriever_url: str) -> None:
    engine = FakeEngine()
    work = Workload(engine, tokenizer, retriever_url, obs_tokens=16)
    _, tokens = asyncio.run(work.run_plain([([1] * 10, 3), ([2] * 40, 5), ([3] * 20, 2)], 2))
    assert tokens == 10 and engine.max_in_flight == 2 and engine.resets == 1


def test_ideal_speedup_models_the_turn_barrier() -> None:
    plans = [Plan([10]), Plan([30])]
    linear = {1: 100.0, 2: 200.0}  # a step costs the same whatever the batch (GPU-like)
    flat = {1: 100.0, 2: 100.0}  # a step costs twice as much with twice the rows (compute-bound)
    # sync: 10 steps with 2 rows, then 20 with the slow one alone; async: 40 tokens at 2 rows
    assert ideal_speedup(plans, 2, linear, 0.0) == pytest.approx(30 / 20)
    assert ideal_speedup(plans, 2, flat, 0.0) == pytest.approx(1.0)
    assert ideal_speedup([Plan([20]), Plan([20])], 2, linear, 0.0) == pytest.approx(1.0)
    # a search turn adds one retrieval to the synchronous loop only
    assert ideal_speedup([Plan([10, 10])], 1, {1: 100.0}, 0.1) == pytest.approx((0.2 + 0.1) / 0.2)


def test_tok_s_interpolates_in_log_batch() -> None:
    assert tok_s_at({1: 10.0, 4: 30.0}, 2) == pytest.approx(20.0)
    assert tok_s_at({1: 10.0, 4: 30.0}, 64) == 30.0 and tok_s_at({2: 10.0}, 1) == 10.0
