"""Shared fixtures: a real Redis server on loopback, the tiny test model, the synthetic world."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real valkey-server on a free loopback port, append-only persistence in a temp dir."""
    from llds.redis_server import RedisServer

    server = RedisServer(data_dir=tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def redis_url(redis_server: object) -> Iterator[str]:
    """URL of the session Redis server, flushed before each test."""
    import redis

    url: str = redis_server.url  # type: ignore[attr-defined]
    redis.Redis.from_url(url).flushall()
    yield url


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """A random-weight 2-layer Llama with SmolLM2's real tokenizer (built once into the cache)."""
    from llds.assets import tiny_model_dir as build

    return build()


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path):  # type: ignore[no-untyped-def]
    """SmolLM2's tokenizer (with its chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))
