"""``parallel = "fsdp"`` on one process and its pieces: the config rule, lockstep sharding, the
sharded checkpoint layout and which layout each mode resumes (2 ranks: tests/integration/test_trainer_fsdp.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from llds_trainer.config import TrainerConfig
from llds_trainer.dist import DistContext


def test_parallel_defaults_to_ddp_and_refuses_fsdp_with_nccl_weight_sync() -> None:
    assert TrainerConfig().parallel == "ddp"
    assert TrainerConfig(parallel="fsdp").parallel == "fsdp"
    assert TrainerConfig(parallel="fsdp", device="cuda", weight_sync="filesystem").parallel == "fsdp"
    with pytest.raises(ValidationError, match="each rank holds only a shard: use weight_sync = 'filesystem'"):
        TrainerConfig(parallel="fsdp", device="cuda", weight_sync="nccl")
    with pytest.raises(ValidationError, match="parallel"):
        TrainerConfig(parallel="zero3")  # type: ignore[arg-type]


def test_lockstep_shards_pad_every_rank_to_the_same_count() -> None:
    items = ["a", "b", "c"]
    assert DistContext(0, 2).shard_lockstep(items) == [("a", True), ("c", True)]
    assert DistContext(1, 2).shard_lockstep(items) == [("b", True), ("a", False)]
    # More ranks than items: the idle rank still runs one (thrown-away) pass.
    assert DistContext(2, 3).shard_lockstep(["a", "b"]) == [("a", False)]
    assert DistContext(0, 1).shard_lockstep(items) == [("a", True), ("b", True), ("c", True)]
    assert DistContext(1, 2).shard_lockstep([]) == []


def _cfg(model: Path, **kw: Any) -> TrainerConfig:
    # One AdamW kernel for both layouts (auto picks fused for replicated parameters, foreach for
    # sharded ones, whose last bits differ): what is compared here is the sharding's arithmetic.
    return TrainerConfig(model=str(model), optimizer={"lr": 1e-3, "implementation": "foreach"},
                         micro_batch_size=2, minibatches_per_step=2,
                         num_threads=1, regularizer={"answer_weight_mode": "adaptive_code"}, seed=5,
                         lld={"probe": False}, **kw)  # fmt: skip


def test_single_process_fsdp_trains_like_ddp_and_checkpoints_sharded(
    tiny_model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    from llds_trainer import checkpoint as ckpt
    from llds_trainer.core import Trainer
    from llds_trainer.synthetic import synthetic_groups

    groups = synthetic_groups(tokenizer, 4, 3, seed=11, think_words=3, doc_words=6)
    ddp, fsdp = Trainer(_cfg(tiny_model_dir)), Trainer(_cfg(tiny_model_dir, parallel="fsdp"))
    # One process: nothing to shard, the same arithmetic (the clip is get_total_norm +
    # clip_grads_with_norm_, which is what clip_grad_norm_ does), so the same numbers.
    a, b = ddp.train_step(groups[:2]), fsdp.train_step(groups[:2])
    for key in ("loss/total", "loss/llds", "actor/grad_norm"):
        assert a[key] == b[key], key
    path = fsdp.save_checkpoint(tmp_path / "fsdp")
    assert ckpt.is_sharded(path) and not (path / ckpt.MODEL_FILE).exists()
    assert ckpt.read_state(path)["parallel"] == "fsdp"
    want = fsdp.train_step(groups[2:])
    # A replicated trainer reads the sharded layout (DCP), and continues the same.
    again = Trainer(_cfg(tiny_model_dir))
    again.load_checkpoint(path)
    got = again.train_step(groups[2:])
    for key in ("loss/total", "loss/llds", "actor/grad_norm"):
        assert got[key] == want[key], key
    for (n, p), q in zip(fsdp.model.named_parameters(), again.model.parameters(), strict=True):
        assert torch.equal(p, q), n
    # The other way round has no name for each AdamW state entry: refused with the way out.
    replicated = ddp.save_checkpoint(tmp_path / "ddp")
    with pytest.raises(ckpt.CheckpointError, match="resume it with parallel = 'ddp'"):
        Trainer(_cfg(tiny_model_dir, parallel="fsdp")).load_checkpoint(replicated)
