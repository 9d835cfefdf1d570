"""RetrieverConfig: precedence and cross-field rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from llds_retriever.cli import load_config, serve_parser
from llds_retriever.config import AutoBackendConfig, BM25BackendConfig, DenseBackendConfig, RetrieverConfig
from llds_server.cli import settings_overrides


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


def test_the_backend_section_picks_its_variant_from_toml_env_and_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = tmp_path / "own.toml"
    own.write_text('port = 9100\n[backend]\ntype = "hybrid"\nrrf_k = 10\n')
    cfg = load_config(own, {})
    assert (cfg.port, cfg.backend.type, cfg.backend.rrf_k) == (9100, "hybrid", 10)  # a flat file with a table
    monkeypatch.setenv("LLDS_RETRIEVER_BACKEND__TORCH_THREADS", "1")
    args = serve_parser().parse_args(["--config", str(own), "--type", "dense", "--backend.ivf-nprobe", "8"])
    cfg = load_config(own, settings_overrides(args, RetrieverConfig))
    assert (cfg.backend.type, cfg.backend.ivf_nprobe, cfg.backend.torch_threads) == ("dense", 8, 1)
    assert RetrieverConfig().backend.type == "auto"
    with pytest.raises(ValidationError, match=r"bm25\.ivf_nprobe\n\s+Extra inputs are not permitted"):
        RetrieverConfig(backend={"type": "bm25", "ivf_nprobe": 8})


def test_auto_becomes_the_indexs_kind_with_the_knobs_that_kind_has() -> None:
    auto = AutoBackendConfig(ivf_nprobe=8, rrf_k=10)
    dense = auto.resolve("dense")
    assert (type(dense), dense.ivf_nprobe) == (DenseBackendConfig, 8)
    assert auto.resolve("hybrid").rrf_k == 10
    assert auto.resolve("bm25") == BM25BackendConfig()


def test_flat_settings_of_earlier_releases_name_where_they_moved() -> None:
    with pytest.raises(
        ValidationError, match=r"ivf_nprobe \(now backend\.ivf_nprobe\), rrf_k \(now backend\.rrf_k\)"
    ):
        RetrieverConfig(ivf_nprobe=8, rrf_k=3)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match=r"can only serve backend.type = dense"):
        RetrieverConfig(faiss_index=Path("x.index"), corpus=Path("c"), backend="hybrid")
