"""``llds up`` supervision without the services: a dead child is never success, restarts are bounded,
run ids are valid and per run dir, ``--resume`` reads back what the first run wrote.

Children here are small Python processes standing in for the services (they print, then sleep or
exit); the Redis cases use a real valkey-server.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
import tomllib
from pathlib import Path

import pytest

from llds import supervisor, up
from llds.redis_server import RedisServer
from llds.supervisor import Child, ChildFailed, exit_status
from llds_proto.streams import RunKeys, check_run_id

SLEEPER = [sys.executable, "-c", "print('hello from the child', flush=True); import time; time.sleep(120)"]


def _up(tmp_path: Path, **kw: object) -> up.Up:
    cfg = up.UpConfig(preset="tiny", run_dir=tmp_path / "run", retriever_port=0, rollout_port=0,
                      trainer_port=0, dashboard_port=0, redis_port=0, **kw)  # fmt: skip
    return up.Up(cfg)


def _child(tmp_path: Path, name: str, argv: list[str] = SLEEPER) -> Child:
    return Child(name=name, argv=argv, log_path=tmp_path / "logs" / f"{name}.log").start(echo=False)


def _wait_dead(child: Child, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while child.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not child.running()


def _wait_line(child: Child, text: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(text in line for line in child.tail) and time.monotonic() < deadline:
        time.sleep(0.05)


# ---------------------------------------------------------------------------- run ids


@pytest.mark.parametrize(
    "name", ["20261201-101500", "my run (2)!", ".hidden", "ünïcode-名前", "x" * 200, "---", "a.b_c-d"]
)
def test_run_id_is_valid_for_any_run_dir_name(tmp_path: Path, name: str) -> None:
    rid = up.run_id_for(tmp_path / name)
    assert check_run_id(rid) == rid
    RunKeys(rid)  # usable as a key scope
    assert up.run_id_for(tmp_path / name) == rid  # stable


def test_run_ids_differ_for_same_named_run_dirs(tmp_path: Path) -> None:
    a, b = up.run_id_for(tmp_path / "a" / "run"), up.run_id_for(tmp_path / "b" / "run")
    assert a != b and a.startswith("run-") and b.startswith("run-")


def test_start_writes_run_id_and_passes_it_to_trainer_and_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: dict[str, Child] = {}

    def fake_start(self: Child, echo: bool = True) -> Child:
        started[self.name] = self
        return self

    monkeypatch.setattr(Child, "start", fake_start)
    monkeypatch.setattr(supervisor, "wait_healthy", lambda *a, **k: 0.0)
    monkeypatch.setenv("REDIS_URL", "redis://:hunter2@127.0.0.1:1/0")
    monkeypatch.setenv("LLDS_TRAINER_MICRO_BATCH_SIZE", "3")  # resolved into the file, not passed on
    u = _up(tmp_path)
    u.start({"world": tmp_path, "index": tmp_path, "policy": tmp_path / "policy"})
    assert (u.run_dir / "run_id").read_text().strip() == u.run_id == up.run_id_for(u.run_dir)
    # each child gets one resolved config file: its TOML (the run dir's copy, which --resume reads
    # again) with the wiring on top; the Redis URL's password only in its environment
    files = {}
    for name in ("rollout", "trainer"):
        copy = u.run_dir / up.CONFIG_COPIES / f"{name}.toml"
        assert copy.read_text() == (up.REPO_CONFIGS / f"{name}_tiny.toml").read_text()
        argv = started[name].argv
        assert argv[-2:] == ["--config", str(u.run_dir / up.CONFIG_COPIES / f"{name}.resolved.toml")]
        files[name] = tomllib.loads(Path(argv[-1]).read_text())
        assert files[name]["run_id"] == u.run_id and "hunter2" not in Path(argv[-1]).read_text()
        assert started[name].env[f"{up.CHILD_ENV[name]}REDIS_URL"] == "redis://:hunter2@127.0.0.1:1/0"
        assert started[name].clear_env == up.CHILD_ENV[name]
    assert (files["rollout"]["model"], files["rollout"]["initial_version"]) == (str(tmp_path / "policy"), 0)
    assert files["rollout"]["group_size"] == 2  # from rollout_tiny.toml
    assert files["trainer"]["micro_batch_size"] == 3 and files["trainer"]["groups_per_step"] == 1
    assert files["trainer"]["run_dir"] == str(u.run_dir / "trainer")
    written = up.UpConfig.load(u.run_dir / "up_config.toml")
    assert written.run_dir == u.run_dir and written.redis_url == "redis://:hunter2@127.0.0.1:1/0"


def test_fresh_run_refuses_a_run_dir_holding_a_run(tmp_path: Path) -> None:
    u = _up(tmp_path)
    u.check_run_dir()
    u.run_dir.mkdir(parents=True)
    (u.run_dir / "run_id").write_text("other-run\n")
    with pytest.raises(up.ConfigError, match="--resume"):
        _up(tmp_path).check_run_dir()


# ---------------------------------------------------------------------------- published weights


def _publish(root: Path, version: int, marker_version: int | None = None) -> Path:
    d = root / f"v{version:06d}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"x")
    if marker_version is not None:
        (d / "COMPLETE").write_text(json.dumps({"version": marker_version, "step": version, "files": {}}))
    return d


def test_latest_weights_is_the_newest_complete_version(tmp_path: Path) -> None:
    root = tmp_path / "weights"
    assert up.latest_weights(root) is None
    _publish(root, 1, 1)
    v2 = _publish(root, 2, 2)
    _publish(root, 3)  # no marker: publish still under way or crashed
    _publish(root, 4, 9)  # marker of another version
    (root / ".v000005.tmp").mkdir()
    assert up.latest_weights(root) == (2, v2)


def test_rollout_restarts_on_the_newest_published_weights(tmp_path: Path) -> None:
    u = _up(tmp_path)
    u.paths = {"world": tmp_path, "index": tmp_path, "policy": tmp_path / "policy"}
    u.redis_url = "redis://127.0.0.1:1/0"
    assert u.rollout_start() == (str(tmp_path / "policy"), 0)
    v3 = _publish(u.weights_root, 3, 3)
    argv, _ = u.spec("rollout")
    cfg = tomllib.loads(Path(argv[argv.index("--config") + 1]).read_text())
    assert (cfg["model"], cfg["initial_version"], cfg["replica_name"]) == (str(v3), 3, up.REPLICA_NAME)


def test_logged_step_skips_a_line_cut_by_a_crash(tmp_path: Path) -> None:
    log = tmp_path / "train_log.jsonl"
    assert up.logged_step(log) == 0
    log.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "loss/')
    assert up.logged_step(log) == 2


def test_the_admin_token_file_is_private_from_the_moment_it_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    u = _up(tmp_path)
    u.run_dir.mkdir(parents=True)
    (u.run_dir / "admin_token").write_text("an older token\n")  # a resumed run: a file written before
    (u.run_dir / "admin_token").chmod(0o644)
    chmods: list[object] = []
    monkeypatch.setattr(Path, "chmod", lambda self, mode: chmods.append((self, mode)))
    old = os.umask(0)  # nothing masks the mode a file is created with
    try:
        u.banner()
    finally:
        os.umask(old)
    path = u.run_dir / "admin_token"
    assert path.read_text() == u.token + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and not chmods
    assert [p.name for p in u.run_dir.iterdir()] == ["admin_token"]


# ---------------------------------------------------------------------------- dead children


def test_exit_status_names_the_signal() -> None:
    assert exit_status(-signal.SIGKILL) == "killed by SIGKILL"
    assert exit_status(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert exit_status(3) == "exit code 3"
    assert exit_status(None) == "still running"


@pytest.mark.parametrize("name", ["retriever", "rollout", "trainer", "dashboard"])
def test_a_killed_child_is_reported_with_status_log_and_tail(tmp_path: Path, name: str) -> None:
    u = _up(tmp_path)
    u.children = [_child(tmp_path, n) for n in ("retriever", "rollout", "trainer", "dashboard")]
    try:
        victim = next(c for c in u.children if c.name == name)
        _wait_line(victim, "hello")
        u.check()  # all alive: nothing to say
        victim.signal_group(signal.SIGKILL)
        _wait_dead(victim)
        with pytest.raises(ChildFailed) as e:
            u.check()
        msg = str(e.value)
        assert msg.startswith(f"{name} died (killed by SIGKILL)"), msg
        assert str(victim.log_path) in msg and "hello from the child" in msg
        assert "--resume" in msg
    finally:
        for c in u.children:
            c.stop(timeout_s=5)


def test_trainer_exit_0_is_success_only_after_its_last_step(tmp_path: Path) -> None:
    u = _up(tmp_path, steps=3)
    log = u.run_dir / "trainer" / "train_log.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text('{"step": 1}\n{"step": 2}\n')
    trainer = _child(tmp_path, "trainer", [sys.executable, "-c", "pass"])
    u.children = [trainer]
    _wait_dead(trainer)
    with pytest.raises(ChildFailed, match=r"trainer died \(exit code 0\)[\s\S]*stopped at step 2 of 3"):
        u.check()
    log.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    u.check()
    assert u.wait_for_steps() == {}  # the trainer is gone after its last step: the wait ends


def test_wait_for_steps_raises_when_the_trainer_crashes(tmp_path: Path) -> None:
    """The bug this guards: an unreachable, exited trainer ended the wait as if training were done."""
    u = _up(tmp_path, steps=200)
    crash = [sys.executable, "-c", "import sys; print('Traceback: boom', flush=True); sys.exit(1)"]
    u.children = [_child(tmp_path, "rollout"), _child(tmp_path, "trainer", crash)]
    try:
        with pytest.raises(ChildFailed, match=r"^trainer died \(exit code 1\)[\s\S]*Traceback: boom"):
            u.wait_for_steps(poll_s=0.1)
    finally:
        for c in u.children:
            c.stop(timeout_s=5)


def test_restart_on_failure_restarts_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(supervisor, "wait_healthy", lambda *a, **k: 0.0)
    u = _up(tmp_path, restart_on_failure=True, max_restarts=2)
    monkeypatch.setattr(u, "spec", lambda name: (SLEEPER, {}))
    rollout = _child(tmp_path, "rollout")
    u.children = [rollout]
    try:
        for n in (1, 2):
            pid = rollout.pid
            rollout.signal_group(signal.SIGKILL)
            _wait_dead(rollout)
            u.check()
            assert rollout.running() and rollout.pid != pid and rollout.restarts == n
            assert f"rollout died (killed by SIGKILL; log {rollout.log_path}); restarting it ({n}/2)" in (
                capsys.readouterr().out
            )
        rollout.signal_group(signal.SIGKILL)
        _wait_dead(rollout)
        with pytest.raises(ChildFailed, match=r"rollout died \(killed by SIGKILL\)[\s\S]*2 of 2 used"):
            u.check()
    finally:
        rollout.stop(timeout_s=5)


def test_a_trainer_out_of_learning_signal_is_not_restarted_and_sets_the_exit_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EXIT_NO_SIGNAL: the policy, not the process, failed; a restart would sample the same dead
    policy again, so even with restart_on_failure the run ends, with that status for ``llds up``."""
    from llds_proto.exits import EXIT_NO_SIGNAL

    monkeypatch.setattr(supervisor, "wait_healthy", lambda *a, **k: 0.0)
    u = _up(tmp_path, restart_on_failure=True, max_restarts=2, steps=50)
    monkeypatch.setattr(u, "spec", lambda name: (SLEEPER, {}))
    out = [
        sys.executable,
        "-c",
        f"print('trainer stopped: no signal', flush=True); raise SystemExit({EXIT_NO_SIGNAL})",
    ]
    trainer = _child(tmp_path, "trainer", out)
    u.children = [trainer]
    try:
        _wait_dead(trainer)
        with pytest.raises(ChildFailed, match="no learning signal left") as e:
            u.check()
        assert e.value.exit_code == EXIT_NO_SIGNAL and trainer.restarts == 0
    finally:
        trainer.stop(timeout_s=5)


def test_dead_redis_is_reported_or_restarted_on_its_data(tmp_path: Path) -> None:
    u = _up(tmp_path)
    u.redis = RedisServer(data_dir=tmp_path / "redis").start()
    try:
        u.check()
        u.redis.kill()
        with pytest.raises(ChildFailed, match=r"^redis died \(killed by SIGKILL\); log .*redis.log"):
            u.check()
        u.cfg = u.cfg.model_copy(update={"restart_on_failure": True})
        u.check()
        assert u.redis.ping() and u.redis_restarts == 1
    finally:
        u.redis.stop()


# ---------------------------------------------------------------------------- --resume


def test_resume_reads_back_the_first_runs_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    cfg, resume = up.parse_args(["--preset", "tiny", "--steps", "4", "--run-dir", str(tmp_path / "r"),
                                 "--rollout-port", "0", "--no-dashboard"])  # fmt: skip
    assert not resume
    first = up.Up(cfg)
    first.run_dir.mkdir(parents=True)
    (first.run_dir / "run_id").write_text(first.run_id + "\n")
    cfg.model_copy(update={"run_dir": first.run_dir}).write_toml(first.run_dir / "up_config.toml")

    again, resume = up.parse_args(["--resume", str(tmp_path / "r"), "--steps", "9", "--exit-when-done"])
    assert resume
    assert (again.preset, again.rollout_port, again.dashboard, again.steps) == ("tiny", 0, False, 9)
    assert again.exit_when_done
    cont = up.Up(again, resume=True)
    assert cont.run_id == first.run_id and cont.run_dir == first.run_dir
    cont.check_run_dir()  # resuming into a run dir is what --resume is for
    # the children's configs: the copies the first run made, when they exist
    assert cont.child_config("rollout") == up.REPO_CONFIGS / "rollout_tiny.toml"
    (first.run_dir / up.CONFIG_COPIES).mkdir()
    for name in ("rollout", "trainer"):
        (first.run_dir / up.CONFIG_COPIES / f"{name}.toml").write_text("")
        assert cont.child_config(name) == first.run_dir / up.CONFIG_COPIES / f"{name}.toml"


def test_resuming_a_finished_run_to_exit_when_done_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`llds up --resume RUN --exit-when-done` of a run at its steps (what `llds experiment --resume`
    does to evaluate a run whose experiment process died after training) exits 0 at once: its trainer
    would exit before it ever answered /health, which read as a dead child."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    cfg, _ = up.parse_args(
        ["--preset", "tiny", "--steps", "2", "--run-dir", str(tmp_path / "r"), "--no-dashboard"]
    )
    first = up.Up(cfg)
    (first.run_dir / "trainer").mkdir(parents=True)
    (first.run_dir / "run_id").write_text(first.run_id + "\n")
    cfg.model_copy(update={"run_dir": first.run_dir}).write_toml(first.run_dir / "up_config.toml")
    (first.run_dir / "trainer" / "train_log.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    monkeypatch.setattr(up.Up, "prepare", lambda self: pytest.fail("a finished run must start nothing"))
    assert up.main(["--resume", str(first.run_dir), "--exit-when-done"]) == 0
    assert "has trained its 2 steps already: nothing to do" in capsys.readouterr().out


@pytest.mark.parametrize("flag", [["--preset", "cpu"], ["--model", "m"], ["--run-dir", "x"]])
def test_resume_refuses_flags_that_change_the_run(tmp_path: Path, flag: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        up.parse_args(["--resume", str(tmp_path), *flag])
    assert e.value.code == 2


def test_resume_of_a_folder_that_is_no_run_dir_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        up.parse_args(["--resume", str(tmp_path)])
    assert e.value.code == 2
    assert "not a run dir of llds up" in capsys.readouterr().err


def test_a_child_does_not_inherit_the_variables_its_config_file_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLDS_TRAINER_LR", "1")
    monkeypatch.setenv("LLDS_OTHER", "kept")
    show = [sys.executable, "-c",
            "import os; print(sorted(k for k in os.environ if k.startswith(('LLDS_OTHER', 'LLDS_TRAINER_'))))"]  # fmt: skip
    c = Child(name="t", argv=show, log_path=tmp_path / "t.log", env={"LLDS_TRAINER_REDIS_URL": "u"},
              clear_env="LLDS_TRAINER_").start(echo=False)  # fmt: skip
    assert c.proc is not None and c.proc.wait(timeout=30) == 0
    time.sleep(0.5)
    assert "['LLDS_OTHER', 'LLDS_TRAINER_REDIS_URL']" in (tmp_path / "t.log").read_text()


def _watched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **progress: object
) -> tuple[up.Up, list[float]]:
    """An Up whose children (sleepers named trainer and rollout) answer /health 200, whose step log,
    stream and rollout counter read from ``progress`` (mutable), on a clock the test moves."""
    u = _up(tmp_path, stall_timeout_s=60)
    u.children = [_child(tmp_path, "trainer"), _child(tmp_path, "rollout")]
    clock = [1000.0]
    monkeypatch.setattr(up.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(up.httpx.Client, "get", lambda self, url: type("R", (), {"status_code": 200})())
    monkeypatch.setattr(up.Up, "logged_step", lambda self: progress["step"])
    monkeypatch.setattr(up.Up, "_groups_added", lambda self: progress["added"])
    monkeypatch.setattr(up.Up, "_rollout_tokens", lambda self: progress["tokens"])
    return u, clock


def test_watchdog_names_a_trainer_that_trains_without_logging_a_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    progress: dict[str, object] = {"step": 3, "added": 10, "tokens": 500.0}
    u, clock = _watched(tmp_path, monkeypatch, **progress)
    monkeypatch.setattr(up.Up, "logged_step", lambda self: progress["step"])
    try:
        for t in range(0, 121, 10):  # steps keep coming: never stalled
            clock[0] = 1000.0 + t
            progress["step"] = 3 + t // 30
            u.watch({"state": "training"})
        for t in range(130, 181, 10):  # the step count stops; the limit is 60 s
            clock[0] = 1000.0 + t
            u.watch({"state": "training"})
        clock[0] = 1000.0 + 195
        with pytest.raises(ChildFailed) as e:
            u.watch({"state": "training"})
        msg = str(e.value)
        assert (
            msg.startswith("trainer stalled (pid ") and "no step logged for 7" in msg and "trainer.log" in msg
        ), msg
        assert "--restart-on-failure" in msg
    finally:
        for c in u.children:
            c.stop(timeout_s=5)


def test_watchdog_blames_the_rollout_only_when_it_produces_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    progress: dict[str, object] = {"step": 3, "added": 10, "tokens": 500.0}
    u, clock = _watched(tmp_path, monkeypatch, **progress)
    monkeypatch.setattr(up.Up, "_rollout_tokens", lambda self: progress["tokens"])
    try:
        for t in range(0, 301, 10):  # no group yet, but episodes finish: generating slowly is progress
            clock[0] = 1000.0 + t
            progress["tokens"] = 500.0 + t
            u.watch({"state": "waiting"})
        for t in range(310, 361, 10):  # nothing at all any more (the limit is 60 s)
            clock[0] = 1000.0 + t
            u.watch({"state": "waiting"})
        clock[0] = 1000.0 + 375
        with pytest.raises(ChildFailed) as e:
            u.watch({"state": "waiting"})
        assert str(e.value).startswith("rollout stalled (pid "), str(e.value)
        assert "no group reached the stream and no episode finished for 75 s" in str(e.value)
    finally:
        for c in u.children:
            c.stop(timeout_s=5)


def test_watchdog_off_with_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    u, clock = _watched(tmp_path, monkeypatch, step=1, added=0, tokens=0.0)
    u.cfg = u.cfg.model_copy(update={"stall_timeout_s": 0})
    try:
        for t in range(0, 10_000, 100):
            clock[0] = 1000.0 + t
            u.watch({"state": "training"})
    finally:
        for c in u.children:
            c.stop(timeout_s=5)


def test_watchdog_looks_before_redis_is_known(tmp_path: Path) -> None:
    """The bug this guards (a CI failure): a trainer not answering yet made the watchdog build a
    Redis client from the empty URL of a run whose Redis was not started, and raise ValueError."""
    u = _up(tmp_path, stall_timeout_s=60)
    assert u.redis_url == ""
    assert u._groups_added() is None
    u.watch({"state": "starting"})  # rollout unreachable, no step log, no Redis: a look, no error
