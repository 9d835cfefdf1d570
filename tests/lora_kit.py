"""A LoRA adapter in peft's format over a test model, with a non-zero B (peft starts B at zero, which
would leave nothing to merge): what the adapter-merge and shipped-start tests merge."""

from __future__ import annotations

from pathlib import Path

import torch


def write_lora_adapter(
    base: Path, out: Path, *, rank: int, alpha: int, targets: list[str], b_scale: float
) -> Path:
    """Save a seeded rank-``rank`` adapter of ``targets`` over the model in ``base`` to ``out``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets))
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn_like(p) * b_scale)
    peft.save_pretrained(out)
    return out
