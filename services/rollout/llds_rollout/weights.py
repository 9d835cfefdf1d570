"""Verification of published weight folders (CONTRACTS.md "Weights").

The trainer writes ``{weights_root}/v{v:06d}/`` and then the marker ``COMPLETE`` listing every file
with its sha256. A folder is accepted only if it resolves inside the weights root (no ``..``, no
symlink leading out), the marker is there and names this version, and every listed file hashes to
its digest. Only safetensors are read: never pickle.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

MARKER = "COMPLETE"


def published_dir_name(version: int) -> str:
    """Folder (relative to the weights root) the trainer publishes ``version`` into."""
    return f"v{version:06d}"


class WeightsError(ValueError):
    """A published folder that must not be loaded; the message says why (-> HTTP 400)."""


@dataclass(frozen=True)
class PublishedWeights:
    """A verified folder: its resolved path and the safetensors files to load."""

    folder: Path
    version: int
    step: int
    safetensors: list[Path]


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def resolve_folder(weights_root: Path, rel: str) -> Path:
    """``weights_root / rel`` resolved, or :class:`WeightsError` if it leaves the root."""
    if Path(rel).is_absolute():
        raise WeightsError(f"path {rel!r} must be relative to the weights root")
    root = weights_root.resolve()
    try:
        folder = (root / rel).resolve(strict=True)
    except (OSError, RuntimeError, ValueError) as e:  # missing, symlink loop, NUL byte, name too long
        raise WeightsError(f"path {rel!r} does not exist under the weights root") from e
    if folder == root or not folder.is_relative_to(root):
        raise WeightsError(f"path {rel!r} resolves outside the weights root")
    if not folder.is_dir():
        raise WeightsError(f"path {rel!r} is not a folder")
    return folder


def verify_published(weights_root: Path, rel: str, version: int) -> PublishedWeights:
    """Check a published folder against its marker; raises :class:`WeightsError` on any problem."""
    folder = resolve_folder(weights_root, rel)
    marker = folder / MARKER
    if not marker.is_file():
        raise WeightsError(f"{rel}: no {MARKER} marker (incomplete publish)")
    try:
        meta = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsError(f"{rel}: unreadable {MARKER} marker: {e}") from e
    files = meta.get("files") if isinstance(meta, dict) else None
    if not isinstance(files, dict) or not files:
        raise WeightsError(f"{rel}: {MARKER} marker lists no files")
    if meta.get("version") != version:
        raise WeightsError(f"{rel}: marker says version {meta.get('version')!r}, notice says {version}")
    for name, digest in files.items():
        if not isinstance(name, str) or not isinstance(digest, str) or "/" in name or name in ("", ".", ".."):
            raise WeightsError(f"{rel}: bad marker entry {name!r}")
        path = folder / name
        if path.is_symlink() or not path.is_file():
            raise WeightsError(f"{rel}: {name} is missing or not a regular file")
        if sha256_file(path) != digest.lower():
            raise WeightsError(f"{rel}: {name} does not match its sha256 (corrupt or partial file)")
    listed = {n for n in files if n.endswith(".safetensors")}
    on_disk = {p.name for p in folder.glob("*.safetensors")}
    if not listed:
        raise WeightsError(f"{rel}: no safetensors file in the marker")
    if on_disk - listed:
        raise WeightsError(f"{rel}: safetensors files not covered by the marker: {sorted(on_disk - listed)}")
    return PublishedWeights(
        folder=folder,
        version=version,
        step=int(meta.get("step", 0)),
        safetensors=[folder / n for n in sorted(listed)],
    )


def read_shapes(published: PublishedWeights) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape from the safetensors headers alone (no tensor is read: a 3B policy's
    check would otherwise read 12 GB into memory); a broken header is a :class:`WeightsError`."""
    from safetensors import safe_open

    def header(path: Path) -> dict[str, tuple[int, ...]]:
        with safe_open(str(path), framework="numpy") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}

    return _each_file(published, header)


def identity(folder: Path) -> dict[str, tuple[int, int, int]]:
    """(inode, size, mtime ns) of every file in ``folder``: taken before the checks and again after
    the swap, it shows a file rewritten, replaced, added or deleted while they read it (the sha256
    check cannot see a change after it hashed the file)."""
    out = {}
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return {}
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        out[e.name] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def load_tensors(published: PublishedWeights) -> dict[str, object]:
    """All tensors of a verified folder (safetensors only); a broken file is a :class:`WeightsError`."""
    from safetensors.torch import load_file

    return _each_file(published, lambda path: load_file(str(path)))


def _each_file(published: PublishedWeights, read: Callable[[Path], dict[str, T]]) -> dict[str, T]:
    """``read`` of every safetensors file, merged: an unreadable file or a tensor name in two files
    is a :class:`WeightsError`."""
    from safetensors import SafetensorError

    out: dict[str, T] = {}
    for path in published.safetensors:
        try:
            part = read(path)
        except (SafetensorError, OSError, ValueError) as e:
            raise WeightsError(f"{path.name}: not a readable safetensors file: {e}") from e
        dup = set(part) & set(out)
        if dup:
            raise WeightsError(f"{path.name}: tensors repeated across files: {sorted(dup)[:3]}")
        out.update(part)
    return out


def write_marker(folder: Path, version: int, step: int = 0) -> Path:
    """Write ``COMPLETE`` for every file in ``folder`` (what the trainer does; used by tests and bench)."""
    files = {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != MARKER}
    marker = folder / MARKER
    marker.write_text(json.dumps({"version": version, "step": step, "files": files}))
    return marker
