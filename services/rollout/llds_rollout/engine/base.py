"""The engine-backend interface every inference backend implements.

A backend takes token-id prompts and returns the token ids it sampled with their sampling
log-probs and the weights version that sampled them. Requests from many concurrent conversations
are batched by the backend. How a weight swap meets running requests is the engine's ``swap_mode``:
``drain`` swaps between requests (every token of a result comes from one version), ``inflight``
pauses between decoding steps and lets running requests continue on the new weights, ``abort``
stops them and resumes them from their last token on the new weights; the last two record, for
every token, the version that sampled it.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

FinishReason = Literal["stop", "eos", "length"]


class EngineError(RuntimeError):
    """The engine cannot serve a request (not loaded, stopped, or crashed); the message says why."""


class WeightLoadError(ValueError):
    """Weights that cannot be loaded into this engine (wrong names, shapes or dtypes)."""


class WeightSwapError(RuntimeError):
    """A weight swap failed after it began changing the served weights (or its files changed under
    it): no whole version is serving, so the engine serves nothing until one loads (-> HTTP 502)."""


@dataclass(frozen=True)
class GenerationRequest:
    """One generation call: continue ``prompt_ids`` for at most ``max_tokens`` tokens."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    """Stop strings; the one that ends the output stays in it."""
    request_id: str = ""


@dataclass
class GenerationResult:
    """What the engine produced for one request."""

    token_ids: list[int]
    logprobs: list[float]
    """Log-prob of each sampled token under the distribution it was sampled from: softmax of the
    temperature-scaled logits renormalised over the top-p nucleus (raw logits when greedy)."""
    version: int
    """Weights version the request started on (that produced its first token)."""
    finish_reason: FinishReason
    stop_str: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    token_versions: list[int] = field(default_factory=list)
    """Version that sampled each token (a swap in ``inflight`` or ``abort`` mode may fall inside a
    request); empty means ``version`` for every token."""

    @property
    def versions(self) -> list[int]:
        """One version per token."""
        return self.token_versions or [self.version] * len(self.token_ids)


class Engine(abc.ABC):
    """An inference backend. ``start`` loads the model; ``generate`` may be awaited concurrently."""

    reads_folder: bool = False
    """True for a backend that loads a published folder from disk itself: it gets the tensors'
    shapes (from the safetensors headers) instead of the tensors."""

    def __init__(self) -> None:
        self._version = 0
        self._failed: str | None = None

    @property
    def version(self) -> int:
        """Weights version serving now."""
        return self._version

    @property
    def failed(self) -> str | None:
        """Why this engine serves nothing (a swap that failed mid-way); None while it serves."""
        return self._failed

    def mark_failed(self, why: str, version: int | None = None) -> None:
        """Stop serving: the weights are not one whole version. A later whole swap clears it.
        ``version``: the last version that was whole, so that loading the failed one again counts
        as newer (the catch-up retries it)."""
        self._failed = why
        if version is not None:
            self._version = version

    @property
    @abc.abstractmethod
    def ready(self) -> bool:
        """True once a model is loaded and requests are served."""

    @abc.abstractmethod
    def start(self) -> None:
        """Load the model and start serving (blocking; call from a thread in async code)."""

    @abc.abstractmethod
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Run one request; batched with whatever else is in flight."""

    @abc.abstractmethod
    async def update_weights(self, tensors: Mapping[str, Any], folder: Path, version: int) -> None:
        """Swap in verified weights between requests and serve them as ``version``.

        ``tensors`` are the folder's tensors already read and verified, or, for a backend that
        ``reads_folder`` itself, their shapes (name -> tuple). A :class:`WeightLoadError` leaves the
        old weights serving; a failure after the swap began changing them is a
        :class:`WeightSwapError` with the engine marked :attr:`failed`. A whole swap clears
        :attr:`failed`.
        """

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop serving; pending requests fail with :class:`EngineError`."""

    def stats(self) -> dict[str, float]:
        """Backend counters for /health and benchmarks."""
        return {}

    def metrics_text(self) -> bytes:
        """The backend's own Prometheus metrics (exposition text) served after the service's on
        ``/metrics``; empty when it has none."""
        return b""

    async def reset_cache(self) -> None:
        """Drop cached prefixes (benchmarks start from a cold cache); no-op without a prefix cache."""
        return None

    @property
    def openai_asgi(self) -> Any:
        """ASGI callable serving the OpenAI-compatible ``/v1/`` routes, or None (not offered by
        this backend, disabled, or not loaded yet)."""
        return None
