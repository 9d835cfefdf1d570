"""``llds trainer replay-alarm``: the LLD monitor replayed on step logs. Witness: replayed with the
study's own monitor settings, it reproduces the ``lld/alarm`` column every committed run logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llds_trainer.config import LLDMonitorConfig
from llds_trainer.lld import LLDMonitor
from llds_trainer.replay import replay, replay_log, replay_main

LOGS = sorted((Path(__file__).resolve().parents[3] / "docs" / "experiment-lld" / "logs").glob("*.jsonl"))
STUDY_MONITOR = LLDMonitorConfig(persist_steps=2)  # configs/trainer_cpu_collapse.toml's [lld]


@pytest.mark.parametrize("path", LOGS, ids=[p.stem for p in LOGS])
def test_replay_with_the_runs_settings_reproduces_the_logged_alarm(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    levels = replay(rows, LLDMonitor.from_config(STUDY_MONITOR))
    assert levels == [r["lld/alarm"] for r in rows][: len(levels)]
    acted = [i for i, r in enumerate(rows) if r.get("lld/action")]
    assert len(levels) == (
        acted[0] + 1 if acted else len(rows)
    )  # stops where an acting alarm changed the run


def _row(step: int, reward: float, logp: float | None, fell: float | None, action: float = 0.0) -> dict:
    return {"step": step, "reward/mean": reward, "lld/correct_logp_token": logp,
            "lld/fell_fraction_responses": fell, "actor/entropy": 0.1, "actor/grad_norm": 1.0,
            "lld/alarm": 0.0, "lld/action": action}  # fmt: skip


def test_replay_reports_first_warning_and_death(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # likelihood falling from step 1 with 60% of correct responses displaced; no correct response
    # (None) from step 6, reward 0 from step 6 to the end
    rows = [_row(s, 0.5, -0.1 * s, 0.6) for s in range(1, 6)] + [
        _row(s, 0.0, None, None) for s in range(6, 9)
    ]
    log = tmp_path / "run-s0.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = replay_log(log, LLDMonitorConfig(persist_steps=2))
    # a slope needs 3 points: the conditions hold from step 3, for 2 steps at step 4
    assert (r.replayed_warning, r.logged_warning, r.dead_from, r.steps) == (4, None, 6, 8)
    assert replay_log(log, LLDMonitorConfig(persist_steps=2, fell_fraction=0.7)).replayed_warning is None
    assert replay_main([str(log), "--set", "persist_steps=1"]) == 0
    out = capsys.readouterr().out
    assert "persist_steps=1" in out and "| run-s0 | 8 | - | 3 | 6 | 3 |" in out
    for bad in (["--set", "nope=1"], ["--set", "window=2"], ["--set", "alarm=x"], ["--set", "persist_steps"]):
        with pytest.raises(SystemExit) as e:
            replay_main([str(log), *bad])
        assert e.value.code == 2
    with pytest.raises(SystemExit):
        replay_main([str(tmp_path / "missing.jsonl")])
