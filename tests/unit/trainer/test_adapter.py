"""LoRA merges are exact IEEE arithmetic in a fixed order: the same bytes wherever they run."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from lora_kit import write_lora_adapter

from llds_proto.digest import tensors_digest
from llds_trainer.adapter import AdapterError, lora_delta, merge_folder, merge_state, read_adapter


def _reference_delta(a: torch.Tensor, b: torch.Tensor, scale: float) -> list[list[float]]:
    """The update in plain Python floats (IEEE doubles), rank by rank: the order the merge promises."""
    r, n_in = a.shape
    n_out = b.shape[0]
    out = []
    for i in range(n_out):
        row = []
        for j in range(n_in):
            acc = 0.0
            for k in range(r):
                acc = acc + float(b[i, k]) * float(a[k, j])
            row.append(acc * scale)
        out.append(row)
    return out


def test_delta_is_bit_identical_to_sequential_double_arithmetic() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 7, generator=g), torch.randn(6, 5, generator=g)
    got = lora_delta(a, b, 2.0)
    ref = torch.tensor(_reference_delta(a, b, 2.0), dtype=torch.float64)
    assert torch.equal(got, ref)  # bit for bit, not approximately
    # And it is the product the adapter means (a BLAS product differs only in the last bits).
    torch.testing.assert_close(got, 2.0 * (b.double() @ a.double()), rtol=1e-12, atol=1e-12)


def test_merge_rounds_once_and_touches_only_adapted_weights() -> None:
    g = torch.Generator().manual_seed(1)
    base = {"model.layers.0.q.weight": torch.randn(6, 7, generator=g), "model.norm.weight": torch.ones(7)}
    adapter = {
        "base_model.model.model.layers.0.q.lora_A.weight": torch.randn(4, 7, generator=g),
        "base_model.model.model.layers.0.q.lora_B.weight": torch.randn(6, 4, generator=g),
    }
    out = merge_state(base, adapter, lora_alpha=8, rank=4)
    a, b = (
        adapter["base_model.model.model.layers.0.q.lora_A.weight"],
        adapter["base_model.model.model.layers.0.q.lora_B.weight"],
    )
    want = (base["model.layers.0.q.weight"].double() + lora_delta(a, b, 2.0)).float()
    assert torch.equal(out["model.layers.0.q.weight"], want)
    assert out["model.layers.0.q.weight"].dtype == torch.float32
    assert out["model.norm.weight"] is base["model.norm.weight"]
    with pytest.raises(AdapterError, match="does not have"):
        merge_state({"model.norm.weight": torch.ones(7)}, adapter, lora_alpha=8, rank=4)
    with pytest.raises(AdapterError, match="do not fit rank"):
        merge_state(base, adapter, lora_alpha=8, rank=3)
    with pytest.raises(AdapterError, match="neither"):
        merge_state(base, {"base_model.model.x.weight": torch.ones(1)}, lora_alpha=8, rank=4)


def _peft_adapter(tiny_model_dir: Path, out: Path) -> Path:
    return write_lora_adapter(
        tiny_model_dir, out, rank=4, alpha=8, targets=["q_proj", "down_proj"], b_scale=0.05
    )


def test_merge_folder_matches_peft_and_is_reproducible(tiny_model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = _peft_adapter(tiny_model_dir, tmp_path / "adapter")
    one = merge_folder(tiny_model_dir, adapter, tmp_path / "one")
    two = merge_folder(tiny_model_dir, adapter, tmp_path / "two")
    assert tensors_digest(one) == tensors_digest(two)
    assert tensors_digest(one) != tensors_digest(tiny_model_dir)
    ours = AutoModelForCausalLM.from_pretrained(str(one), dtype=torch.float32).state_dict()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    theirs = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload().state_dict()
    for k, v in theirs.items():
        torch.testing.assert_close(ours[k], v, rtol=0, atol=1e-6)
    assert (one / "config.json").is_file() and (one / "tokenizer.json").is_file()


def test_only_plain_lora_is_accepted(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter = _peft_adapter(tiny_model_dir, tmp_path / "adapter")
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps(cfg | {"use_dora": True}))
    with pytest.raises(AdapterError, match="use_dora"):
        read_adapter(adapter)
    with pytest.raises(AdapterError, match="not a LoRA adapter folder"):
        read_adapter(tmp_path)


def test_tensors_digest_ignores_file_layout_and_sees_one_bit(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    t = {"b": torch.arange(6, dtype=torch.float32).reshape(2, 3), "a": torch.ones(4, dtype=torch.bfloat16)}
    (tmp_path / "one").mkdir()
    save_file(t, str(tmp_path / "one" / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "two").mkdir()  # another layout: two shards, other metadata
    save_file({"a": t["a"]}, str(tmp_path / "two" / "model-00001.safetensors"))
    save_file({"b": t["b"]}, str(tmp_path / "two" / "model-00002.safetensors"), metadata={"x": "y"})
    assert tensors_digest(tmp_path / "one") == tensors_digest(tmp_path / "two")
    raw = bytearray((tmp_path / "one" / "model.safetensors").read_bytes())
    raw[-1] ^= 1  # the last byte of the last tensor's data
    (tmp_path / "one" / "model.safetensors").write_bytes(bytes(raw))
    assert tensors_digest(tmp_path / "one") != tensors_digest(tmp_path / "two")
    # Same bytes, another shape: another digest.
    (tmp_path / "three").mkdir()
    save_file({"a": t["a"], "b": t["b"].reshape(3, 2)}, str(tmp_path / "three" / "model.safetensors"))
    assert tensors_digest(tmp_path / "three") != tensors_digest(tmp_path / "two")


def test_tensors_digest_errors_name_the_problem(tmp_path: Path) -> None:
    from llds_proto.digest import DigestError

    with pytest.raises(DigestError, match=r"no \*\.safetensors"):
        tensors_digest(tmp_path)
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(DigestError, match="not JSON"):
        tensors_digest(tmp_path)
