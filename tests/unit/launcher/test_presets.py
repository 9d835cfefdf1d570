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


def test_warmstart_uses_the_measured_number_of_demonstrations(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cached policy every figure in README.md was measured with: 160 demonstrations, not the whole
    train split (4x longer)."""
    from llds import assets, up

    calls: list[list[str]] = []
    monkeypatch.setattr(assets, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(assets, "smollm2_dir", lambda: tmp_path / "base")
    monkeypatch.setattr(up, "ensure_world", lambda seed: tmp_path / "world")
    monkeypatch.setattr(up, "run_tool", calls.append)
    up.ensure_warmstart(0)
    (argv,) = calls
    assert (
        argv[0] == "warmstart"
        and argv[argv.index("--max-examples") + 1] == str(up.WARMSTART_EXAMPLES) == "160"
    )
