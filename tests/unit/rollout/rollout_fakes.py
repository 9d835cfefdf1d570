"""Fakes for the rollout unit tests: a scripted engine and an in-memory searcher."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llds_proto.messages import Document
from llds_rollout.engine.base import Engine, GenerationRequest, GenerationResult


class ScriptedEngine(Engine):
    """Returns the token ids of the next scripted turn text, with made-up log-probs; records everything."""

    def __init__(self, tokenizer: Any, turns: list[str], version: int = 0) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self._version = version
        self.requests: list[GenerationRequest] = []
        self.results: list[GenerationResult] = []

    @property
    def ready(self) -> bool:
        return True

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        text = self.turns.pop(0) if self.turns else "nothing useful"
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: request.max_tokens]
        res = GenerationResult(
            token_ids=ids,
            logprobs=[-0.1 * (i + 1) for i in range(len(ids))],
            version=self._version,
            finish_reason="stop" if text.endswith(("</search>", "</answer>")) else "length",
        )
        self.results.append(res)
        return res

    async def update_weights(self, tensors: Mapping[str, Any], folder: Path, version: int) -> None:
        self._version = version


class FakeSearcher:
    """Returns fixed documents and records the queries."""

    def __init__(self, docs: list[Document] | None = None) -> None:
        self.queries: list[str] = []
        self.docs = docs or [
            Document(id="1", contents='"Hamlet"\nHamlet is a tragedy by William Shakespeare.'),
            Document(id="2", contents='"Macbeth"\nMacbeth is another play.'),
        ]

    async def search(self, query: str, request_id: str | None = None) -> list[Document]:
        self.queries.append(query)
        return list(self.docs)


class ForcedModel:
    """Wraps a real causal LM and forces chosen tokens at chosen absolute positions.

    ``script[p] = t`` makes ``t`` the overwhelming choice for the token at position ``p`` (by adding a
    large bias to its logit), whatever the batch layout: the wrapper reads the position ids the engine
    passes, so it also checks that the engine's positions are right. Everything else is the real model.
    """

    def __init__(self, model: Any, script: dict[int, int]) -> None:
        self.model = model
        self.script = script

    def __call__(self, **kw: Any) -> Any:
        out = self.model(**kw)
        last = kw["position_ids"][:, -1].tolist()
        for row, p in enumerate(last):
            tok = self.script.get(p + 1)
            if tok is not None:
                out.logits[row, -1, tok] += 1000.0
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)
