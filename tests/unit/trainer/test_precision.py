"""bfloat16 autocast is chosen only where the hardware computes in it natively."""

from __future__ import annotations

from llds_trainer.precision import cpu_native_bf16, resolve_precision

AVX512_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n"
AVX512_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n"
AMX = "processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_native_bf16_flags() -> None:
    assert not cpu_native_bf16(AVX512_ONLY)
    assert cpu_native_bf16(AVX512_BF16)
    assert cpu_native_bf16(AMX)
    assert cpu_native_bf16(ARM_BF16)
    assert not cpu_native_bf16("")


def test_auto_picks_bf16_only_with_native_support_and_says_why() -> None:
    off = resolve_precision("auto", "cpu", AVX512_ONLY)
    assert off.autocast == "none" and off.torch_dtype() is None and "no native bfloat16" in off.reason
    on = resolve_precision("auto", "cpu", AVX512_BF16)
    assert on.autocast == "bfloat16" and "avx512_bf16" in on.reason
    import torch

    assert on.torch_dtype() is torch.bfloat16
    assert resolve_precision("auto", "cuda", AVX512_ONLY).autocast == "bfloat16"
    # Explicit settings are taken as they are.
    assert resolve_precision("none", "cpu", AVX512_BF16).autocast == "none"
    assert resolve_precision("bfloat16", "cpu", AVX512_ONLY).autocast == "bfloat16"
