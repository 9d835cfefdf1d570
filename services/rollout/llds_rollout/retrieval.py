"""Async client of the retriever's Search-R1 ``POST /retrieve``, with a concurrency limit and retries."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx
from pydantic import ValidationError

from llds_proto.messages import Document, RetrieveRequest, RetrieveResponse, ScoredDocument

log = logging.getLogger("llds_rollout.retrieval")


class RetrieverError(RuntimeError):
    """The retriever failed after every retry; the message carries the last cause."""


class RetrieverClient:
    """One shared HTTP client; at most ``concurrency`` requests in flight toward the retriever."""

    def __init__(
        self,
        base_url: str,
        *,
        topk: int = 3,
        concurrency: int = 64,
        timeout_s: float = 10.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        on_latency: Callable[[float], None] | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.topk = topk
        self.retries = retries
        self.backoff_s = backoff_s
        self._sem = asyncio.Semaphore(concurrency)
        self._client = httpx.AsyncClient(
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )
        self._on_latency = on_latency
        self._on_error = on_error

    async def search(self, query: str, request_id: str | None = None) -> list[Document]:
        """Top-k documents for ``query``, best first; :class:`RetrieverError` after the last retry."""
        body = RetrieveRequest(queries=[query], topk=self.topk, return_scores=True, request_id=request_id)
        payload = body.model_dump(exclude_none=True)
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            t0 = time.perf_counter()
            try:
                async with self._sem:
                    resp = await self._client.post(f"{self.base_url}/retrieve", json=payload)
                if resp.status_code >= 500 or resp.status_code == 429:
                    last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                elif resp.status_code != 200:
                    # A 4xx will not get better by retrying: the request itself is wrong.
                    raise RetrieverError(
                        f"retriever rejected the query: HTTP {resp.status_code}: {resp.text[:200]}"
                    )
                else:
                    if self._on_latency is not None:
                        self._on_latency(time.perf_counter() - t0)
                    return _documents(RetrieveResponse.model_validate(resp.json()))
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
            except (ValidationError, ValueError) as e:
                last = f"malformed response: {e}"
            if self._on_error is not None:
                self._on_error(last.split(":")[0])
            log.warning(
                "retriever call failed attempt=%d request_id=%s cause=%s", attempt + 1, request_id, last
            )
        raise RetrieverError(f"retriever at {self.base_url} failed after {self.retries + 1} attempts: {last}")

    async def aclose(self) -> None:
        await self._client.aclose()


def _documents(resp: RetrieveResponse) -> list[Document]:
    if len(resp.result) != 1:
        raise RetrieverError(f"retriever answered {len(resp.result)} lists for one query")
    return [item.document if isinstance(item, ScoredDocument) else item for item in resp.result[0]]
