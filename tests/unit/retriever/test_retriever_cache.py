"""LRU cache keyed by (query, topk)."""

from __future__ import annotations

from llds_retriever.cache import LRUCache


def test_lru_evicts_least_recent() -> None:
    c: LRUCache[str] = LRUCache(2)
    c.put("a", 3, "A3")
    c.put("b", 3, "B3")
    assert c.get("a", 3) == "A3"  # a is now the most recent
    c.put("c", 3, "C3")
    assert c.get("b", 3) is None
    assert c.get("a", 3) == "A3"
    assert c.get("c", 3) == "C3"
    assert len(c) == 2


def test_topk_is_part_of_the_key_and_zero_capacity_stores_nothing() -> None:
    c: LRUCache[str] = LRUCache(4)
    c.put("q", 3, "three")
    assert c.get("q", 5) is None
    off: LRUCache[str] = LRUCache(0)
    off.put("q", 3, "x")
    assert off.get("q", 3) is None
