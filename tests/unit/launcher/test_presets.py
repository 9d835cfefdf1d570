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
