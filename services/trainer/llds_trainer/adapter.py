"""LoRA adapters merged into their base weights bit-identically on every machine.

A merge computed the usual way (``peft``'s ``merge_and_unload``: a float32 matrix product added in
float32) depends on the BLAS kernel's summation order, which differs between CPUs (AVX2 or AVX-512,
the thread count), so the same adapter gives slightly different weights on two machines, and runs
"from the same start" do not start from the same policy. Here the update ``scale * B @ A`` is built
in float64 as a sum of rank-one terms, one rank at a time in a fixed order, with separate
elementwise multiplies and adds (each correctly rounded by IEEE 754, no fused multiply-add, no
reduction whose order a library picks), added to the float64 base weight, and rounded to float32
once. Every step is exact arithmetic followed by one IEEE rounding, so the bytes are the same on any
IEEE-754 machine.

Adapters are read in ``peft``'s format (``adapter_config.json`` + ``adapter_model.safetensors``);
only plain LoRA is accepted (no DoRA, rsLoRA, per-module ranks or biases).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MERGED_WEIGHTS = "model.safetensors"
_PREFIX = "base_model.model."


class AdapterError(ValueError):
    """The adapter cannot be merged into this base; the message says which file or tensor and why."""


def read_adapter(folder: str | Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The adapter's tensors and its ``adapter_config.json``, checked to be plain LoRA."""
    from safetensors.torch import load_file

    folder = Path(folder)
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (folder / name).is_file():
            raise AdapterError(f"{folder} has no {name} (not a LoRA adapter folder)")
    cfg = json.loads((folder / ADAPTER_CONFIG).read_text())
    unsupported = {
        "use_dora": bool(cfg.get("use_dora")),
        "use_rslora": bool(cfg.get("use_rslora")),
        "rank_pattern": bool(cfg.get("rank_pattern")),
        "alpha_pattern": bool(cfg.get("alpha_pattern")),
        "fan_in_fan_out": bool(cfg.get("fan_in_fan_out")),
        "bias": cfg.get("bias", "none") != "none",
    }
    if cfg.get("peft_type", "LORA") != "LORA" or any(unsupported.values()):
        bad = [k for k, v in unsupported.items() if v] or [f"peft_type {cfg.get('peft_type')}"]
        raise AdapterError(f"{folder}/{ADAPTER_CONFIG}: only plain LoRA merges here (found {bad})")
    return load_file(str(folder / ADAPTER_WEIGHTS)), cfg


def lora_pairs(adapter: dict[str, Tensor]) -> dict[str, tuple[Tensor, Tensor]]:
    """Base weight name -> (A ``[r, in]``, B ``[out, r]``) of every adapted linear layer."""
    pairs: dict[str, dict[str, Tensor]] = {}
    for key, t in adapter.items():
        for part in ("lora_A", "lora_B"):
            tail = f".{part}.weight"
            if key.endswith(tail):
                module = key[: -len(tail)].removeprefix(_PREFIX)
                pairs.setdefault(f"{module}.weight", {})[part] = t
                break
        else:
            raise AdapterError(f"adapter tensor {key!r} is neither a lora_A nor a lora_B weight")
    out = {}
    for name, p in pairs.items():
        if set(p) != {"lora_A", "lora_B"}:
            raise AdapterError(f"{name}: the adapter has only {sorted(p)}")
        out[name] = (p["lora_A"], p["lora_B"])
    return out


def lora_delta(a: Tensor, b: Tensor, scale: float) -> Tensor:
    """``scale * B @ A`` in float64, one rank-one term at a time in rank order (see the module doc).

    Args:
        a: ``[r, in]``; b: ``[out, r]``.

    Returns:
        ``[out, in]`` float64.
    """
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    delta = torch.zeros((b.shape[0], a.shape[1]), dtype=torch.float64)  # [out, in]
    for k in range(a.shape[0]):
        term = b64[:, k : k + 1] * a64[k : k + 1, :]  # [out, in], each element one rounding
        delta += term
    return delta * scale


def merge_state(
    base: dict[str, Tensor], adapter: dict[str, Tensor], lora_alpha: float, rank: int
) -> dict[str, Tensor]:
    """``base`` with every adapted weight replaced by ``fp32(fp64(W) + alpha/r * B @ A)``."""
    scale = float(lora_alpha) / float(rank)
    out = dict(base)
    for name, (a, b) in lora_pairs(adapter).items():
        if name not in base:
            raise AdapterError(f"the adapter adapts {name!r}, which the base model does not have")
        w = base[name]
        if a.shape[0] != rank or b.shape[1] != rank or tuple(w.shape) != (b.shape[0], a.shape[1]):
            raise AdapterError(
                f"{name}: base {tuple(w.shape)}, A {tuple(a.shape)}, B {tuple(b.shape)} do not fit rank {rank}"
            )
        merged = w.to(torch.float64) + lora_delta(a, b, scale)
        out[name] = merged.to(w.dtype).contiguous()
    return out


def merge_folder(base_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path) -> Path:
    """Write ``base_dir`` with ``adapter_dir`` merged into ``out_dir`` (one ``model.safetensors`` and
    the base's config and tokenizer files); returns ``out_dir``."""
    from safetensors.torch import load_file, save_file

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    files = sorted(base_dir.glob("*.safetensors"))
    if not files:
        raise AdapterError(f"{base_dir} holds no *.safetensors weights")
    base: dict[str, Tensor] = {}
    for f in files:
        base.update(load_file(str(f)))
    adapter, cfg = read_adapter(adapter_dir)
    merged = merge_state(base, adapter, cfg["lora_alpha"], cfg["r"])
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in base_dir.iterdir():
        skip = (
            f.suffix == ".safetensors" or f.name.startswith(".") or f.name == "model.safetensors.index.json"
        )
        if f.is_file() and not skip:
            shutil.copy(f, out_dir / f.name)
    save_file(merged, str(out_dir / MERGED_WEIGHTS), metadata={"format": "pt"})
    return out_dir
