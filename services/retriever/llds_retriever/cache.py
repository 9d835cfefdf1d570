"""A thread-safe LRU cache of query results keyed by (query, topk)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


class LRUCache(Generic[V]):
    """At most ``capacity`` entries; the least recently read or written goes first."""

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._data: OrderedDict[tuple[str, int], V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, query: str, topk: int) -> V | None:
        """The cached value, or None (and the entry becomes the most recent)."""
        key = (query, topk)
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, query: str, topk: int, value: V) -> None:
        """Store ``value``; evicts the least recent entry when full."""
        if self.capacity == 0:
            return
        key = (query, topk)
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)
