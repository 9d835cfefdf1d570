"""``llds bench soak`` without the services: /proc sampling, the slope fit and the verdicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llds import bench, soak

MIB = soak.MIB


def test_slope_matches_hand_computed_least_squares() -> None:
    assert soak.slope([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    # (x - mean x) = -1.5 -.5 .5 1.5, (y - mean y) = -1.5 -.5 -.5 2.5: sxy = 6, sxx = 5
    assert soak.slope([0, 1, 2, 3], [1, 2, 2, 5]) == pytest.approx(1.2)
    assert soak.slope([4, 4, 4], [1, 2, 3]) == 0.0


def _samples(series: str, values: list[float], step0: int = 0, every: int = 10) -> list[dict[str, float]]:
    return [{"t": i, "step": step0 + i * every, series: v} for i, v in enumerate(values)]


def test_a_steady_leak_fails_naming_the_series() -> None:
    # 2 MiB per 10 steps for 100 steps, after a 20% warm-up: +16 MiB over the window, > 1 MiB floor
    # and > 10% of the ~22 MiB median
    values = [10 * MIB + i * 2 * MIB for i in range(11)]
    (trend,) = soak.analyse(_samples("redis/used_memory_bytes", values), warmup=0.2)
    assert trend.n == 9 and trend.slope_per_step == pytest.approx(0.2 * MIB)
    assert trend.growth == pytest.approx(16 * MIB)
    assert trend.verdict == "GROWING" and trend.failed


def test_warm_up_growth_and_noise_pass() -> None:
    # memory that climbs at start, then only wobbles: the warm-up leaves the climb out of the fit
    values = [100 * MIB, 400 * MIB, 800 * MIB] + [
        900 * MIB + (5 * MIB if i % 2 else -5 * MIB) for i in range(12)
    ]
    (trend,) = soak.analyse(_samples("rss_bytes/rollout", values), warmup=0.2)
    assert trend.verdict == "ok", trend


def test_stream_length_must_stay_bounded() -> None:
    bounded = soak.analyse(_samples("redis/stream_length", [3, 5, 2, 4, 3, 5, 2, 4, 3, 4]), 0.0)
    assert bounded[0].verdict == "ok"
    untrimmed = soak.analyse(_samples("redis/stream_length", list(range(0, 100, 10))), 0.0)
    assert untrimmed[0].verdict == "GROWING"


def test_series_growing_by_design_are_reported_not_checked() -> None:
    for name in ("run_dir/log_bytes", "run_dir/total_bytes", "run_dir/redis_bytes"):
        (trend,) = soak.analyse(_samples(name, [i * 100 * MIB for i in range(10)]), 0.0)
        assert trend.verdict == "info" and not trend.failed


def test_too_few_samples_is_no_pass() -> None:
    (trend,) = soak.analyse(_samples("open_files/trainer", [10, 11]), 0.0)
    assert trend.verdict == "too few samples" and trend.failed


def test_every_sampled_series_has_a_rule() -> None:
    for name in ("rss_bytes/vllm-ish", "open_files/launcher", "processes/rollout", "redis/used_memory_bytes",
                 "redis/stream_length", "run_dir/state_bytes", "run_dir/checkpoints", "run_dir/weight_versions"):  # fmt: skip
        assert soak.tolerance_of(name) is not None, name


def test_process_tree_covers_descendants_and_the_session(tmp_path: Path) -> None:
    # a session leader whose child double-forks: the grandchild is re-parented but stays in the session
    script = (
        "import os, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "print('ready', flush=True); time.sleep(30)\n"
    )
    leader = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert leader.stdout is not None and leader.stdout.readline().strip() == b"ready"
        table = soak.process_table()
        pids = soak.process_tree(leader.pid, table, session=True)
        assert leader.pid in pids and len(pids) == 2
        assert soak.process_tree(leader.pid, table, session=False) == pids
        use = soak.usage(pids)
        assert use["processes"] == 2 and use["rss_bytes"] > MIB and use["open_files"] >= 3
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


def test_own_process_is_measured() -> None:
    me = os.getpid()
    assert soak.rss_bytes(me) > MIB and soak.open_files(me) >= 3
    assert soak.rss_bytes(2**22 + 12345) == 0 and soak.open_files(2**22 + 12345) == 0


def test_run_dir_usage_splits_state_from_logs(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "trainer.log").write_bytes(b"x" * 100)
    (tmp_path / "redis" / "appendonlydir").mkdir(parents=True)
    (tmp_path / "redis" / "appendonlydir" / "a.aof").write_bytes(b"x" * 50)
    for step in (1, 2):
        d = tmp_path / "trainer" / "checkpoints" / f"step_{step:08d}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "trainer" / "checkpoints" / ".step_00000003.tmp").mkdir()
    (tmp_path / "trainer" / "train_log.jsonl").write_bytes(b"x" * 10)
    (tmp_path / "weights" / "v000002").mkdir(parents=True)
    (tmp_path / "weights" / "v000002" / "COMPLETE").write_bytes(b"x" * 5)
    (tmp_path / "weights" / "v000003").mkdir()
    use = soak.run_dir_usage(tmp_path)
    assert use == {"total_bytes": 2165, "state_bytes": 2005, "log_bytes": 110, "redis_bytes": 50,
                   "checkpoints": 2, "weight_versions": 1}  # fmt: skip


def test_report_names_what_grows() -> None:
    trends = soak.analyse(_samples("redis/stream_length", list(range(0, 100, 10))), 0.0)
    text = soak.report(trends, "llds bench soak --steps 90", 90, 600.0, 0.0)
    assert text.startswith("# Soak") and "FAILED, growing: redis/stream_length" in text


def test_benchmarks_md_has_the_soak_section_until_it_is_measured() -> None:
    assert "llds bench soak --preset tiny --steps 500" in bench.SOAK_PLACEHOLDER
    assert soak.report([], "x", 0, 0.0, 0.2).splitlines()[0] == bench.SOAK_PLACEHOLDER.splitlines()[0]


def test_bad_arguments_are_a_usage_error() -> None:
    with pytest.raises(SystemExit) as e:
        soak.main(["--steps", "0"])
    assert e.value.code == 2


def test_a_resumed_soak_continues_the_series(tmp_path: Path) -> None:
    (tmp_path / "soak_samples.jsonl").write_text('{"t": 10.0, "step": 0}\n{"t": 20.5, "step": 5}\n')
    up = type("UpStub", (), {"run_dir": tmp_path})()
    sampler = soak.Sampler(up, every=5)  # type: ignore[arg-type]
    assert [s["step"] for s in sampler.samples] == [0, 5]
    assert sampler.next_step == 10
    assert 20.5 <= time.monotonic() - sampler.t0 < 25


def test_resume_needs_a_run_dir(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as e:
        soak.main(["--resume", str(tmp_path)])
    assert e.value.code == 2


def test_a_report_is_rederived_from_committed_samples(tmp_path: Path) -> None:
    steady = "".join(
        f'{{"t": {i}, "step": {i}, "rss_bytes/trainer": {600 * MIB}}}\n' for i in range(0, 100, 5)
    )
    leak = "".join(
        f'{{"t": {i}, "step": {i}, "rss_bytes/trainer": {600 * MIB + i * 4 * MIB}}}\n'
        for i in range(0, 100, 5)
    )
    (tmp_path / "ok.jsonl").write_text(steady)
    (tmp_path / "leak.jsonl").write_text(leak)
    out = tmp_path / "report.md"
    assert soak.main(["--from-samples", str(tmp_path / "ok.jsonl"), "--out", str(out)]) == 0
    assert "| rss_bytes/trainer | 16 |" in out.read_text() and "nothing keeps growing" in out.read_text()
    assert soak.main(["--from-samples", str(tmp_path / "leak.jsonl")]) == 1
    assert soak.main(["--from-samples", str(tmp_path / "missing.jsonl")]) == 2


def test_run_figures_from_the_train_log_samples_and_logged_drops(tmp_path: Path) -> None:
    train = [
        {"step": i, "time/unix": 1000.0 + 80 * i, "perf/step_s": 70.0 + i, "data/groups": 2,
         "mismatch/kl": (-1) ** i * 1e-9 * i, "mismatch/abs_logp_diff": 1e-6, "reward/mean": i / 10}
        for i in range(1, 11)
    ]  # fmt: skip
    samples = [
        {"t": 60.0 * i, "step": i, "rss_bytes/trainer": (1000 + i) * MIB, "rss_bytes/rollout": 4000 * MIB,
         "redis/used_memory_bytes": 1.5 * MIB, "redis/stream_length": i % 3, "run_dir/total_bytes": 4096 * MIB}
        for i in range(0, 11, 2)
    ]  # fmt: skip
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "trainer.log").write_text(
        "INFO llds.trainer step 1 ...\n"
        "WARNING llds.trainer dropping entry 17-0 (world:1:2:x): stale\n"
        "WARNING llds.trainer dropping entry 18-0 (-): invalid\n"
        "WARNING llds.trainer dropping entry 19-0 (world:3:2:x): orphaned\n"
    )
    (run / "logs" / "rollout.log").write_text(
        "x stale group dropped group_id=a min_version=1 trainer=3 k=1\n"
    )
    drops = soak.drop_lines(run)
    assert [d.split(":")[0] for d in drops] == ["trainer"] * 3 + ["rollout"]
    fig = soak.run_figures(samples, train, drops)
    assert fig["steps"] == 10 and fig["groups_trained"] == 20
    assert fig["wall_min"] == 10.0
    assert fig["step_s_median"] == 75.5 and fig["cycle_s_median"] == 80.0
    assert fig["mismatch_kl_max_abs"] == pytest.approx(1e-8) and fig["mismatch_abs_logp_diff_max"] == 1e-6
    assert (
        fig["trainer_dropped_stale"],
        fig["trainer_dropped_invalid"],
        fig["trainer_dropped_orphaned"],
    ) == (1, 1, 1)
    assert fig["rollout_dropped_stale"] == 1
    assert fig["rss_peak_total_mib"] == 5010 and fig["rss_peak_trainer_mib"] == 1010
    assert fig["redis_used_memory_peak_mib"] == 1.5 and fig["stream_length_max"] == 2
    assert fig["reward_first_tenth"] == pytest.approx(0.1) and fig["reward_last_tenth"] == pytest.approx(1.0)
    # and the committed files give the same figures and a report that shows them
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (tmp_path / "d.log").write_text("".join(d + "\n" for d in drops))
    out = tmp_path / "report.md"
    args = ["--from-samples", str(tmp_path / "s.jsonl"), "--train-log", str(tmp_path / "t.jsonl"),
            "--drops", str(tmp_path / "d.log"), "--out", str(out), "--report-only"]  # fmt: skip
    assert soak.main(args) == 0
    assert (
        "| trainer_dropped_stale | 1 |" in out.read_text() and "| step_s_median | 75.5 |" in out.read_text()
    )
    with pytest.raises(SystemExit):
        soak.main(["--train-log", str(tmp_path / "t.jsonl")])
