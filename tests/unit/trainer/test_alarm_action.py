"""The acting LLD alarm (``lld_alarm_action``): the rule alone, then in the trainer's step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from test_core import _cfg

from llds_trainer.config import TrainerConfig
from llds_trainer.core import Trainer
from llds_trainer.lld import AlarmAction, LLDMonitor
from llds_trainer.regularizers import NoRegularizer
from llds_trainer.regularizers.llds import LLDSRegularizer
from llds_trainer.synthetic import synthetic_groups


def test_enable_llds_acts_once_on_entering_the_trigger() -> None:
    a = AlarmAction(action="enable_llds", trigger="warning", on_lambda=0.3)
    assert not a.react("ok", "ok", 1)
    assert a.react("ok", "warning", 2) and a.lam == 0.3
    assert not a.react("warning", "alarm", 3)  # already in the trigger's range: no new entry
    assert not a.react("alarm", "ok", 4)
    assert not a.react("ok", "warning", 5)  # already on
    assert a.fired_steps == [2]


def test_raise_lambda_multiplies_on_each_entry_up_to_the_cap() -> None:
    a = AlarmAction(action="raise_lambda", trigger="warning", factor=2.0, lambda_max=0.5, lam=0.2)
    assert a.react("ok", "warning", 3) and a.lam == 0.4
    assert not a.react("warning", "warning", 4)
    assert a.react("ok", "alarm", 9) and a.lam == 0.5  # capped
    assert not a.react("ok", "warning", 12)  # at the cap: nothing changes, no event
    assert a.fired_steps == [3, 9]


def test_an_alarm_trigger_ignores_warnings_and_none_never_acts() -> None:
    a = AlarmAction(action="enable_llds", trigger="alarm")
    assert not a.react("ok", "warning", 1)
    assert a.react("warning", "alarm", 2)
    n = AlarmAction(action="none", lam=0.2)
    assert not n.react("ok", "alarm", 1) and n.lam == 0.2


def test_state_round_trips_and_old_checkpoints_keep_the_configured_start() -> None:
    a = AlarmAction(action="raise_lambda", lam=0.2)
    a.react("ok", "warning", 7)
    b = AlarmAction(action="raise_lambda", lam=0.2)
    b.load_state_dict(a.state_dict())
    assert (b.lam, b.fired_steps) == (0.4, [7])
    c = AlarmAction(action="raise_lambda", lam=0.2)
    c.load_state_dict(None)
    assert c.lam == 0.2


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"lld": {"alarm": "enable_llds"}, "regularizer": "llds"}, "needs regularizer.type = 'none'"),
        ({"lld": {"alarm": "raise_lambda"}, "regularizer": "none"}, "needs regularizer.type = 'llds'"),
        ({"lld": {"alarm": "enable_llds", "probe": False}, "regularizer": "none"}, "lld.probe"),
    ],
)
def test_config_refuses_an_action_that_cannot_act(kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        TrainerConfig(**kw)


class ScriptedMonitor(LLDMonitor):
    """The real monitor's bookkeeping, with the state forced per step (1-based)."""

    def __init__(self, states: dict[int, str]) -> None:
        super().__init__()
        self.states = states
        self.calls = 0

    def update(self, *args: Any) -> dict[str, float | None]:
        out = super().update(*args)
        self.calls += 1
        self.state = self.states.get(self.calls, "ok")  # type: ignore[assignment]
        out["lld/alarm"] = {"ok": 0.0, "warning": 1.0, "alarm": 2.0}[self.state]
        return out


def test_the_trainer_switches_llds_on_at_the_step_the_alarm_enters_warning(
    tiny_model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    groups = synthetic_groups(tokenizer, 6, 3, seed=11, think_words=3, doc_words=6)
    llds = {"coef": 0.25, "answer_weight_mode": "adaptive_code"}
    cfg = _cfg(tiny_model_dir, regularizer="none", lld={"alarm": {"type": "enable_llds", "llds": llds}})
    tr = Trainer(cfg)
    tr.monitor = ScriptedMonitor({2: "warning", 3: "warning", 4: "alarm"})
    recs = [tr.train_step(groups[:2]), tr.train_step(groups[4:6])]
    # step 1: monitor ok, LLDS off; step 2: the monitor enters warning -> the event, still trained without
    assert [r["lld/action"] for r in recs] == [0.0, 1.0]
    assert [r["llds/lambda"] for r in recs] == [0.0, 0.0]
    assert all(r["loss/llds"] == 0.0 for r in recs)
    assert isinstance(tr.objective.regularizer, LLDSRegularizer) and tr.objective.regularizer.lam == 0.25
    # a checkpoint taken now resumes with LLDS on
    path = tr.save_checkpoint(tmp_path / "run")
    resumed = Trainer(cfg)
    resumed.load_checkpoint(path)
    assert (
        isinstance(resumed.objective.regularizer, LLDSRegularizer)
        and resumed.objective.regularizer.lam == 0.25
    )
    assert resumed.alarm_action.fired_steps == [2]
    # step 3 trains with LLDS (non-zero on the second update of the step), no new event
    r3 = tr.train_step(groups[2:4])
    assert r3["llds/lambda"] == 0.25 and r3["lld/action"] == 0.0 and r3["loss/llds"] > 0
    fresh = Trainer(_cfg(tiny_model_dir, regularizer="none"))
    assert isinstance(fresh.objective.regularizer, NoRegularizer)
