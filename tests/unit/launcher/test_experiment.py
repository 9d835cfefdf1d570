"""The LLD experiment's bookkeeping and analysis, from step logs (no services): collapse and
log-likelihood-turn detection, per-run summaries, resumable run folders, paired differences, plots
and the report rebuilt from committed logs alone."""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from llds import experiment
from llds_trainer.config import TrainerConfig


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

    def fake_train(cmd: list[str], run: Path, stop_dead: int, steps: int) -> None:
        calls.append(cmd)
        (run / "trainer").mkdir(parents=True, exist_ok=True)
        (run / "trainer" / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in STEADY))

    monkeypatch.setattr(experiment, "_train", fake_train)
    args = argparse.Namespace(out=tmp_path, preset="cpu", trainer_config=None, model=None, steps=30, eval_limit=0,
                              resume=False)  # fmt: skip
    r = experiment.run_one("grpo_alarm", 1, args)
    assert r["steps"] == 30 and r["overrides"]["lld"]["alarm"]["type"] == "enable_llds"
    cfg = tomllib.loads((tmp_path / "runs" / "grpo_alarm-s1" / "trainer_variant.toml").read_text())
    assert cfg["lld"]["alarm"]["type"] == "enable_llds" and cfg["seed"] == 1
    assert cfg["regularizer"] == {"type": "none"}  # the preset's LLDS table replaced, not merged into
    # the seed also picks the rollout's question order and sampling seed
    rollout = tomllib.loads((tmp_path / "runs" / "grpo_alarm-s1" / "rollout_variant.toml").read_text())
    assert (rollout["seed"], rollout["engine"]["seed"], rollout["engine"]["max_batch_size"]) == (1, 1, 16)
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


DEAD_TRAINER = """
import json, sys, time
from pathlib import Path
log = Path(sys.argv[1]) / "trainer" / "train_log.jsonl"
log.parent.mkdir(parents=True)
try:
    for step in range(1, 40):
        with log.open("a") as f:
            f.write(json.dumps({"step": step, "reward/mean": 0.5 if step < 4 else 0.0}) + "\\n")
        time.sleep(0.05)
except KeyboardInterrupt:
    sys.exit(0)
sys.exit(4)
"""


def test_stop_dead_interrupts_a_run_whose_reward_stays_zero(tmp_path: Path) -> None:
    """A real child process writing a step log: stopped by Ctrl-C once the last 3 rewards are 0."""
    import sys

    cmd = [sys.executable, "-c", DEAD_TRAINER, str(tmp_path)]
    stopped = experiment._train(cmd, tmp_path, stop_dead=3, steps=39, poll_s=0.2)
    assert stopped is not None and 6 <= stopped < 39
    rows = experiment._read_log(tmp_path)
    assert experiment.dead(rows[:stopped], 3) and not experiment.dead(rows[:5], 3)
    # without --stop-dead the same child runs to its end (and its exit code 4 is an error)
    with pytest.raises(RuntimeError, match="exit code 4"):
        experiment._train([*cmd[:-1], str(tmp_path / "again")], tmp_path / "again", 0, 39, poll_s=0.2)


def test_a_run_the_trainer_stopped_for_want_of_signal_is_stopped_dead_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under dynamic sampling no step reads reward 0, so --stop-dead never fires; the trainer stops
    itself and ``llds up`` exits EXIT_NO_SIGNAL. The run is then dead at its last logged step, with the
    cause in its result and the report, and its last weights are still evaluated."""
    import sys

    from llds_proto.exits import EXIT_NO_SIGNAL

    script = DEAD_TRAINER.replace("range(1, 40)", "range(1, 8)").replace(
        "sys.exit(4)", f"sys.exit({EXIT_NO_SIGNAL})"
    )
    with pytest.raises(experiment.NoSignal) as e:
        experiment._train([sys.executable, "-c", script, str(tmp_path)], tmp_path, 0, 20, poll_s=0.2)
    assert e.value.step == 7

    def fake_train(cmd: list[str], run: Path, stop_dead: int, steps: int) -> int | None:
        (run / "trainer").mkdir(parents=True, exist_ok=True)
        (run / "trainer" / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in STEADY[:9]))
        (run / "weights" / "v9").mkdir(parents=True)
        (run / "weights" / "v9" / "COMPLETE").touch()
        raise experiment.NoSignal(9)

    evaluated: list[Path] = []
    monkeypatch.setattr(experiment, "_train", fake_train)
    monkeypatch.setattr(experiment, "evaluate", lambda m, *a: evaluated.append(m) or {"eval_em": 0.25})
    args = argparse.Namespace(out=tmp_path / "study", preset="cpu-collapse", trainer_config=None, model=None,
                              steps=20, eval_limit=10, stop_dead=4, resume=False)  # fmt: skip
    result = experiment.run_one("grpo_ds", 0, args)
    assert (result["stopped_dead_at"], result["eval_em"]) == (9, 0.25) and evaluated[0].name == "v9"
    assert "no learning signal" in result["stopped_why"]
    assert "9 (no learning signal" in experiment._stopped(result)
    assert experiment._stopped({"stopped_dead_at": 5, "stop_dead": 4}) == "5 (reward 0 for 4 steps)"
    trainer = tomllib.loads((tmp_path / "study" / "runs" / "grpo_ds-s0" / "trainer_variant.toml").read_text())
    assert (trainer["dynamic_sampling"], trainer["dynamic_sampling_max_skips"]) == (True, 8)
    TrainerConfig.model_validate(trainer)


def test_a_run_that_ends_short_of_its_steps_is_interrupted_not_finished(tmp_path: Path) -> None:
    """llds up exits 0 on a requested stop (Ctrl-C, SIGTERM): the step log, not the exit code, says
    the run is unfinished, so no result is written and --resume continues it."""
    import sys

    short = DEAD_TRAINER.replace("range(1, 40)", "range(1, 6)").replace("sys.exit(4)", "sys.exit(0)")
    with pytest.raises(experiment.Interrupted, match="stopped at step 5 of 10"):
        experiment._train([sys.executable, "-c", short, str(tmp_path)], tmp_path, 0, 10, poll_s=0.2)
    assert (
        experiment._train([sys.executable, "-c", short, str(tmp_path / "b")], tmp_path / "b", 0, 5, 0.2)
        is None
    )


def test_search_runs_every_setting_with_merged_configs_and_tables_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake_train(cmd: list[str], run: Path, stop_dead: int, steps: int) -> int | None:
        trainer = Path(cmd[cmd.index("--trainer-config") + 1]).read_text()
        log = COLLAPSING if "lr = 0.0002" in trainer else STEADY
        (run / "trainer").mkdir(parents=True, exist_ok=True)
        (run / "trainer" / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
        return None

    monkeypatch.setattr(experiment, "_train", fake_train)
    grid = tmp_path / "grid.toml"
    grid.write_text(
        'preset = "cpu"\narm = "grpo"\n'
        '[[setting]]\nname = "slow"\ntrainer = { optimizer = { lr = 5e-5 } }\n'
        '[[setting]]\nname = "fast"\ntrainer = { optimizer = { lr = 2e-4 } }\n'
        "rollout = { max_tokens_per_turn = 48, engine = { kv_cache_gib = 2 } }\n"
    )
    out = tmp_path / "search"
    assert experiment.search_main(["--grid", str(grid), "--out", str(out), "--steps", "30"]) == 0
    fast = out / "runs" / "fast-s0"
    rollout = tomllib.loads((fast / "rollout_variant.toml").read_text())
    assert rollout["max_tokens_per_turn"] == 48 and rollout["engine"] == {
        **rollout["engine"],
        "kv_cache_gib": 2,
    }
    assert rollout["engine"]["max_batch_size"] == 16  # the preset's engine table merged, not replaced
    trainer = tomllib.loads((fast / "trainer_variant.toml").read_text())
    assert (trainer["optimizer"], trainer["regularizer"], trainer["seed"]) == (
        {"lr": 2e-4, "warmup_steps": 5},  # the preset's warm-up kept: [optimizer] merged key by key
        {"type": "none"},
        0,
    )
    slow = tomllib.loads((out / "runs" / "slow-s0" / "rollout_variant.toml").read_text())
    assert (slow["seed"], slow["engine"]["seed"], slow["max_tokens_per_turn"]) == (0, 0, 96)  # the preset's
    md = (out / "SEARCH.md").read_text()
    rows = {
        line.split(" | ")[0].strip("| "): line
        for line in md.splitlines()
        if line.startswith("| slow") or line.startswith("| fast")
    }
    assert "| yes |" in rows["fast"] and "max_tokens_per_turn=48" in rows["fast"]
    assert "| - |" in rows["slow"] and "optimizer.lr=5e-05" in rows["slow"]
    assert experiment.search_main(["--grid", str(grid), "--out", str(out), "--report-only"]) == 0
    for argv in (["--only", "nope"], ["--grid", str(tmp_path / "missing.toml")]):
        with pytest.raises(SystemExit) as e:
            experiment.search_main(["--grid", str(grid), "--out", str(out), *argv])
        assert e.value.code == 2


def test_the_cpu_collapse_preset_is_the_cpu_preset_with_the_searched_configs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its TOMLs hold only what differs; a run gets the CPU preset's configs with them merged on top."""
    calls: list[list[str]] = []

    def fake_train(cmd: list[str], run: Path, stop_dead: int, steps: int) -> None:
        calls.append(cmd)
        (run / "trainer").mkdir(parents=True, exist_ok=True)
        (run / "trainer" / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in STEADY))

    monkeypatch.setattr(experiment, "_train", fake_train)
    args = argparse.Namespace(out=tmp_path, preset="cpu-collapse", trainer_config=None, model=None, steps=30,
                              eval_limit=0, resume=False)  # fmt: skip
    experiment.run_one("grpo", 0, args)
    (cmd,) = calls
    assert cmd[cmd.index("--preset") + 1] == "cpu"
    rollout = tomllib.loads(Path(cmd[cmd.index("--rollout-config") + 1]).read_text())
    trainer = tomllib.loads(Path(cmd[cmd.index("--trainer-config") + 1]).read_text())
    cpu = {k: experiment.preset_config("cpu", k) for k in ("trainer", "rollout")}
    got, base = TrainerConfig(**trainer), TrainerConfig(**cpu["trainer"])
    assert got.kl_coef == 0 and got.optimizer.lr > base.optimizer.lr and got.lld.persist_steps == 2
    assert (rollout["topk"], rollout["max_tokens_per_turn"]) == (2, 64)
    # everything the overlay does not name comes from the CPU preset, [engine] included
    assert trainer["micro_batch_size"] == cpu["trainer"]["micro_batch_size"] == 2
    assert rollout["engine"] == cpu["rollout"]["engine"] | {"seed": 0}
    assert rollout["group_size"] == cpu["rollout"]["group_size"]


def _fake_eval(calls: list[list[str]], em: float = 0.5) -> Any:
    """subprocess.run for ``llds eval``: records the command, writes the eval.json it would write."""

    def run(cmd: list[str], *a: Any, **k: Any) -> Any:
        calls.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval.json").write_text(json.dumps({"summary": [{"em": em, "f1": em, "searches": 1.0}]}))
        return argparse.Namespace(returncode=0)

    return run


def test_a_run_stopped_dead_before_an_interruption_is_evaluated_on_resume_not_trained_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    trained: list[list[str]] = []
    evals: list[list[str]] = []
    monkeypatch.setattr(experiment, "_train", lambda cmd, *a: trained.append(cmd))
    monkeypatch.setattr(subprocess, "run", _fake_eval(evals, em=0.03))
    folder = tmp_path / "runs" / "grpo-s0"
    run = folder / "run"
    (run / "trainer").mkdir(parents=True)
    (run / "up_config.toml").write_text("")
    (folder / "rollout_variant.toml").write_text("topk = 2\n")
    (folder / "trainer_variant.toml").write_text("")
    dead_log = [{"step": i + 1, "reward/mean": r} for i, r in enumerate([0.5, 0.25, 0, 0, 0, 0])]
    (run / "trainer" / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dead_log))
    (run / "weights" / "v000006").mkdir(parents=True)
    (run / "weights" / "v000006" / "COMPLETE").write_text("")
    args = argparse.Namespace(out=tmp_path, preset="cpu-collapse", trainer_config=None, model=None, steps=20,
                              eval_limit=100, resume=True, stop_dead=4)  # fmt: skip
    r = experiment.run_one("grpo", 0, args)
    assert trained == []  # nothing left to train
    assert r["stopped_dead_at"] == 6 and r["eval_em"] == 0.03 and r["eval_n"] == 100
    (cmd,) = evals
    # evaluated in the run's own rollout shape, on the last published weights
    assert cmd[cmd.index("--rollout-config") + 1] == str(folder / "rollout_variant.toml")
    assert cmd[cmd.index("--model") + 1] == str(run / "weights" / "v000006")


def test_the_starting_policy_is_evaluated_once_in_the_runs_rollout_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    evals: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", _fake_eval(evals, em=0.7))
    args = argparse.Namespace(
        out=tmp_path, preset="cpu-collapse", model=str(tmp_path / "policy"), eval_limit=100
    )
    first = experiment.baseline(args)
    assert first == {"model": str(tmp_path / "policy"), "digest": None, "eval_em": 0.7, "eval_f1": 0.7, "eval_searches": 1.0,
                     "eval_n": 100, "eval_shape": {"topk": 2, "max_tokens_per_turn": 64, "max_obs_tokens": 160}}  # fmt: skip
    assert experiment.baseline(args) == first and len(evals) == 1  # done once
    shape = tomllib.loads(Path(evals[0][evals[0].index("--rollout-config") + 1]).read_text())
    assert shape == experiment.preset_config("cpu-collapse", "rollout")
    md = experiment.report([], argparse.Namespace(preset="cpu-collapse", steps=20, eval_limit=100, seeds="0",
                                                  arms="grpo"), [], base=first)  # fmt: skip
    assert "The starting policy (`policy`), evaluated the same way: held-out EM 0.700 on 100 questions." in md


def test_a_finished_run_evaluated_in_another_shape_is_evaluated_again_not_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    evals: list[list[str]] = []
    monkeypatch.setattr(experiment, "_train", lambda *a: pytest.fail("a finished run must not train"))
    monkeypatch.setattr(subprocess, "run", _fake_eval(evals, em=0.6))
    folder = tmp_path / "runs" / "grpo_llds-s0"
    (folder / "run" / "weights" / "v000020").mkdir(parents=True)
    (folder / "run" / "weights" / "v000020" / "COMPLETE").write_text("")
    (folder / "rollout_variant.toml").write_text("topk = 2\nmax_tokens_per_turn = 64\n")
    old = {"arm": "grpo_llds", "seed": 0, "steps": 20, "eval_em": 0.5, "eval_n": 100}  # default-shape eval
    (folder / "result.json").write_text(json.dumps(old))
    args = argparse.Namespace(out=tmp_path, preset="cpu-collapse", eval_limit=100, resume=True)
    again = experiment.run_one("grpo_llds", 0, args)
    assert again["eval_em"] == 0.6 and again["eval_shape"]["max_tokens_per_turn"] == 64 and len(evals) == 1
    assert json.loads((folder / "result.json").read_text()) == again
    assert experiment.run_one("grpo_llds", 0, args) == again and len(evals) == 1  # same shape: skipped


def test_invocations_with_other_seeds_or_arms_add_up_and_another_study_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The study runs in pieces (``--seeds 1`` today, ``--arms grpo_alarm`` tomorrow): each piece merges its
    results into OUT/results.json by (arm, seed) as each run finishes, the study record widens to every
    piece, and a piece of another study (other preset or steps) in the same OUT is refused."""
    ran: list[tuple[str, int]] = []

    def fake_run(arm: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
        ran.append((arm, seed))
        if (arm, seed) == ("grpo_alarm", 1):
            # interrupted mid-piece: the runs finished before it must already be in results.json
            raise SystemExit("interrupted")
        log = COLLAPSING if arm == "grpo" else STEADY
        return experiment.summarize(arm, seed, log) | {"eval_em": 0.1 * len(ran)}

    monkeypatch.setattr(experiment, "_run_or_exit", fake_run)
    monkeypatch.setattr(experiment, "baseline", lambda args: None)
    monkeypatch.setattr(experiment, "start_policy", lambda args: None)
    out = tmp_path / "study"
    base = ["--out", str(out), "--preset", "cpu", "--steps", "30", "--eval-limit", "0"]
    assert experiment.main([*base, "--seeds", "0", "--arms", "grpo,grpo_llds"]) == 0
    assert experiment.main([*base, "--seeds", "1", "--arms", "grpo_llds"]) == 0
    with pytest.raises(SystemExit, match="interrupted"):
        experiment.main([*base, "--seeds", "0,1", "--arms", "grpo_llds_ma,grpo_alarm"])
    results = json.loads((out / "results.json").read_text())
    assert [(r["arm"], r["seed"]) for r in results] == [
        ("grpo", 0), ("grpo_llds", 0), ("grpo_llds_ma", 0), ("grpo_alarm", 0), ("grpo_llds", 1), ("grpo_llds_ma", 1),
    ]  # fmt: skip
    study = json.loads((out / "study.json").read_text())
    assert (study["seeds"], study["arms"]) == ("0,1", "grpo,grpo_llds,grpo_llds_ma,grpo_alarm")
    assert experiment.main(["--report-only", "--out", str(out)]) == 0
    md = (out / "EXPERIMENTS.md").read_text()
    assert "--seeds 0,1 --arms grpo,grpo_llds,grpo_llds_ma,grpo_alarm" in md
    # what some piece asked for and did not finish, not the whole --seeds x --arms grid (grpo s1)
    assert "Not finished yet (the command with `--resume` runs them): grpo_alarm s1." in md
    with pytest.raises(SystemExit, match=r"another study \(steps 30 there, 20 here\)"):
        experiment.main([*base[:4], "--steps", "20", "--eval-limit", "0", "--seeds", "2"])
    assert len(json.loads((out / "results.json").read_text())) == 6


def test_the_starting_policy_is_recorded_by_digest_and_a_mixed_study_says_so(tmp_path: Path) -> None:
    """Runs record the SHA-256 of their start's tensors, and a report over runs from different (or
    unrecorded) starts says so."""
    import torch
    from safetensors.torch import save_file

    a, b = tmp_path / "a", tmp_path / "b"
    for d, last in ((a, 0.0), (b, 1.0)):
        d.mkdir()
        save_file({"w": torch.tensor([0.0] * 15 + [last])}, str(d / "model-00001-of-00002.safetensors"))
        save_file({"v": torch.ones(2)}, str(d / "model-00002-of-00002.safetensors"))
    da, db = experiment.policy_digest(a), experiment.policy_digest(b)
    assert da and db and da != db and len(da) == 16 and experiment.policy_digest(a) == da
    assert experiment.policy_digest(tmp_path / "none") is None and experiment.policy_digest(None) is None
    args = argparse.Namespace(preset="cpu-collapse", steps=20, eval_limit=0, seeds="0", arms="grpo,grpo_ds")
    run = experiment.summarize("grpo", 0, STEADY)
    same = [run | {"start_digest": da}, run | {"arm": "grpo_ds", "start_digest": da}]
    assert "Not every run is known" not in experiment.report(same, args, [])
    mixed = [run | {"start_digest": da}, run | {"arm": "grpo_ds", "start_digest": db}, run | {"seed": 1}]
    md = experiment.report(mixed, args, [])
    assert f"{da}: grpo-s0; {db}: grpo_ds-s0; not recorded: grpo-s1" in md


def test_each_run_is_paired_by_its_gain_over_its_own_starting_policy() -> None:
    """Runs that started from different policies (a warm start rebuilt on another machine) still pair:
    the report shows each run's start EM (recorded, or the baseline's when the digests match) and the
    per-seed differences of EM less start EM."""
    args = argparse.Namespace(
        preset="cpu-collapse", steps=20, eval_limit=100, seeds="0,1", arms="grpo,grpo_llds"
    )
    run = experiment.summarize("grpo", 0, STEADY)
    results = [
        run | {"eval_em": 0.0, "start_eval_em": 0.82},
        run | {"arm": "grpo_llds", "eval_em": 0.7, "start_digest": "d2"},  # start EM from the baseline
        run | {"seed": 1, "eval_em": 0.1, "start_eval_em": 0.82},
        run | {"arm": "grpo_llds", "seed": 1, "eval_em": 0.6, "start_digest": "other"},  # unknown start
    ]
    base = {"model": "/m/policy", "digest": "d2", "eval_em": 0.78, "eval_n": 100}
    md = experiment.report(results, args, [], base=base)
    assert "| eval EM | start EM |" in md
    assert "| 0.700 | 0.780 |" in md and "| 0.600 | - |" in md
    assert "| grpo_llds - grpo | eval_em | s0: +0.700, s1: +0.500 | +0.600 | 0.141 |" in md
    # s0: (0.70 - 0.78) - (0.00 - 0.82) = +0.74; s1 has no known start for grpo_llds, so it is left out.
    assert "| grpo_llds - grpo | eval_em - start | s0: +0.740 | +0.740 | - |" in md


@pytest.mark.parametrize("arm", list(experiment.ARMS))
def test_every_arm_is_a_valid_trainer_config_on_the_collapse_preset(arm: str) -> None:
    cfg = TrainerConfig(
        **experiment.merged(experiment.preset_config("cpu-collapse", "trainer"), experiment.ARMS[arm])
    )
    llds = cfg.regularizer.type == "llds" or cfg.lld.alarm.type == "enable_llds"
    assert llds == ("llds" in arm or "alarm" in arm)
    if arm == "grpo_llds_l1":
        assert cfg.regularizer.coef == 1.0


def _policy(folder: Path, last: float) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file({"w": torch.tensor([0.0, last])}, str(folder / "model.safetensors"))
    return folder


def test_a_piece_of_the_study_from_another_start_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One start per study: study.json records its tensors' digest, and a later piece whose start has
    other bytes stops before anything runs."""
    ran: list[str] = []
    monkeypatch.setattr(
        experiment, "_run_or_exit", lambda a, s, args: ran.append(a) or experiment.summarize(a, s, STEADY)
    )
    monkeypatch.setattr(experiment, "baseline", lambda args: None)
    a, b = _policy(tmp_path / "a", 0.0), _policy(tmp_path / "b", 1.0)
    base = ["--out", str(tmp_path / "study"), "--preset", "cpu", "--steps", "30", "--eval-limit", "0"]
    assert experiment.main([*base, "--model", str(a), "--seeds", "0", "--arms", "grpo"]) == 0
    recorded = json.loads((tmp_path / "study" / "study.json").read_text())
    assert recorded["start_digest"] == experiment.policy_digest(a) and recorded["start"] == a.name
    with pytest.raises(SystemExit, match=f"start_digest '{experiment.policy_digest(a)}' there"):
        experiment.main([*base, "--model", str(b), "--seeds", "1", "--arms", "grpo"])
    assert ran == ["grpo"]


def test_checkpoints_are_evaluated_per_question_once_and_dead_steps_have_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--eval-steps: the kept weights at each step (found by the step in their marker, not the version
    number) are evaluated on every question, per-question rows go to OUT/questions/, the fixed probe
    set is scored once per run, and a finished run gains only the checkpoints it lacks."""
    import subprocess

    evals: list[list[str]] = []
    fake = _fake_eval(evals, em=0.5)

    def run(cmd: list[str], *a: Any, **k: Any) -> Any:
        out = fake(cmd, *a, **k)
        d = Path(cmd[cmd.index("--out") + 1])
        rep = json.loads((d / "eval.json").read_text())
        rep["summary"][0]["n"] = 2
        rep["examples"] = {"synthworld-eval": [{"id": "q0", "em": 1.0, "f1": 1.0, "searches": 1, "prediction": "x"},
                                               {"id": "q1", "em": 0.0, "f1": 0.0, "searches": 2, "prediction": "y"}]}  # fmt: skip
        (d / "eval.json").write_text(json.dumps(rep))
        return out

    probes: list[dict[int, Path]] = []
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(
        experiment,
        "probe_lld",
        lambda models, out: (
            probes.append(models) or out.parent.mkdir(parents=True, exist_ok=True) or out.write_text("{}")
        ),
    )
    folder = tmp_path / "runs" / "grpo-s0"
    for version, step in ((7, 10), (9, 12)):  # a resumed run: versions ahead of steps
        d = folder / "run" / "weights" / f"v{version:06d}"
        d.mkdir(parents=True)
        (d / "COMPLETE").write_text(json.dumps({"version": version, "step": step, "files": {}}))
    (folder / "rollout_variant.toml").write_text("topk = 2\n")
    shape = experiment._shape(folder / "rollout_variant.toml")
    (folder / "result.json").write_text(
        json.dumps({"arm": "grpo", "seed": 0, "stopped_dead_at": 12, "eval_shape": shape})
    )
    args = argparse.Namespace(
        out=tmp_path, preset="cpu-study", eval_limit=195, resume=True, eval_steps=[10, 20]
    )
    got = experiment.run_one("grpo", 0, args)
    assert list(got["checkpoints"]) == ["10"] and got["checkpoints"]["10"]["em"] == 0.5 and len(evals) == 1
    assert evals[0][evals[0].index("--model") + 1].endswith("v000007")
    rows = (tmp_path / "questions" / "grpo-s0-step10.jsonl").read_text().splitlines()
    assert [json.loads(r) for r in rows] == [{"id": "q0", "em": 1.0, "f1": 1.0, "searches": 1},
                                             {"id": "q1", "em": 0.0, "f1": 0.0, "searches": 2}]  # fmt: skip
    assert len(probes) == 1 and list(probes[0]) == [10]
    experiment.run_one("grpo", 0, args)  # step 20 has no weights (stopped dead at 12): nothing more to do
    assert len(evals) == 1 and len(probes) == 1


def test_trainer_sets_are_nested_typed_overrides_and_bad_ones_are_named() -> None:
    got = experiment.trainer_sets(["optimizer.lr=4e-5", "kl_coef=0", "regularizer.gate=token", 'run_id="x y"',
                                   "lld.probe=false"])  # fmt: skip
    assert got == {"optimizer": {"lr": 4e-5}, "kl_coef": 0, "regularizer": {"gate": "token"}, "run_id": "x y",
                   "lld": {"probe": False}}  # fmt: skip
    for bad in ("lr", "=3", "optimizer..lr=1"):
        with pytest.raises(ValueError, match=repr(bad).replace(".", r"\.")):
            experiment.trainer_sets([bad])
    cfg = TrainerConfig(
        **experiment.merged(experiment.preset_config("cpu-study", "trainer"), got | {"run_id": "x"})
    )
    assert cfg.optimizer.lr == 4e-5 and cfg.keep_versions_every == 10 and cfg.groups_per_step == 4


@pytest.mark.parametrize("arm", list(experiment.ARMS))
def test_every_arm_is_a_valid_trainer_config_on_the_study_preset(arm: str) -> None:
    cfg = TrainerConfig(
        **experiment.merged(experiment.preset_config("cpu-study", "trainer"), experiment.ARMS[arm])
    )
    assert cfg.kl_coef == 0.001 and cfg.groups_per_step == 4
    if arm == "grpo_skipzero":
        assert cfg.optimizer.skip_updates == "no_signal" and cfg.regularizer.type == "none"
    if arm == "grpo_llds_token":
        assert cfg.regularizer.gate == "token" and cfg.regularizer.coef == 0.2


def test_a_finished_run_is_pruned_to_its_newest_weights_and_a_pruned_step_is_not_taken_for_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a run is finished and evaluated, its checkpoints and every version but the newest are
    deleted (bytes on disk), RUN/PRUNED says what went, --keep-weights keeps them, and asking later for
    a step whose weights went is an error naming it, not a step counted as dead."""
    import subprocess

    evals: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", _fake_eval(evals, em=0.5))
    monkeypatch.setattr(experiment, "probe_lld", lambda models, out: None)
    folder = tmp_path / "runs" / "grpo-s0"
    run = folder / "run"
    for version in (10, 20, 30):
        d = run / "weights" / f"v{version:06d}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"w" * 1000)
        (d / "COMPLETE").write_text(json.dumps({"version": version, "step": version, "files": {}}))
    (run / "weights" / ".v000031.tmp").mkdir()  # a temp folder a crash left: not a version, goes too
    for step in (29, 30):
        (run / "trainer" / "checkpoints" / f"step_{step:08d}").mkdir(parents=True)
        (run / "trainer" / "checkpoints" / f"step_{step:08d}" / "optimizer.pt").write_bytes(b"o" * 3000)
    (run / "trainer" / "train_log.jsonl").write_text(
        "".join(json.dumps({"step": s}) + "\n" for s in range(1, 31))
    )
    (folder / "rollout_variant.toml").write_text("topk = 2\n")
    shape = experiment._shape(folder / "rollout_variant.toml")
    (folder / "result.json").write_text(json.dumps({"arm": "grpo", "seed": 0, "eval_shape": shape}))
    args = argparse.Namespace(out=tmp_path, preset="cpu-study", eval_limit=10, resume=True, eval_steps=[],
                              keep_weights=True)  # fmt: skip
    experiment.run_one("grpo", 0, args)
    assert len(list((run / "weights").iterdir())) == 4 and not (run / experiment.PRUNED).exists()

    args.keep_weights = False
    doomed = [run / "weights" / "v000010", run / "weights" / "v000020", run / "trainer" / "checkpoints"]
    size = sum(f.stat().st_size for d in doomed for f in d.rglob("*") if f.is_file())
    experiment.run_one("grpo", 0, args)
    assert sorted(p.name for p in (run / "weights").iterdir()) == ["v000030"]
    assert list((run / "trainer" / "checkpoints").iterdir()) == []
    rec = json.loads((run / experiment.PRUNED).read_text())
    assert rec["kept"] == "weights/v000030" and rec["freed_bytes"] == size >= 2000 + 6000
    assert set(rec["deleted"]) == {"weights/v000010", "weights/v000020", "weights/.v000031.tmp",
                                   "trainer/checkpoints/step_00000029", "trainer/checkpoints/step_00000030"}  # fmt: skip
    assert (run / "trainer" / "train_log.jsonl").is_file()
    experiment.run_one("grpo", 0, args)  # idempotent: the record of what went stays
    assert json.loads((run / experiment.PRUNED).read_text()) == rec

    args.eval_steps = [20]
    with pytest.raises(SystemExit, match=r"grpo-s0 reached step 20 but its weights were pruned"):
        experiment.run_one("grpo", 0, args)
