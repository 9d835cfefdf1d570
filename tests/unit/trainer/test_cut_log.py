"""The trainer's step log on restart: cut back to the checkpoint, a torn last line removed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llds_proto import steplog as K
from llds_trainer.config import TrainerConfig
from llds_trainer.service import TRAIN_LOG, TrainerService


def _service(run_dir: Path) -> TrainerService:
    return TrainerService(TrainerConfig(model="m", run_dir=str(run_dir)))


def test_restart_cuts_lost_steps_and_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / TRAIN_LOG
    path.write_text(
        "".join(json.dumps({"step": s, "reward/mean": s / 10}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "rew'
    )
    svc = _service(tmp_path)
    svc._cut_log(2)  # checkpoint at step 2: steps 3 and 4 are trained again
    assert path.read_text() == '{"step": 1, "reward/mean": 0.1}\n{"step": 2, "reward/mean": 0.2}\n'
    assert [r["step"] for r in svc.history] == [1, 2]
    svc._cut_log(4)  # nothing lost but the torn record: the next one starts on a line of its own
    with path.open("a") as f:
        f.write(json.dumps({"step": 3}) + "\n")
    assert [r["step"] for r in K.read_records(path)] == [1, 2, 3]


def test_restart_on_a_log_damaged_mid_file_names_the_line(tmp_path: Path) -> None:
    (tmp_path / TRAIN_LOG).write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(K.StepLogError, match=rf"{TRAIN_LOG}:2 is not JSON"):
        _service(tmp_path)._cut_log(3)


def test_restart_without_a_log_starts_an_empty_one(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    svc._cut_log(0)
    assert (tmp_path / TRAIN_LOG).read_text() == "" and not svc.history
