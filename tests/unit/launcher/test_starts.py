"""Shipped starts: a LoRA adapter and a manifest, merged to the bytes the manifest names or refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from lora_kit import write_lora_adapter

from llds import starts
from llds_proto.digest import tensors_digest


@pytest.fixture()
def shipped(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A start folder ``toy`` over the tiny model, with a manifest whose digests were computed here."""
    from llds import assets
    from llds_trainer.adapter import merge_folder

    root = tmp_path / "adapters"
    folder = write_lora_adapter(
        tiny_model_dir, root / "toy", rank=2, alpha=4, targets=["q_proj", "v_proj"], b_scale=0.1
    )
    merged = merge_folder(tiny_model_dir, folder, tmp_path / "reference")
    manifest = {"name": "toy", "description": "test", "demonstrations": 2,
                "base": {"model": "tiny", "digest": tensors_digest(tiny_model_dir)},
                "adapter_digest": tensors_digest(folder), "merged_digest": tensors_digest(merged)}  # fmt: skip
    (folder / starts.MANIFEST).write_text(json.dumps(manifest))
    monkeypatch.setattr(starts, "ADAPTERS", root)
    monkeypatch.setattr(starts, "base_dir", lambda base: tiny_model_dir)
    monkeypatch.setattr(assets, "cache_dir", lambda: tmp_path / "cache")
    return folder


def test_a_start_merges_to_its_manifest_digest_and_is_cached(shipped: Path, tmp_path: Path) -> None:
    path = starts.policy_dir("toy")
    want = json.loads((shipped / starts.MANIFEST).read_text())["merged_digest"]
    assert tensors_digest(path) == want
    assert path.parent == tmp_path / "cache" / "models" and (path / "config.json").is_file()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert starts.policy_dir("toy") == path and (path / "model.safetensors").stat().st_mtime_ns == stamp
    # A damaged cache is noticed (digest checked at every use) and merged again.
    raw = bytearray((path / "model.safetensors").read_bytes())
    raw[-1] ^= 1
    (path / "model.safetensors").write_bytes(bytes(raw))
    assert tensors_digest(starts.policy_dir("toy")) == want


def test_a_merge_that_is_not_the_manifests_bytes_is_refused(shipped: Path) -> None:
    m = json.loads((shipped / starts.MANIFEST).read_text())
    (shipped / starts.MANIFEST).write_text(json.dumps(m | {"merged_digest": "0" * 64}))
    with pytest.raises(starts.StartError, match="not bit-identical"):
        starts.policy_dir("toy")
    (shipped / starts.MANIFEST).write_text(json.dumps(m | {"base": m["base"] | {"digest": "1" * 64}}))
    with pytest.raises(starts.StartError, match="another base"):
        starts.policy_dir("toy")


def test_unknown_starts_name_the_shipped_ones(shipped: Path) -> None:
    with pytest.raises(starts.StartError, match="shipped starts: toy"):
        starts.load("nope")
    from llds.up import UpConfig, _check_preset
    from llds_server.settings import ConfigError

    with pytest.raises(ConfigError, match="'nope' is not a shipped start"):
        _check_preset(UpConfig(start="nope"))
    _check_preset(UpConfig(start="toy"))


SHIPPED_KEYS = {"name", "description", "base", "world", "demonstrations", "command", "lora", "training",
                "adapter_digest", "merged_digest", "heldout"}  # fmt: skip


@pytest.mark.parametrize("name", starts.names())
def test_each_shipped_start_is_complete(name: str) -> None:
    start = starts.load(name)
    assert SHIPPED_KEYS <= set(start.manifest), SHIPPED_KEYS - set(start.manifest)
    assert tensors_digest(start.folder) == start.manifest["adapter_digest"]
    size = (start.folder / "adapter_model.safetensors").stat().st_size
    assert size < 16 * 2**20, f"{name}: adapter is {size} bytes; keep shipped starts small"
    rows = [json.loads(x) for x in (start.folder / starts.HELDOUT).read_text().splitlines()]
    assert len(rows) == start.manifest["heldout"]["n"]
    assert sum(r["em"] for r in rows) / len(rows) == pytest.approx(start.manifest["heldout"]["em"])


def test_the_default_start_is_shipped() -> None:
    assert starts.DEFAULT_START in starts.names()
    from llds.up import UpConfig

    assert UpConfig().start == starts.DEFAULT_START


@pytest.mark.parametrize("name", starts.names())
def test_each_shipped_starts_world_is_the_one_built_today(name: str, tmp_path: Path) -> None:
    """The world generator still builds the world the start was trained and evaluated on."""
    from llds import world

    m = starts.load(name).manifest
    world.build(tmp_path / "w", seed=m["world"]["seed"])
    assert starts.world_digest(tmp_path / "w") == m["world"]["digest"]


@pytest.mark.slow
@pytest.mark.parametrize("name", starts.names())
def test_every_shipped_start_merges_to_its_manifest_digest_here(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real thing: SmolLM2 from its package, the shipped adapter, float64 merge, the manifest's bytes
    (the default start and the study's headroom start alike)."""
    from llds import assets

    real = assets.cache_dir()
    monkeypatch.setattr(assets, "cache_dir", lambda: tmp_path)
    shutil.copytree(real / "models" / assets.SMOLLM2_NAME, tmp_path / "models" / assets.SMOLLM2_NAME) if (
        real / "models" / assets.SMOLLM2_NAME / ".complete"
    ).is_file() else None
    shutil.copytree(real / "tokenizers", tmp_path / "tokenizers") if (real / "tokenizers").is_dir() else None
    start = starts.load(name)
    path = starts.policy_dir(name)
    assert tensors_digest(path) == start.merged_digest
    assert tensors_digest(assets.smollm2_dir()) == start.manifest["base"]["digest"]


def test_paired_comparison_counts_discordant_questions_and_mcnemar() -> None:
    a = {"q1": 1.0, "q2": 1.0, "q3": 0.0, "q4": 1.0, "q5": 0.0}
    b = {"q1": 0.0, "q2": 0.0, "q3": 0.0, "q4": 1.0, "q5": 1.0}
    r = starts.paired(a, b)
    assert (r["n"], r["only_a"], r["only_b"]) == (5, 2, 1)
    assert r["em_a"] == pytest.approx(0.6) and r["em_b"] == pytest.approx(0.4)
    assert r["mcnemar_p"] == pytest.approx(1.0)  # 2 vs 1 discordant: 2 * P(X <= 1), X ~ Bin(3, 1/2) = 1
    r = starts.paired({f"q{i}": 1.0 for i in range(10)}, {f"q{i}": 0.0 for i in range(10)})
    assert r["mcnemar_p"] == pytest.approx(2 / 2**10)
    with pytest.raises(starts.StartError, match="different questions"):
        starts.paired(a, {"q1": 1.0})
