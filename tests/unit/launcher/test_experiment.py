"""The LLD experiment's bookkeeping and analysis, from step logs (no services): collapse and
log-likelihood-turn detection, per-run summaries, resumable run folders, paired differences, plots
and the report rebuilt from committed logs alone."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llds import experiment


def _log(rewards: list[float], logps: list[float], alarm_at: int | None = None) -> list[dict[str, Any]]:
    rows = []
    for i, (r, lp) in enumerate(zip(rewards, logps, strict=True)):
        step = i + 1
        rows.append({"step": step, "reward/mean": r, "lld/correct_logp_token": lp, "loss/llds": 0.0,
                     "lld/alarm": 1.0 if alarm_at and step >= alarm_at else 0.0,
                     "lld/action": 1.0 if alarm_at and step == alarm_at else 0.0, "ignored/key": 1})  # fmt: skip
    return rows


COLLAPSING = _log([0.5] * 5 + [0.8] * 10 + [0.1] * 15, [-0.1] * 8 + [-0.1 - 0.05 * i for i in range(22)], 12)
STEADY = _log([0.5] * 5 + [0.8] * 25, [-0.1] * 30)


def test_slope_ignores_missing_points_and_needs_three() -> None:
    assert experiment._slope([1.0, None, 3.0, 4.0]) == 1.0
    assert experiment._slope([1.0, 2.0]) is None


def test_collapse_is_the_moving_average_staying_below_half_its_peak() -> None:
    rewards = experiment._series(COLLAPSING, "reward/mean")
    step = experiment.collapse_step(rewards)
    assert step is not None and 16 < step <= 25
    ma = experiment.moving_average(rewards, 10)
    assert all(v < 0.4 for v in ma[step - 1 :]) and ma[step - 2] >= 0.4  # type: ignore[operator]
    assert experiment.collapse_step(experiment._series(STEADY, "reward/mean")) is None
    # a dip that recovers is no collapse
    assert experiment.collapse_step([0.8] * 10 + [0.0] * 10 + [0.8] * 10) is None


def test_the_log_likelihood_turns_before_the_reward_falls() -> None:
    s = experiment.summarize("grpo", 0, COLLAPSING)
    assert s["logp_turn_step"] is not None and s["collapse_step"] is not None
    assert s["logp_turn_step"] < s["collapse_step"]
    assert (s["first_warning_step"], s["first_action_step"]) == (12, 12)
    assert experiment.summarize("grpo_llds", 0, STEADY)["logp_turn_step"] is None


def test_compact_logs_keep_only_the_plotted_keys() -> None:
    rows = [json.loads(x) for x in experiment.compact(COLLAPSING).splitlines()]
    assert len(rows) == 30 and "ignored/key" not in rows[0] and rows[0]["reward/mean"] == 0.5


def _study(out: Path, runs: dict[tuple[str, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    (out / "logs").mkdir(parents=True)
    results = []
    for (arm, seed), log in runs.items():
        (out / "logs" / f"{experiment.run_name(arm, seed)}.jsonl").write_text(experiment.compact(log))
        results.append(
            experiment.summarize(arm, seed, log) | {"eval_em": 0.3 + 0.1 * (arm != "grpo") + 0.01 * seed}
        )
    (out / "results.json").write_text(json.dumps(results))
    study = {"preset": "cpu", "steps": 30, "eval_limit": 100, "seeds": "0,1", "arms": "grpo,grpo_llds"}
    (out / "study.json").write_text(json.dumps(study))
    return results


def test_report_only_rebuilds_figures_and_pairs_seeds_from_committed_logs(tmp_path: Path) -> None:
    out = tmp_path / "study"
    _study(
        out,
        {
            ("grpo", 0): COLLAPSING,
            ("grpo_llds", 0): STEADY,
            ("grpo", 1): COLLAPSING,
            ("grpo_llds", 1): STEADY,
        },
    )
    assert experiment.main(["--report-only", "--out", str(out)]) == 0
    md = (out / "EXPERIMENTS.md").read_text()
    assert "--steps 30 --eval-limit 100 --seeds 0,1 --arms grpo,grpo_llds" in md
    assert "| grpo_llds - grpo | eval_em | s0: +0.100, s1: +0.100 | +0.100 | 0.000 |" in md
    assert {p.name for p in out.glob("*.png")} >= {
        "reward_mean.png",
        "lld_correct_logp_token.png",
        "lld_alarm.png",
    }
    assert "![lld_correct_logp_token](lld_correct_logp_token.png)" in md


def test_finished_runs_are_skipped_and_unfinished_ones_need_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], *a: Any, **k: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        run = Path(cmd[cmd.index("--resume") + 1] if "--resume" in cmd else cmd[cmd.index("--run-dir") + 1])
        (run / "trainer").mkdir(parents=True, exist_ok=True)
        (run / "trainer" / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in STEADY))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    args = argparse.Namespace(out=tmp_path, preset="cpu", trainer_config=None, model=None, steps=30, eval_limit=0,
                              resume=False)  # fmt: skip
    r = experiment.run_one("grpo_alarm", 1, args)
    assert r["steps"] == 30 and r["overrides"]["lld_alarm_action"] == "enable_llds"
    cfg = (tmp_path / "runs" / "grpo_alarm-s1" / "trainer_variant.toml").read_text()
    assert 'lld_alarm_action = "enable_llds"' in cfg and "seed = 1" in cfg
    assert (tmp_path / "logs" / "grpo_alarm-s1.jsonl").is_file()
    assert experiment.run_one("grpo_alarm", 1, args) == r and len(calls) == 1  # finished: skipped
    # an interrupted run (llds up wrote its config, no result yet)
    unfinished = tmp_path / "runs" / "grpo-s0" / "run"
    unfinished.mkdir(parents=True)
    (unfinished / "up_config.toml").write_text("")
    with pytest.raises(SystemExit, match="--resume"):
        experiment.run_one("grpo", 0, args)
    args.resume = True
    experiment.run_one("grpo", 0, args)
    assert "--resume" in calls[-1] and str(unfinished) in calls[-1] and "--steps" in calls[-1]


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    for argv in (["--arms", "nope"], ["--seeds", "a,b"], ["--report-only", "--out", str(tmp_path / "none")]):
        with pytest.raises(SystemExit) as e:
            experiment.main(argv)
        assert e.value.code == 2
