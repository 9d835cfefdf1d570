"""Which weights a model folder holds: a SHA-256 over its tensors, not over its files.

Two folders with the same tensors (names, dtypes, shapes, bytes) have the same digest whatever wrote
them (a safetensors header's key order or metadata, the sharding, a transformers version), and a
single changed bit changes it. It reads the safetensors format itself (an 8-byte little-endian header
length, a JSON header of ``name -> {dtype, shape, data_offsets}``, then the data), so it needs
neither torch nor numpy. Used to pin a study's starting policy and to check a shipped start.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import BinaryIO

SHORT = 16
"""Hex digits of the short form shown in step logs, manifests and reports."""


class DigestError(ValueError):
    """The folder holds no safetensors weights, or a file is not valid safetensors."""


def _header(f: BinaryIO) -> tuple[dict, int]:
    raw = f.read(8)
    if len(raw) != 8:
        raise DigestError(f"{f.name}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw)
    if n > 100 * 1024 * 1024:
        raise DigestError(f"{f.name}: header length {n} is not plausible")
    try:
        header = json.loads(f.read(n))
    except ValueError as e:
        raise DigestError(f"{f.name}: header is not JSON: {e}") from e
    if not isinstance(header, dict):
        raise DigestError(f"{f.name}: header is not a JSON object")
    return header, 8 + n


def tensor_shapes(path: str | Path) -> dict[str, list[int]]:
    """Each tensor's shape in one ``.safetensors`` file, from its header alone (no data read)."""
    with Path(path).open("rb") as f:
        header, _ = _header(f)
    return {name: list(meta["shape"]) for name, meta in header.items() if name != "__metadata__"}


def tensors_digest(folder: str | Path) -> str:
    """SHA-256 (hex) over every tensor of the ``*.safetensors`` files in ``folder``, in name order:
    each tensor's name, dtype, shape and raw bytes."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise DigestError(f"{folder} holds no *.safetensors file")
    where: dict[str, tuple[Path, int, dict]] = {}
    for path in files:
        with path.open("rb") as f:
            header, base = _header(f)
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            if name in where:
                raise DigestError(f"tensor {name!r} is in both {where[name][0].name} and {path.name}")
            where[name] = (path, base, meta)
    h = hashlib.sha256()
    for name in sorted(where):
        path, base, meta = where[name]
        start, end = meta["data_offsets"]
        h.update(f"{name}\0{meta['dtype']}\0{list(meta['shape'])}\0".encode())
        with path.open("rb") as f:
            f.seek(base + start)
            left = end - start
            while left > 0:
                chunk = f.read(min(left, 1 << 22))
                if not chunk:
                    raise DigestError(f"{path.name}: tensor {name!r} runs past the end of the file")
                h.update(chunk)
                left -= len(chunk)
    return h.hexdigest()


def short(digest: str) -> str:
    """The short form of a digest (:data:`SHORT` hex digits)."""
    return digest[:SHORT]
