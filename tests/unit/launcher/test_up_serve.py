"""``llds serve MODEL_DIR`` / ``llds up --no-train`` (issue 29, item 7): the retriever and the rollout,
no Redis, no trainer, no dashboard; training flags refused. Children are not started here (a real
start is tests/e2e/test_llds_serve.py)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from llds import cli, placement, supervisor, up
from llds.supervisor import Child


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("LLDS_UP_", "LLDS_ROLLOUT_", "LLDS_TRAINER_")) or k in (
            "REDIS_URL",
            "CUDA_VISIBLE_DEVICES",
        ):
            monkeypatch.delenv(k)
    monkeypatch.setattr(placement, "_nvidia_smi", lambda *a: None)


def _serving(tmp_path: Path, *flags: str) -> up.Up:
    cfg, resume = up.parse_args(["--no-train", "--model", str(tmp_path / "policy"), "--run-dir",
                                 str(tmp_path / "run"), *flags])  # fmt: skip
    assert not resume and not cfg.train
    return up.Up(cfg)


def test_serving_starts_the_retriever_and_the_rollout_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: dict[str, Child] = {}

    def fake_start(self: Child, echo: bool = True) -> Child:
        started[self.name] = self
        return self

    monkeypatch.setattr(Child, "start", fake_start)
    monkeypatch.setattr(supervisor, "wait_healthy", lambda *a, **k: 0.0)
    monkeypatch.setattr(
        "llds.redis_server.RedisServer.start", lambda self: pytest.fail("serving starts no Redis")
    )
    u = _serving(tmp_path, "--preset", "tiny")
    u.start({"index": tmp_path / "index", "policy": tmp_path / "policy"})
    assert list(started) == ["retriever", "rollout"] and u.redis is None
    rollout = tomllib.loads(Path(started["rollout"].argv[-1]).read_text())
    assert rollout["train"] is False and rollout["model"] == str(tmp_path / "policy")
    assert (
        "dataset" not in rollout and rollout["redis_url"] == "redis://127.0.0.1:6379/0"
    )  # the default, unused
    assert "LLDS_ROLLOUT_REDIS_URL" not in started["rollout"].env
    assert not (u.run_dir / up.CONFIG_COPIES / "trainer.toml").exists()
    assert up.UpConfig.load(u.run_dir / "up_config.toml").train is False


def test_serving_needs_no_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(up, "ensure_world", lambda seed: pytest.fail("no training questions are needed"))
    monkeypatch.setattr(up, "ensure_world_index", lambda seed: tmp_path / "index")
    paths = _serving(tmp_path, "--preset", "tiny").prepare()
    assert paths == {"index": tmp_path / "index", "policy": tmp_path / "policy"}


def test_serving_on_gpus_places_only_the_rollout(tmp_path: Path) -> None:
    u = _serving(tmp_path, "--preset", "gpu", "--gpus", "4")
    assert u.child_names() == ["retriever", "rollout"] and not u.placement.shared
    u.paths = {"index": tmp_path / "index", "policy": tmp_path / "policy"}
    assert u.spec("rollout")[1]["CUDA_VISIBLE_DEVICES"] == "0"
    assert u.spec("retriever")[1]["CUDA_VISIBLE_DEVICES"] == ""
    u = _serving(tmp_path / "b", "--preset", "gpu", "--gpus", "4", "--rollout-gpus", "1,2")
    assert u.child_names() == ["retriever", "rollout", "rollout-1"]
    u.paths = {"index": tmp_path / "index", "policy": tmp_path / "policy"}
    argv, env = u.spec("rollout-1")
    conf = tomllib.loads(Path(argv[-1]).read_text())
    # the preset's own share: no trainer shares the GPU
    assert conf["engine"]["gpu_memory_utilization"] == 0.85 and conf["replica_name"] == "rollout-1"
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and conf["port"] == u.ports["rollout-1"]


@pytest.mark.parametrize("flag", [["--steps", "3"], ["--dataset", "q.jsonl"], ["--trainer-gpus", "1"],
                                  ["--exit-when-done"], ["--redis-port", "0"]])  # fmt: skip
def test_training_flags_are_refused_when_serving(
    tmp_path: Path, flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        _serving(tmp_path, *flag)
    assert e.value.code == 2 and f"{flag[0]} mean nothing without training" in capsys.readouterr().err


def test_llds_serve_is_llds_up_no_train(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[list[str], str]] = []
    monkeypatch.setattr(up, "main", lambda argv, prog="llds up": calls.append((argv, prog)) or 0)
    func, rest = cli.resolve(["serve", "models/x", "--preset", "gpu"])
    assert func is up.serve_main and func(rest) == 0
    assert calls == [(["--no-train", "--model", "models/x", "--preset", "gpu"], "llds serve")]
    assert (
        up.serve_main(["--preset", "gpu"]) == 2 and "the policy folder comes first" in capsys.readouterr().err
    )
    assert up.serve_main([]) == 2 and "usage: llds serve MODEL_DIR" in capsys.readouterr().err
    assert up.serve_main(["--help"]) == 0 and "usage: llds serve MODEL_DIR" in capsys.readouterr().out


def test_resume_cannot_turn_a_run_into_serving(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for f in up.RUN_FILES:
        (run / f).write_text("")
    with pytest.raises(SystemExit):
        up.parse_args(["--resume", str(run), "--no-train"])
    assert "drop --no-train" in capsys.readouterr().err


def test_serving_a_missing_policy_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The one thing `llds serve` must be given: a gpu preset without it is refused before anything starts."""
    assert up.main(["--no-train", "--preset", "gpu", "--run-dir", str(tmp_path / "r")]) == 2
    assert "--preset gpu needs --model" in capsys.readouterr().err
