"""The released layout on vLLM: the tiny Qwen2.5 (bf16 shards + index, the real Qwen2.5 tokenizer)
serves what the transformers backend serves, reloads the trainer's multi-shard publish in place, and
``llds answer --model DIR`` sends it the Search-R1 base-model prompt byte for byte.

Needs vLLM: ``make test`` runs this file in ``.venv-vllm`` (see the Makefile's ``test-vllm``); the main
environment skips it. Two engine starts of ~1 min each.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_qwen_release import QUESTION, SEARCH_R1_BASE_PROMPT
from test_rollout_cli import hamlet_retriever
from test_rollout_vllm import _run, engine_pair

from llds_rollout.engine.base import GenerationRequest
from llds_rollout.engine.hf import TransformersEngine
from llds_server.http import BackgroundServer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not importable in this environment; `make test` runs these in .venv-vllm (make test-vllm)",
    ),
]


@pytest.fixture(scope="module")
def release_dir() -> Path:
    from llds.assets import tiny_qwen_dir

    return tiny_qwen_dir()


@pytest.fixture()
def engines(release_dir: Path) -> Iterator[tuple[Any, TransformersEngine]]:
    yield from engine_pair(release_dir)


def _agree(a: Any, b: Any) -> None:
    assert a.token_ids == b.token_ids
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-3


def test_a_sharded_publish_reloads_in_place(engines: Any, release_dir: Path, tmp_path: Path) -> None:
    """The sharded bf16 release loads as the transformers backend loads it; the trainer's float32
    publish in 20 MB shards (embedding in one, layers in another) swaps in, tied lm_head included."""
    from transformers import AutoModelForCausalLM

    from llds_rollout.weights import load_tensors, verify_published
    from llds_trainer.publish import publish_folder

    v, h = engines
    req = GenerationRequest(
        h.tokenizer.encode(SEARCH_R1_BASE_PROMPT.decode()), max_tokens=16, temperature=0.0
    )
    (before,) = _run(v, [req])
    _agree(before, _run(h, [req])[0])

    model = AutoModelForCausalLM.from_pretrained(release_dir, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    folder = publish_folder(model, h.tokenizer, tmp_path, 1, step=1, keep=1, max_shard_mb=20)
    pub = verify_published(tmp_path, folder.name, 1)
    assert len(pub.safetensors) >= 2
    tensors = load_tensors(pub)

    async def swap(engine: Any) -> None:
        await engine.update_weights(tensors, pub.folder, 1)

    asyncio.run(swap(v))
    asyncio.run(swap(h))
    (a,), (b,) = _run(v, [req]), _run(h, [req])
    assert a.version == b.version == 1 and a.logprobs != before.logprobs
    _agree(a, b)


def test_answer_on_vllm_sends_the_search_r1_base_prompt(
    release_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``llds answer --model DIR`` on the vLLM engine (the default): the engine's first request is the
    spec's prompt, byte for byte."""
    from transformers import AutoTokenizer

    from llds_rollout.cli import answer_main
    from llds_rollout.engine.vllm import VLLMEngine

    sent: list[list[int]] = []
    generate = VLLMEngine.generate

    async def spy(self: VLLMEngine, request: Any) -> Any:
        sent.append(list(request.prompt_ids))
        return await generate(self, request)

    monkeypatch.setattr(VLLMEngine, "generate", spy)
    with BackgroundServer(hamlet_retriever()) as retriever:
        code = answer_main(["--model", str(release_dir), "--retriever-url", retriever.url, "--max-turns", "1",
                            "--max-tokens-per-turn", "8", "--engine.max-model-len", "1024", "--json",
                            QUESTION])  # fmt: skip
    assert code == 0
    body = json.loads(capsys.readouterr().out)
    assert body["weights_version"] == 0 and body["turns"]
    tok = AutoTokenizer.from_pretrained(release_dir)
    assert sent and tok.decode(sent[0]).encode() == SEARCH_R1_BASE_PROMPT
    assert sent[0] == tok.encode(SEARCH_R1_BASE_PROMPT.decode(), add_special_tokens=False)
