"""RetrieverConfig: precedence and cross-field rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from llds_retriever.cli import load_config
from llds_retriever.config import RetrieverConfig


def test_precedence_defaults_toml_env_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text('[retriever]\nport = 9001\nmax_batch = 8\ncache_size = 5\nindex_dir = "/idx"\n')
    monkeypatch.setenv("LLDS_RETRIEVER_MAX_BATCH", "16")
    monkeypatch.setenv("LLDS_RETRIEVER_CACHE_SIZE", "6")
    cfg = load_config(toml, {"cache_size": 7, "port": None})
    assert cfg.port == 9001  # TOML over default
    assert cfg.max_batch == 16  # env over TOML
    assert cfg.cache_size == 7  # flag over env
    assert cfg.index_dir == Path("/idx")
    assert cfg.max_wait_ms == RetrieverConfig().max_wait_ms


def test_invalid_combinations_are_rejected() -> None:
    with pytest.raises(ValidationError, match="faiss_index needs corpus"):
        RetrieverConfig(faiss_index=Path("x.index"))
    with pytest.raises(ValidationError, match="not both"):
        RetrieverConfig(faiss_index=Path("x.index"), corpus=Path("c"), index_dir=Path("i"))
    with pytest.raises(ValidationError, match="extra"):
        RetrieverConfig(max_bacth=3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="nothing to serve"):
        RetrieverConfig().require_source()


def test_flat_toml_and_system_toml_without_retriever_table(tmp_path: Path) -> None:
    flat = tmp_path / "flat.toml"
    flat.write_text("port = 9100\n")
    assert load_config(flat, {}).port == 9100
    system = tmp_path / "system.toml"
    system.write_text("[rollout]\nport = 8001\n")
    assert load_config(system, {}).port == 8000
