"""Typed errors of the retriever; the HTTP and CLI edges turn them into messages and status codes."""

from __future__ import annotations


class RetrieverError(Exception):
    """Base of every error the retriever raises on purpose."""


class CorpusError(RetrieverError):
    """A corpus file is missing, malformed, or does not match its index."""


class IndexFormatError(RetrieverError):
    """An index folder or file is missing, incomplete, or inconsistent."""


class EncoderError(RetrieverError):
    """An encoder cannot be loaded or configured."""


class SaturatedError(RetrieverError):
    """The admission queue is full; the client should retry after ``retry_after_s``."""

    def __init__(self, queued: int, capacity: int, retry_after_s: int):
        super().__init__(f"retriever saturated: {queued} queries queued, capacity {capacity}")
        self.retry_after_s = retry_after_s


class NotReadyError(RetrieverError):
    """The index is still loading (or failed to load)."""
