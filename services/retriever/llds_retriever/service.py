"""The retriever's logic without the web layer: cache, micro-batched search, Search-R1 response bytes."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from llds_retriever.batcher import MicroBatcher
from llds_retriever.cache import LRUCache
from llds_retriever.config import RetrieverConfig
from llds_retriever.loader import Loaded
from llds_retriever.metrics import RetrieverMetrics

log = logging.getLogger("llds.retriever")


@dataclass(frozen=True)
class QueryResult:
    """Ranked hits of one query."""

    rows: tuple[int, ...]
    """Corpus rows, best first."""
    scores: tuple[float, ...]
    """Their scores (float32 values as Python floats, as Search-R1 sends them)."""
    truncated: bool
    """Whether the encoder cut the query."""


def _extra(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class RetrieverService:
    """Answers queries from a loaded backend through the cache and the micro-batcher."""

    def __init__(self, loaded: Loaded, config: RetrieverConfig, metrics: RetrieverMetrics):
        self.backend = loaded.backend
        self.corpus = loaded.corpus
        self.source = loaded.source
        self.config = config
        self.metrics = metrics
        self.cache: LRUCache[QueryResult] = LRUCache(config.cache_size)
        self.batcher: MicroBatcher[tuple[str, int], QueryResult] = MicroBatcher(
            self.search_batch,
            max_batch=config.max_batch,
            max_wait_s=config.max_wait_ms / 1000.0,
            max_queue=config.max_queue,
            retry_after_s=config.retry_after_s,
            on_batch=metrics.batch_size.observe,
        )

    def search_batch(self, items: list[tuple[str, int]]) -> list[QueryResult]:
        """One backend call for a batch of (query, topk); repeated queries are searched once."""
        unique = list(dict.fromkeys(q for q, _ in items))
        k = max(k for _, k in items)
        hits = self.backend.search(unique, k)
        pos = {q: i for i, q in enumerate(unique)}
        out = []
        for q, topk in items:
            i = pos[q]
            rows = hits.rows[i, :topk]
            keep = rows >= 0
            out.append(
                QueryResult(
                    rows=tuple(rows[keep].tolist()),
                    scores=tuple(hits.scores[i, :topk][keep].tolist()),
                    truncated=bool(hits.truncated[i]),
                )
            )
        return out

    async def retrieve(self, queries: list[str], topk: int) -> list[QueryResult]:
        """Results for ``queries`` in order: cached ones at once, the rest via a shared batch."""
        results: list[QueryResult | None] = [None] * len(queries)
        misses = []
        for i, q in enumerate(queries):
            cached = self.cache.get(q, topk)
            if cached is None:
                misses.append(i)
            else:
                results[i] = cached
        self.metrics.cache_hits.inc(len(queries) - len(misses))
        if misses:
            self.metrics.cache_misses.inc(len(misses))
            self.metrics.queue_depth.set(self.batcher.in_flight + len(misses))
            try:
                found = await self.batcher.submit([(queries[i], topk) for i in misses])
            finally:
                self.metrics.queue_depth.set(self.batcher.in_flight)
            for i, res in zip(misses, found, strict=True):
                results[i] = res
                self.cache.put(queries[i], topk, res)
        final = [r for r in results if r is not None]
        self.metrics.queries.inc(len(final))
        self.metrics.truncated.inc(sum(r.truncated for r in final))
        return final

    def render(self, results: list[QueryResult], return_scores: bool, extras: dict[str, Any] | None) -> bytes:
        """The response body: Search-R1's ``{"result": ...}`` bytes, then any extra fields."""
        doc = self.corpus.doc_json
        lists = []
        for r in results:
            if return_scores:
                items = [
                    b'{"document":' + doc(row) + b',"score":' + repr(score).encode() + b"}"
                    for row, score in zip(r.rows, r.scores, strict=True)
                ]
            else:
                items = [doc(row) for row in r.rows]
            lists.append(b"[" + b",".join(items) + b"]")
        body = b'{"result":[' + b",".join(lists) + b"]"
        for key, value in (extras or {}).items():
            body += b',"' + key.encode() + b'":' + _extra(value)
        return body + b"}"
