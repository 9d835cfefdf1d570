"""Optional experiment trackers beside ``train_log.jsonl``: TensorBoard and Weights & Biases.

Each is a small writer behind one interface, chosen by ``TrainerConfig.trackers``; they receive the
same per-step record the JSONL log gets (numeric values only, slash-namespaced keys as tags).
W&B runs in offline mode by default (``wandb sync`` uploads later), so nothing leaves the machine;
the run config it gets has no secret in it (:func:`llds_server.settings.without_secrets`): a synced run
is shared with whoever can see the project.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

from llds_server.settings import without_secrets


class TrackerError(RuntimeError):
    """A tracker is configured but its package is missing or it failed to start."""


class StepWriter(Protocol):
    """Receives one record per training step."""

    def write(self, step: int, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def numeric(record: dict[str, Any]) -> dict[str, float]:
    """The finite numeric entries of a step record (bools and strings dropped)."""
    out = {}
    for k, v in record.items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if math.isfinite(float(v)):
            out[k] = float(v)
    return out


class TensorBoardWriter:
    """Scalars into ``{run_dir}/tensorboard`` (``tensorboard --logdir RUN_DIR/tensorboard``)."""

    def __init__(self, run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise TrackerError("trackers = ['tensorboard'] needs the tensorboard package") from e
        self.log_dir = run_dir / "tensorboard"
        self._w = SummaryWriter(log_dir=str(self.log_dir))

    def write(self, step: int, record: dict[str, Any]) -> None:
        for k, v in numeric(record).items():
            self._w.add_scalar(k, v, global_step=step)
        self._w.flush()

    def close(self) -> None:
        self._w.close()


class WandbWriter:
    """A W&B run in ``{run_dir}/wandb`` (offline unless ``mode`` is ``online``)."""

    def __init__(self, run_dir: Path, project: str, mode: str, config: dict[str, Any]):
        try:
            import wandb
        except ImportError as e:
            raise TrackerError("trackers = ['wandb'] needs the wandb package") from e
        (run_dir / "wandb").mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=project, dir=str(run_dir), mode=mode, config=config, reinit="finish_previous"
        )

    def write(self, step: int, record: dict[str, Any]) -> None:
        self._run.log(numeric(record), step=step)

    def close(self) -> None:
        self._run.finish()


def make_writers(
    trackers: list[str], run_dir: Path, *, wandb_project: str, wandb_mode: str, config: dict[str, Any]
) -> list[StepWriter]:
    """One writer per configured tracker; ``config`` reaches them without its secrets."""
    config = without_secrets(config)
    writers: list[StepWriter] = []
    for name in trackers:
        if name == "tensorboard":
            writers.append(TensorBoardWriter(run_dir))
        elif name == "wandb":
            writers.append(WandbWriter(run_dir, wandb_project, wandb_mode, config))
        else:  # the config's Literal already rejects this; kept for direct callers
            raise TrackerError(f"unknown tracker {name!r}")
    return writers
