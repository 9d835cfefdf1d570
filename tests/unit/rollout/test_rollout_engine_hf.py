"""The transformers backend: sampling maths, continuous batching, stop rules, weight swaps."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from rollout_fakes import ForcedModel

from llds_rollout.engine.base import EngineError, GenerationRequest, WeightLoadError
from llds_rollout.engine.hf import TransformersEngine, check_tensors, sample_tokens

STOPS = ("</search>", "</answer>")


def test_sample_tokens_greedy_and_temperature_logprobs() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    tok, lp = sample_tokens(
        logits, torch.tensor([0.0, 2.0]), torch.tensor([1.0, 1.0]), torch.Generator().manual_seed(0)
    )
    assert tok[0] == 2
    assert lp[0].item() == pytest.approx(3 - math.log(math.e + math.e**2 + math.e**3), abs=1e-6)
    scaled = [0.5, 1.0, 1.5]
    expect = scaled[int(tok[1])] - math.log(sum(math.exp(x) for x in scaled))
    assert lp[1].item() == pytest.approx(expect, abs=1e-6)


def test_top_p_keeps_the_nucleus_only() -> None:
    logits = torch.log(torch.tensor([[0.6, 0.25, 0.15]])).repeat(400, 1)
    g = torch.Generator().manual_seed(0)
    tok, lp = sample_tokens(logits, torch.ones(400), torch.full((400,), 0.7), g)
    assert set(tok.tolist()) == {0, 1}
    # the log-prob is under the renormalised nucleus it was sampled from
    assert lp[tok == 1][0].item() == pytest.approx(math.log(0.25 / 0.85), abs=1e-5)
    assert lp[tok == 0][0].item() == pytest.approx(math.log(0.6 / 0.85), abs=1e-5)
    tok, _ = sample_tokens(logits, torch.ones(400), torch.full((400,), 0.5), g)
    assert set(tok.tolist()) == {0}


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[TransformersEngine]:
    e = TransformersEngine(str(tiny_model_dir), max_batch_size=8)
    e.start()
    yield e
    e.shutdown()


def _gen(engine: TransformersEngine, reqs: list[GenerationRequest], stagger_s: float = 0.0) -> list[Any]:
    async def one(i: int, r: GenerationRequest) -> Any:
        await asyncio.sleep(stagger_s * i)
        return await engine.generate(r)

    async def main() -> list[Any]:
        return await asyncio.gather(*[one(i, r) for i, r in enumerate(reqs)])

    return asyncio.run(main())


def test_continuous_batching_matches_one_at_a_time(engine: TransformersEngine) -> None:
    tok = engine.tokenizer
    prompts = [tok.encode(s) for s in ["hello", "a longer prompt about cats, dogs and birds", "x y", "what?"]]
    reqs = [GenerationRequest(p, max_tokens=20 + 3 * i, temperature=0.0) for i, p in enumerate(prompts)]
    alone = [_gen(engine, [r])[0] for r in reqs]
    # staggered arrivals join a running batch; rows of different lengths leave at different steps
    together = _gen(engine, reqs, stagger_s=0.01)
    for a, b, r in zip(alone, together, reqs, strict=True):
        assert a.token_ids == b.token_ids and len(a.token_ids) == r.max_tokens
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
        assert a.finish_reason == "length" and a.version == 0


def test_logprobs_match_a_plain_forward(engine: TransformersEngine) -> None:
    tok = engine.tokenizer
    prompt = tok.encode("the quick brown fox")
    res = _gen(engine, [GenerationRequest(prompt, max_tokens=6, temperature=1.0)])[0]
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([prompt + res.token_ids])).logits[0]
    ref = torch.log_softmax(logits.float(), -1)
    for i, (t, lp) in enumerate(zip(res.token_ids, res.logprobs, strict=True)):
        assert ref[len(prompt) - 1 + i, t].item() == pytest.approx(lp, abs=1e-4)


@pytest.fixture()
def forced(engine: TransformersEngine) -> Iterator[Any]:
    real = engine.model

    def force(prompt: list[int], text_ids: list[int]) -> None:
        engine.model = ForcedModel(real, {len(prompt) + i: t for i, t in enumerate(text_ids)})

    yield force
    engine.model = real


def test_stop_string_ends_the_output_and_stays_in_it(engine: TransformersEngine, forced: Any) -> None:
    tok = engine.tokenizer
    prompt = tok.encode("question")
    script = tok.encode(
        "<think> hm </think><search> paris </search> and more text after it", add_special_tokens=False
    )
    forced(prompt, script)
    res = _gen(engine, [GenerationRequest(prompt, max_tokens=60, temperature=1.0, stop=STOPS)])[0]
    assert tok.decode(res.token_ids).endswith("</search>")
    assert res.token_ids == script[: len(res.token_ids)]
    assert (res.finish_reason, res.stop_str) == ("stop", "</search>")
    # without stop strings the same script runs on to the token budget
    res = _gen(engine, [GenerationRequest(prompt, max_tokens=len(script), temperature=1.0)])[0]
    assert res.token_ids == script and res.finish_reason == "length"


def test_eos_is_kept_and_ends_the_output(engine: TransformersEngine, forced: Any) -> None:
    tok = engine.tokenizer
    prompt = tok.encode("question")
    forced(prompt, [*tok.encode(" fine", add_special_tokens=False), tok.eos_token_id])
    res = _gen(engine, [GenerationRequest(prompt, max_tokens=30, temperature=0.0, stop=STOPS)])[0]
    assert res.token_ids[-1] == tok.eos_token_id and res.finish_reason == "eos"


def test_swap_waits_for_in_flight_requests(engine: TransformersEngine) -> None:
    tok = engine.tokenizer
    prompt = tok.encode("swap me")
    req = GenerationRequest(prompt, max_tokens=12, temperature=0.0)
    before = _gen(engine, [req])[0]
    old = {k: v.clone() for k, v in engine.model.state_dict().items() if k != "lm_head.weight"}
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in old.items()}

    async def main() -> tuple[Any, Any]:
        long = asyncio.create_task(
            engine.generate(GenerationRequest(prompt, max_tokens=150, temperature=0.0))
        )
        await asyncio.sleep(0.05)
        await engine.update_weights(new, Path("."), version=engine.version + 1)
        after = await engine.generate(req)
        return await long, after

    try:
        long, after = asyncio.run(main())
        assert long.version == before.version and len(long.token_ids) == 150
        assert long.token_ids[:12] == before.token_ids  # all of it on the old weights
        assert after.version == before.version + 1
        assert after.logprobs != before.logprobs
    finally:
        asyncio.run(engine.update_weights(old, Path("."), version=engine.version + 1))
    assert _gen(engine, [req])[0].logprobs == pytest.approx(before.logprobs, abs=1e-6)


def test_check_tensors_rejects_mismatches(engine: TransformersEngine) -> None:
    sd = {k: v for k, v in engine.model.state_dict().items() if k != "lm_head.weight"}
    check_tensors(engine.model, sd)  # tied lm_head may be absent
    with pytest.raises(WeightLoadError, match="missing"):
        check_tensors(engine.model, {k: v for k, v in sd.items() if "layers.1." not in k})
    with pytest.raises(WeightLoadError, match="not in the model"):
        check_tensors(engine.model, {**sd, "extra.weight": torch.zeros(2)})
    with pytest.raises(WeightLoadError, match="shape"):
        check_tensors(engine.model, {**sd, "model.norm.weight": torch.zeros(3)})


def test_requests_fail_clearly_when_not_loaded(tiny_model_dir: Path) -> None:
    e = TransformersEngine(str(tiny_model_dir))
    with pytest.raises(EngineError, match="not loaded"):
        asyncio.run(e.generate(GenerationRequest([1, 2], max_tokens=2)))


def _forward_logprobs(engine: TransformersEngine, prompt: list[int], ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([prompt + ids])).logits[0]
    ref = torch.log_softmax(logits.float(), -1)
    return [ref[len(prompt) - 1 + i, t].item() for i, t in enumerate(ids)]


@pytest.mark.parametrize("mode", ["inflight", "abort"])
def test_a_swap_reaches_running_requests_and_every_token_records_its_version(
    engine: TransformersEngine, mode: str
) -> None:
    tok = engine.tokenizer
    prompt = tok.encode("swap me while you talk")
    n = 160
    old = {k: v.clone() for k, v in engine.model.state_dict().items() if k != "lm_head.weight"}
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in old.items()}
    v0 = engine.version
    alone = _gen(engine, [GenerationRequest(prompt, max_tokens=n, temperature=0.0)])[0]

    async def main() -> Any:
        start = engine.stats()["generated_tokens"]
        running = asyncio.create_task(
            engine.generate(GenerationRequest(prompt, max_tokens=n, temperature=0.0))
        )
        while engine.stats()["generated_tokens"] < start + 20:  # well into the request
            await asyncio.sleep(0.001)
        await engine.update_weights(new, Path("."), version=v0 + 1)
        return await running

    engine.swap_mode = mode
    try:
        res = asyncio.run(main())
        k = res.versions.index(v0 + 1)  # the first token the new weights sampled
        assert 20 <= k < n and res.versions == [v0] * k + [v0 + 1] * (n - k) and res.version == v0
        assert res.token_ids[:k] == alone.token_ids[:k]  # greedy: the old weights' own tokens
        assert res.logprobs[:k] == pytest.approx(alone.logprobs[:k], abs=1e-4)
        after = _forward_logprobs(engine, prompt, res.token_ids)[k:]  # under the new weights
        if mode == "abort":  # resumed from its last token: its cache recomputed, exact under v0 + 1
            assert res.logprobs[k:] == pytest.approx(after, abs=1e-4)
        else:  # continued at once on the old weights' cache: the new weights, not the old ones
            assert res.logprobs[k] != pytest.approx(alone.logprobs[k], abs=1e-4)
    finally:
        engine.swap_mode = "drain"
        asyncio.run(engine.update_weights(old, Path("."), version=engine.version + 1))
