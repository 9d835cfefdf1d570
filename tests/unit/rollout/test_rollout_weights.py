"""Published-folder verification: marker, sha256s, confinement to the weights root."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from llds_rollout.weights import WeightsError, load_tensors, verify_published, write_marker


def _publish(root: Path, version: int, marker: bool = True) -> Path:
    folder = root / f"v{version:06d}"
    folder.mkdir(parents=True)
    save_file({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    if marker:
        write_marker(folder, version, step=3)
    return folder


def test_accepts_a_complete_folder(tmp_path: Path) -> None:
    _publish(tmp_path, 1)
    pub = verify_published(tmp_path, "v000001", 1)
    assert (pub.version, pub.step, [p.name for p in pub.safetensors]) == (1, 3, ["model.safetensors"])
    assert load_tensors(pub)["w"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_rejects_missing_marker(tmp_path: Path) -> None:
    _publish(tmp_path, 1, marker=False)
    with pytest.raises(WeightsError, match="no COMPLETE marker"):
        verify_published(tmp_path, "v000001", 1)


def test_rejects_corrupt_file(tmp_path: Path) -> None:
    folder = _publish(tmp_path, 1)
    with (folder / "model.safetensors").open("r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\x00\x01\x02\x03")
    with pytest.raises(WeightsError, match="sha256"):
        verify_published(tmp_path, "v000001", 1)


def test_rejects_version_mismatch_and_unlisted_weights(tmp_path: Path) -> None:
    folder = _publish(tmp_path, 1)
    with pytest.raises(WeightsError, match="marker says version 1"):
        verify_published(tmp_path, "v000001", 2)
    save_file({"x": torch.zeros(1)}, str(folder / "extra.safetensors"))
    with pytest.raises(WeightsError, match="not covered"):
        verify_published(tmp_path, "v000001", 1)


def test_rejects_marker_without_files(tmp_path: Path) -> None:
    folder = _publish(tmp_path, 1)
    (folder / "COMPLETE").write_text(json.dumps({"version": 1, "files": {}}))
    with pytest.raises(WeightsError, match="lists no files"):
        verify_published(tmp_path, "v000001", 1)
    (folder / "COMPLETE").write_text(json.dumps({"version": 1, "files": {"../escape": "00"}}))
    with pytest.raises(WeightsError, match="bad marker entry"):
        verify_published(tmp_path, "v000001", 1)


@pytest.mark.parametrize("rel", ["../outside", "/etc", "v000001/../../outside", ".", "nope"])
def test_rejects_paths_outside_the_root(tmp_path: Path, rel: str) -> None:
    root = tmp_path / "root"
    _publish(root, 1)
    _publish(tmp_path / "outside", 1)
    with pytest.raises(WeightsError):
        verify_published(root, rel, 1)


def test_rejects_symlink_escapes(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = _publish(tmp_path / "elsewhere", 1)
    (root / "v000001").symlink_to(outside, target_is_directory=True)
    with pytest.raises(WeightsError, match="outside"):
        verify_published(root, "v000001", 1)
    folder = _publish(root, 2)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(outside / "model.safetensors")
    with pytest.raises(WeightsError, match="not a regular file"):
        verify_published(root, "v000002", 2)
