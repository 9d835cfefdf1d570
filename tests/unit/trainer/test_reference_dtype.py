"""The reference model's dtype (``reference_dtype``): bfloat16 on a GPU by default (half the memory of a
float32 copy), float32 on the CPU, refused in bfloat16 where there is no GPU; its log-probs stay float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llds_trainer.config import TrainerConfig
from llds_trainer.core import Trainer, TrainerError, reference_dtype


@pytest.mark.parametrize(
    ("setting", "device", "want"),
    [("auto", "cuda", torch.bfloat16), ("auto", "cpu", torch.float32), ("float32", "cuda", torch.float32),
     ("bfloat16", "cuda", torch.bfloat16)],
)  # fmt: skip
def test_auto_is_bfloat16_on_a_gpu_and_float32_on_the_cpu(
    setting: str, device: str, want: torch.dtype
) -> None:
    cfg = TrainerConfig.model_validate({"reference_dtype": setting})
    assert reference_dtype(cfg, torch.device(device)) == want


def test_bfloat16_reference_needs_a_gpu() -> None:
    with pytest.raises(ValueError, match="reference_dtype bfloat16 needs a GPU"):
        TrainerConfig.model_validate({"reference_dtype": "bfloat16", "device": "cpu"})
    cfg = TrainerConfig.model_validate({"reference_dtype": "bfloat16"})  # device auto, resolved to the CPU
    with pytest.raises(TrainerError, match="reference_dtype bfloat16 needs a GPU; the trainer runs on cpu"):
        reference_dtype(cfg, torch.device("cpu"))


def test_the_cpu_trainer_loads_a_float32_reference(tiny_model_dir: Path) -> None:
    tr = Trainer(
        TrainerConfig.model_validate({"model": str(tiny_model_dir), "kl_coef": 0.001, "num_threads": 1})
    )
    assert tr.ref_model is not None
    assert {p.dtype for p in tr.ref_model.parameters()} == {torch.float32}
