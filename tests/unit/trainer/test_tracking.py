"""Optional trackers: TensorBoard event files and offline W&B runs receive every numeric step value."""

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llds_trainer.tracking import TrackerError, make_writers, numeric

RECORDS = [{"step": 1, "reward/mean": 0.5, "loss/llds": 0.01, "lld/alarm": "ok", "flag": True, "nan": float("nan")},
           {"step": 2, "reward/mean": 0.75, "loss/llds": 0.02, "lld/alarm": "warning"}]  # fmt: skip


def test_numeric_keeps_finite_numbers_only() -> None:
    assert numeric(RECORDS[0]) == {"step": 1.0, "reward/mean": 0.5, "loss/llds": 0.01}


def test_tensorboard_scalars_are_readable(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="tensorboard is a dev dependency")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (w,) = make_writers(["tensorboard"], tmp_path, wandb_project="t", wandb_mode="offline", config={})
    for r in RECORDS:
        w.write(int(r["step"]), r)
    w.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [(1, 0.5), (2, 0.75)]
    assert "lld/alarm" not in acc.Tags()["scalars"]


def test_wandb_offline_run_is_written_locally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="wandb is a dev dependency")
    monkeypatch.setenv("WANDB_SILENT", "true")
    (w,) = make_writers(
        ["wandb"], tmp_path, wandb_project="llds-test", wandb_mode="offline", config={"lr": 1e-6}
    )
    for r in RECORDS:
        w.write(int(r["step"]), r)
    w.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("*.wandb")), "no run file written"


def test_trackers_get_the_config_without_its_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def init(**kw: Any) -> Any:
        seen.update(kw)
        return SimpleNamespace(log=lambda *a, **k: None, finish=lambda: None)

    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(init=init))
    config = {"lr": 1e-6, "redis_url": "redis://:hunter2@redis:6379/0", "admin_token": "tok",
              "notify_urls": ["http://rollout:8001/?token=abc"]}  # fmt: skip
    make_writers(["wandb"], tmp_path, wandb_project="t", wandb_mode="offline", config=config)
    assert seen["config"] == {"lr": 1e-6, "redis_url": "redis://:***@redis:6379/0",
                              "notify_urls": ["http://rollout:8001/?token=***"]}  # fmt: skip


def test_unknown_tracker_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TrackerError, match="unknown tracker"):
        make_writers(["mlflow"], tmp_path, wandb_project="t", wandb_mode="offline", config={})
