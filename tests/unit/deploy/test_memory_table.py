"""The memory table of docs/deploy.md (``llds_bench.memory``): parameter counts of the published shapes,
each part of the trainer's and the rollout's estimate against numbers worked out by hand, how GPUs are
split, and the committed table being what the module computes now."""

from __future__ import annotations

from pathlib import Path

import pytest
from deploy_tools import REPO

from llds_bench import memory as M
from llds_bench.shapes import SHAPES

DOCS = REPO / "docs" / "deploy.md"
GIB = 1024**3


def test_parameter_counts_of_the_published_shapes() -> None:
    # Qwen2.5-3B: embedding 151936 x 2048 = 311,164,928 (tied head); a layer: q 2048*2048 + 2048,
    # k and v 2 * (2048*256 + 256), o 2048*2048, MLP 3 * 2048*11008, norms 2 * 2048 = 77,076,992; x 36;
    # final norm 2048.
    assert M.layer_params(SHAPES["qwen2.5-3b"]) == 77_076_992
    assert M.param_count(SHAPES["qwen2.5-3b"]) == 311_164_928 + 36 * 77_076_992 + 2048 == 3_085_938_688
    assert M.param_count(SHAPES["qwen2.5-7b"]) == 7_615_616_512  # Qwen2.5-7B's published count
    assert M.kv_bytes_per_token(SHAPES["qwen2.5-3b"]) == 2 * 36 * 2 * 128 * 2 == 36864


TINY = SHAPES["tiny"]  # hidden 64, intermediate 128, 2 layers, 1 head of 64, 1 KV head, vocabulary 4096, tied
KNOBS = M.TrainerKnobs(micro_batch=2, seq_len=16, loss_tokens=5, param_bytes=4, compute_bytes=2, reference_bytes=2,
                       chunk=4, checkpointing=True, parallel="ddp", fused_adam=True)  # fmt: skip
P = 2 * 41_280 + 262_208  # layers (4160 + 8320 + 4096 + 24576 + 128 each) + embedding 4096*64 + final norm 64


def test_trainer_parts_of_one_rank_by_hand() -> None:
    assert M.param_count(TINY) == P == 344_768
    m = M.trainer_memory(TINY, KNOBS, ranks=1)
    assert (m.weights, m.grads, m.adam, m.reference) == (4 * P, 4 * P, 8 * P, 2 * P)
    # checkpointed layer inputs: 2 layers x 32 tokens x 64 x 4 B, + the mask 2 x 16 x 16 x 1 B
    assert m.saved == 2 * 32 * 64 * 4 + 2 * 16 * 16 == 16_896
    # a layer per token: 4 B x 6 x 64 + 2 B x (6 x 64 + 4 x 64 + 4 x 128) = 3840; x 32 tokens, x 2 for its backward
    assert m.layer == 2 * 3840 * 32 == 245_760
    # 10 scored tokens, 4 at once, vocabulary 4096, 24 B
    assert m.head == 24 * 4 * 4096 == 393_216
    assert m.fsdp == m.ddp_buffer == m.adam_temp == 0
    assert m.total == 18 * P + 2 * GIB + 16_896 + 393_216


def test_unchunked_head_scales_with_every_scored_token() -> None:
    m = M.trainer_memory(TINY, M.TrainerKnobs(**{**KNOBS.__dict__, "chunk": 0}), ranks=1)
    assert m.head == 24 * 10 * 4096


def test_ddp_adds_a_flat_gradient_copy_fsdp_shards_and_gathers() -> None:
    ddp = M.trainer_memory(TINY, KNOBS, ranks=2)
    assert ddp.ddp_buffer == 4 * P and ddp.weights == 4 * P
    assert ddp.total == 18 * P + 2 * GIB + 4 * P  # the buffer phase outweighs the micro-step here
    k = M.TrainerKnobs(**{**KNOBS.__dict__, "parallel": "fsdp", "fused_adam": False})
    fsdp = M.trainer_memory(TINY, k, ranks=2)
    assert (fsdp.weights, fsdp.adam, fsdp.reference, fsdp.ddp_buffer) == (2 * P, 4 * P, P, 0)
    # the root unit gathered (fp32 weights and gradients, bf16 reference) + 3 layers' fp32 parameters
    assert fsdp.fsdp == 262_208 * (2 * 4 + 2) + 3 * 41_280 * 4
    assert fsdp.adam_temp == 2 * P  # foreach's sqrt of the (sharded) second moment
    assert fsdp.total == 9 * P + 2 * GIB + 16_896 + 393_216 + fsdp.fsdp
    with pytest.raises(ValueError, match="ranks must be >= 1"):
        M.trainer_memory(TINY, KNOBS, ranks=0)


def test_knobs_of_the_search_r1_presets() -> None:
    k = M.TrainerKnobs.from_presets(M.load_preset("trainer_search_r1"), M.load_preset("rollout_search_r1"))
    # 3 search turns + the answer turn of 500 tokens each; bf16 reference on a GPU, 1024 tokens a chunk
    assert k == M.TrainerKnobs(micro_batch=8, seq_len=4096, loss_tokens=2000, param_bytes=4, compute_bytes=2,
                               reference_bytes=2, chunk=1024, checkpointing=True, parallel="ddp",
                               fused_adam=True)  # fmt: skip
    cpu = M.TrainerKnobs.from_presets(
        M.load_preset("trainer_search_r1"), M.load_preset("rollout_search_r1"), "cpu"
    )
    assert cpu.reference_bytes == 4


def test_rollout_reservation_and_kv_room_by_hand() -> None:
    engine = M.load_preset("rollout_search_r1").engine
    gpu = M.GPU("80 GB", 80.0)
    r = M.rollout_memory(SHAPES["qwen2.5-3b"], engine, 4096, gpu)
    assert r.reserved == 0.85 * 80 * GIB and r.weights == 2 * 3_085_938_688
    assert r.kv_per_sequence == 4096 * 36864
    # 68 GiB - 5.75 GiB of weights - 4 GiB = 58.3 GiB: 414 sequences of 144 MiB
    assert r.sequences == int((0.85 * 80 * GIB - 2 * 3_085_938_688 - 4 * GIB) // (4096 * 36864)) == 414


def test_verdicts_and_the_gpu_split() -> None:
    gpu = M.GPU("x", 100.0)
    assert [M.verdict(g * GIB, gpu) for g in (90, 90.5, 100, 100.5)] == ["fits", "tight", "tight", "no"]
    assert [M.split(n) for n in M.GPU_COUNTS] == [(1, 0), (1, 1), (2, 2), (4, 4)]
    with pytest.raises(ValueError, match="gpus must be >= 1"):
        M.split(0)


def test_the_docs_table_is_the_computed_one() -> None:
    text = DOCS.read_text()
    assert M.replace_between_markers(text, M.table()) == text, (
        "docs/deploy.md's memory table is stale: python -m llds_bench.memory --write docs/deploy.md"
    )


def test_write_and_check_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "deploy.md"
    doc.write_text(f"intro\n{M.BEGIN}\nold table\n{M.END}\nafter\n")
    assert M.main(["--check", str(doc)]) == 1
    assert M.main(["--write", str(doc)]) == 0
    assert M.main(["--check", str(doc)]) == 0
    assert doc.read_text() == f"intro\n{M.BEGIN}\n{M.table()}{M.END}\nafter\n"
    with pytest.raises(ValueError, match="expected one"):
        M.replace_between_markers("no markers", "x")


def test_the_table_shows_what_the_presets_fix() -> None:
    """The rows the deployment docs rely on: search_r1 on its own 141 GB GPU fits, on 80 GB it is tight;
    sharded over 4 ranks it fits 80 GB; as it was (float32 reference, unchunked head) it fit no 80 GB GPU."""
    cells = [
        line.strip("| ").split(" | ") for line in M.table().splitlines() if line.startswith("| search_r1")
    ]
    rows = {c[0]: c[1:] for c in cells if len(c) == 1 + len(M.GPU_COUNTS) * len(M.GPUS)}  # the first table
    assert rows["search_r1, ddp (compose)"][2:4] == ["72.9 tight", "72.9 fits"]
    assert rows["search_r1, fsdp (k8s)"][6].endswith("fits")
    assert all(c.endswith("no") for c in rows["search_r1 as it was (float32 reference, unchunked head)"][::2])
