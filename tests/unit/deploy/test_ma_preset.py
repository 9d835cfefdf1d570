"""The GPU presets the deployments select: the -MA preset is the Search-R1 preset with the LLDS answer
weight and nothing else, so that choosing it (``TRAINER_CONFIG_FILE``, overlays/gpu-ma) changes the
recipe alone."""

from __future__ import annotations

import tomllib
from typing import Any

from deploy_tools import REPO

from llds_trainer.config import TrainerConfig


def _resolved(name: str) -> dict[str, Any]:
    data = tomllib.loads((REPO / "configs" / name).read_text())
    return TrainerConfig.model_validate(data).model_dump(mode="json")


def test_ma_preset_is_search_r1_with_the_adaptive_answer_weight() -> None:
    plain, ma = _resolved("trainer_search_r1.toml"), _resolved("trainer_search_r1_ma.toml")
    assert plain["regularizer"]["answer_weight_mode"] == "off"
    assert ma["regularizer"]["answer_weight_mode"] == "adaptive_code"
    ma["regularizer"]["answer_weight_mode"] = "off"
    assert ma == plain
