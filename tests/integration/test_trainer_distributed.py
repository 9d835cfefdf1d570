"""Data parallelism: 2 CPU processes (torchrun, gloo) make the same update as 1 process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = """
import json, sys
import torch
from safetensors.torch import save_model
from transformers import AutoTokenizer
from llds_trainer.config import TrainerConfig
from llds_trainer.core import Trainer
from llds_trainer.dist import DistContext
from llds_trainer.synthetic import synthetic_groups

model, out = sys.argv[1], sys.argv[2]
# old_from_first_update off: ranks > 1 always score pi_old in the pass, and one process must score the
# same micro-batches for the two to agree beyond float noise (which AdamW at lr 1e-3 magnifies).
cfg = TrainerConfig(model=model, optimizer={"lr": 1e-3}, micro_batch_size=2, minibatches_per_step=2, num_threads=1,
                    regularizer={"answer_weight_mode": "adaptive_code"}, seed=3, old_from_first_update=False)
dist = DistContext.from_env(torch.device("cpu"))
tr = Trainer(cfg, dist)
groups = synthetic_groups(AutoTokenizer.from_pretrained(model), 4, 3, seed=11, think_words=3, doc_words=6)
recs = [tr.train_step(groups[:2]), tr.train_step(groups[2:])]
if dist.is_main:
    save_model(tr.model, out + "/model.safetensors")
    json.dump(recs, open(out + "/recs.json", "w"))
dist.close()
"""


def run_ranks(n: int, script: Path, *args: str, timeout_s: float = 300) -> None:
    """``python script ARGS`` as one process, or as ``n`` torchrun ranks (gloo) when ``n > 1``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(script), *args]
    if n > 1:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={n}",
            *cmd[1:],
        ]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert res.returncode == 0, res.stderr[-4000:]


def _run(n: int, model: Path, out: Path, script: Path) -> None:
    out.mkdir()
    run_ranks(n, script, str(model), str(out))


def test_two_gloo_processes_match_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    script = tmp_path / "ddp_step.py"
    script.write_text(SCRIPT)
    _run(1, tiny_model_dir, tmp_path / "one", script)
    _run(2, tiny_model_dir, tmp_path / "two", script)
    a = load_file(str(tmp_path / "one" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "model.safetensors"))
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert a.keys() == b.keys()
    moved = 0.0
    for k in a:
        assert (a[k] - b[k]).abs().max().item() < 1e-5, k
        if k in base:
            moved = max(moved, (a[k] - base[k]).abs().max().item())
    assert moved > 1e-4  # the update did something
    ra = json.loads((tmp_path / "one" / "recs.json").read_text())
    rb = json.loads((tmp_path / "two" / "recs.json").read_text())
    for x, y in zip(ra, rb, strict=True):
        for key in ("loss/total", "loss/policy", "loss/llds", "actor/grad_norm", "lld/displacement_mean"):
            assert x[key] == pytest.approx(y[key], rel=1e-4, abs=1e-6), key
