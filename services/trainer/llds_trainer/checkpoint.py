"""Atomic, durable trainer checkpoints: write into a hidden temp folder, fsync, rename.

Layout of ``{run_dir}/checkpoints/step_{step:08d}/``:
``model.safetensors`` (policy weights) and ``optimizer.pt`` (AdamW state, loaded with
``weights_only=True``) under ``parallel = "ddp"``, or ``sharded/`` (every rank's shards of model and
optimizer, a ``torch.distributed.checkpoint`` folder) under ``parallel = "fsdp"``;
``rng.safetensors`` (torch RNG states), ``state.json`` (step, version, consumed group ids, LLD
monitor history). A folder with the final name is complete by construction
(the rename is the commit point); the newest ``keep`` are kept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

_NAME = re.compile(r"^step_(\d{8})$")
STATE_FILE = "state.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng.safetensors"
SHARDED_DIR = "sharded"
"""The DCP folder of a sharded checkpoint (``.metadata`` and one ``.distcp`` file per rank)."""


class CheckpointError(RuntimeError):
    """A checkpoint folder is missing a file or cannot be read."""


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """Make every file under ``path`` (sub-folders too) and their directory entries durable."""
    for f in path.iterdir():
        if f.is_dir():
            fsync_tree(f)
        elif f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(path)


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    cps = list_checkpoints(run_dir)
    return cps[-1][1] if cps else None


def begin(run_dir: str | Path, step: int) -> Path:
    """A fresh temp folder to write checkpoint ``step`` into."""
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".step_{step:08d}.", dir=root))


def commit(tmp: Path, run_dir: str | Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write ``state.json``, fsync everything, rename into place, delete old checkpoints."""
    (tmp / STATE_FILE).write_text(json.dumps(state))
    fsync_tree(tmp)
    final = checkpoint_root(run_dir) / f"step_{step:08d}"
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    for _, old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stray in final.parent.glob(".step_*"):
        shutil.rmtree(stray, ignore_errors=True)
    return final


def is_sharded(path: Path) -> bool:
    """Whether checkpoint ``path`` holds the sharded (DCP) layout rather than the replicated one."""
    return (path / SHARDED_DIR / ".metadata").is_file()


def read_state(path: Path) -> dict[str, Any]:
    needed = (STATE_FILE,) if is_sharded(path) else (STATE_FILE, MODEL_FILE, OPTIMIZER_FILE)
    for name in needed:
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path} lacks {name}")
    try:
        return json.loads((path / STATE_FILE).read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint {path}: {STATE_FILE} is not JSON: {e}") from e
