"""Which compute dtype the forward passes can use here: bfloat16 autocast where the hardware has it
natively (CUDA; x86 CPUs with AVX512-BF16 or AMX; ARM CPUs with the BF16 extension), float32 elsewhere.

On a CPU without native bfloat16, torch emulates it through float32 conversions and an autocast
forward is slower than a plain float32 one, so ``auto`` never picks it there. The machines this
project runs on differ in this (one 2-core box of a kind had AVX512-BF16, the next only AVX-512), so
it is detected at run time, never assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

AutocastSetting = Literal["none", "bfloat16", "auto"]

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
"""``/proc/cpuinfo`` flags (x86 ``flags``, ARM ``Features``) that mean native bfloat16 arithmetic."""


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU feature flags of this machine (empty where ``/proc/cpuinfo`` is not readable)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    out: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            out.update(value.split())
    return out


def cpu_native_bf16(cpuinfo: str | None = None) -> bool:
    """True if this CPU computes in bfloat16 natively (see :data:`BF16_CPU_FLAGS`)."""
    return bool(cpu_flags(cpuinfo) & set(BF16_CPU_FLAGS))


@dataclass(frozen=True)
class Precision:
    """The resolved compute dtype of the forward passes and why it was chosen."""

    autocast: Literal["none", "bfloat16"]
    reason: str

    def torch_dtype(self) -> torch.dtype | None:
        import torch

        return torch.bfloat16 if self.autocast == "bfloat16" else None


def resolve_precision(setting: AutocastSetting, device_type: str, cpuinfo: str | None = None) -> Precision:
    """``auto``: bfloat16 autocast on CUDA and on CPUs with native bfloat16, else float32; ``none``
    and ``bfloat16`` are taken as they are (bfloat16 on a CPU without it runs, emulated, slower)."""
    if setting == "none":
        return Precision("none", "float32 (autocast none)")
    if setting == "bfloat16":
        return Precision("bfloat16", "bfloat16 autocast (asked for)")
    if device_type == "cuda":
        return Precision("bfloat16", "bfloat16 autocast (auto: CUDA)")
    if cpu_native_bf16(cpuinfo):
        found = sorted(cpu_flags(cpuinfo) & set(BF16_CPU_FLAGS))
        return Precision("bfloat16", f"bfloat16 autocast (auto: the CPU has {', '.join(found)})")
    return Precision("none", "float32 (auto: this CPU has no native bfloat16, emulated would be slower)")
