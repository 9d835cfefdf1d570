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


def test_shapes_come_from_the_headers(tmp_path: Path) -> None:
    """What a vLLM replica checks before its swap, without reading a tensor into memory."""
    from llds_rollout.weights import read_shapes

    folder = _publish(tmp_path, 1)
    save_file({"b": torch.zeros(4), "c": torch.zeros(2, 2, 5)}, str(folder / "model-2.safetensors"))
    write_marker(folder, 1, step=3)
    pub = verify_published(tmp_path, "v000001", 1)
    assert read_shapes(pub) == {"w": (2, 3), "b": (4,), "c": (2, 2, 5)}
    assert read_shapes(pub) == {k: tuple(v.shape) for k, v in load_tensors(pub).items()}
    (folder / "model-2.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(WeightsError, match=r"model-2\.safetensors: not a readable safetensors file"):
        read_shapes(pub)


def test_identity_sees_a_file_rewritten_replaced_added_or_deleted(tmp_path: Path) -> None:
    from llds_rollout.weights import identity

    folder = _publish(tmp_path, 1)
    path = folder / "model.safetensors"
    before = identity(folder)
    assert set(before) == {"model.safetensors", "config.json", "COMPLETE"} and identity(folder) == before
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    with open(path, "r+b") as f:  # in place, same size
        f.write(bytes(data))
    assert identity(folder) != before
    before = identity(folder)
    path.with_name("new").write_bytes(bytes(data))
    os.replace(path.with_name("new"), path)
    assert identity(folder) != before
    before = identity(folder)
    (folder / "extra").write_text("x")
    assert identity(folder) != before
    before = identity(folder)
    (folder / "config.json").unlink()
    assert identity(folder) != before
    assert identity(tmp_path / "gone") == {}
