"""Every preset in configs/ loads with its service's config class (a typo fails here, not at run time)."""

from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("rollout_*.toml")), ids=lambda p: p.name)
def test_rollout_presets_load(path: Path) -> None:
    from llds_rollout.config import RolloutSettings

    cfg = RolloutSettings.load(path, {"dataset": "train.jsonl"})
    assert cfg.group_size >= 1 and cfg.host == "127.0.0.1"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("trainer_*.toml")), ids=lambda p: p.name)
def test_trainer_presets_load(path: Path) -> None:
    from llds_trainer.config import TrainerConfig

    cfg = TrainerConfig.load(path)
    assert cfg.minibatches_per_step >= 2, "LLDS is zero on the first update of a step"
    # Every publish is a checkpoint (issue 30): a crash orphans no version, so drops no group by design.
    assert cfg.publish_every % cfg.checkpoint_every == 0, (cfg.publish_every, cfg.checkpoint_every)


@pytest.mark.parametrize("preset", ["cpu", "tiny", "gpu"])
def test_every_up_preset_has_both_service_configs(preset: str) -> None:
    assert (CONFIGS / f"rollout_{preset}.toml").exists() and (CONFIGS / f"trainer_{preset}.toml").exists()


def test_gpu_preset_without_model_is_a_clear_error() -> None:
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "llds.cli", "up", "--preset", "gpu"], capture_output=True, text=True
    )
    assert res.returncode == 2 and "--preset gpu needs --model" in res.stderr


def test_up_stops_early_when_the_rollout_needs_vllm_and_none_is_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from llds import cli
    from llds.up import Up, UpConfig
    from llds_server.settings import ConfigError

    monkeypatch.setattr(cli, "vllm_python", lambda: None)
    up = Up(UpConfig(preset="tiny", run_dir=tmp_path))
    with pytest.raises(ConfigError, match="make vllm-env"):
        up.check_engine()
    light = tmp_path / "rollout.toml"
    light.write_text('group_size = 2\n[engine]\ntype = "transformers"\n')
    assert (
        Up(UpConfig(preset="tiny", run_dir=tmp_path, rollout_config=light)).check_engine() == "transformers"
    )
    monkeypatch.setattr(cli, "vllm_python", lambda: "/some/python")
    assert up.check_engine() == "vllm"


def test_the_cpu_preset_starts_from_the_shipped_start_and_fine_tunes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``llds up``'s cpu preset trains from ``--start``'s merged policy; no warm start runs."""
    from llds import starts, up

    asked: list[str] = []
    monkeypatch.setattr(starts, "policy_dir", lambda name: (asked.append(name), tmp_path / name)[1])
    monkeypatch.setattr(up, "ensure_world", lambda seed: tmp_path / "world")
    monkeypatch.setattr(up, "ensure_world_index", lambda seed: tmp_path / "index")
    monkeypatch.setattr(up, "run_tool", lambda argv: pytest.fail(f"a tool ran: {argv}"))
    paths = up.Up(up.UpConfig(run_dir=tmp_path / "run")).prepare()
    assert paths["policy"] == tmp_path / starts.DEFAULT_START and asked == [starts.DEFAULT_START]
    up.Up(up.UpConfig(run_dir=tmp_path / "run", start="other")).prepare()
    assert asked[-1] == "other"
