"""FSDP2 (``parallel = "fsdp"``): 2 CPU processes (torchrun, gloo) train, checkpoint and publish like 1.

One torchrun launch per configuration runs the whole story, so the test pays the start-up twice:
3 RL steps on fixed groups (a checkpoint after step 2, a publish after step 3), then a second trainer
resumes the step-2 checkpoint and trains step 3 again. ``micro_batch_size = 1`` gives 3 micro-batches
per mini-batch, so the 2 ranks accumulate unequal numbers (2 and 1, the second rank joining with a
zero-weight pass) and the pi_old pass shards 6 micro-batches; ``kl_coef`` puts the (sharded)
reference model on the path.

Tolerance against one process, fp32: losses rel 1e-5 (abs 1e-7), the logged grad norm rel 1e-4,
parameters and AdamW state after 3 steps atol 1e-5. Measured: losses within 5e-6 relative (loss/kl,
a small difference of log-probs), grad norms within 1.4e-5 relative, parameters within 2e-7. Every
forward is the same arithmetic on the same (all-gathered) weights, and the first update's gradients
are bit-equal; what differs is the order of float32 sums. The global gradient norm is summed per
shard, then over ranks: on the 3.1M-element tied embedding either order is about 1e-5 off the float64
norm (checked), so the logged norm and, through the clip coefficient, the updates differ in the 6th
to 7th digit. Gradient sums over micro-batches could differ in order too (2 ranks add their own,
then each other's). A resume is exact (bit-equal).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_trainer_distributed import run_ranks

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOSS_KEYS = ("loss/total", "loss/policy", "loss/llds", "loss/kl", "lld/displacement_mean")
LOSS_TOL = {"rel": 1e-5, "abs": 1e-7}
"""Logged losses, 2 sharded ranks vs 1 process."""
GRAD_NORM_REL = 1e-4
"""Logged global gradient norms (float32 sums of 3M squares in another order), same comparison."""
PARAM_ATOL = 1e-5
"""fp32 parameters and AdamW state after 3 updates, same comparison."""

SCRIPT = """
import json, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from transformers import AutoTokenizer
from llds_trainer.config import TrainerConfig
from llds_trainer.core import Trainer
from llds_trainer.dist import DistContext
from llds_trainer.publish import publish_folder
from llds_trainer.synthetic import synthetic_groups

model, out, parallel = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
# One AdamW kernel and one pi_old source for both layouts (auto would pick fused and the first update's
# forward for the single process only): what is compared is the sharding's arithmetic.
cfg = TrainerConfig(model=model, parallel=parallel, optimizer={"lr": 1e-3, "implementation": "foreach"},
                    micro_batch_size=1, minibatches_per_step=2, num_threads=1, kl_coef=0.01, keep_checkpoints=1,
                    regularizer={"answer_weight_mode": "adaptive_code"}, seed=3, old_from_first_update=False)
dist = DistContext.from_env(torch.device("cpu"))
tok = AutoTokenizer.from_pretrained(model)
groups = synthetic_groups(tok, 4, 3, seed=11, think_words=3, doc_words=6)
steps = [groups[:2], groups[2:], groups[:2]]

def full(tr):
    # model and AdamW state as full tensors on rank 0, flat names
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True) if dist.enabled else None
    msd, osd = get_state_dict(tr.model, tr.optimizer, options=opts)
    if not dist.is_main:
        return {}
    flat = {"model/" + k: v for k, v in msd.items()}
    for name, st in osd["state"].items():
        for k, v in st.items():
            flat[f"opt/{name}/{k}"] = torch.as_tensor(v).clone()
    return {k: v.detach().clone().contiguous() for k, v in flat.items()}

tr = Trainer(cfg, dist)
recs = [tr.train_step(steps[0]), tr.train_step(steps[1])]
path = tr.save_checkpoint(out / "run")
at_k = full(tr)
recs.append(tr.train_step(steps[2]))
after = full(tr)
state = tr.published_state()
if dist.is_main:
    publish_folder(tr.model, tok, out / "weights", version=1, step=3, keep=1, state_dict=state)

again = Trainer(cfg, dist)
again.load_checkpoint(path)
loaded = full(again)
resumed = again.train_step(steps[2])
resumed_after = full(again)
if dist.is_main:
    for name, sd in (("at_k", at_k), ("after", after), ("loaded", loaded), ("resumed_after", resumed_after)):
        save_file(sd, str(out / f"{name}.safetensors"))
    json.dump({"recs": recs, "resumed": resumed, "checkpoint": str(path)}, open(out / "recs.json", "w"))
dist.close()
"""


def _run(n: int, parallel: str, model: Path, out: Path, script: Path) -> dict[str, Any]:
    out.mkdir()
    run_ranks(n, script, str(model), str(out), parallel, timeout_s=600)
    return dict(json.loads((out / "recs.json").read_text()))


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(one process with ddp, two ranks with fsdp) output folders."""
    root = tmp_path_factory.mktemp("fsdp")
    script = root / "fsdp_steps.py"
    script.write_text(SCRIPT)
    _run(1, "ddp", tiny_model_dir, root / "one", script)
    _run(2, "fsdp", tiny_model_dir, root / "two", script)
    return root / "one", root / "two"


def _load(folder: Path, name: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / f"{name}.safetensors"))


def test_two_sharded_ranks_train_like_one_process(runs: tuple[Path, Path], tiny_model_dir: Path) -> None:
    from safetensors.torch import load_file

    one, two = runs
    ra = json.loads((one / "recs.json").read_text())["recs"]
    rb = json.loads((two / "recs.json").read_text())["recs"]
    for step, (x, y) in enumerate(zip(ra, rb, strict=True), 1):
        assert x["actor/updates"] == y["actor/updates"] == 2
        for key in LOSS_KEYS:
            assert y[key] == pytest.approx(x[key], **LOSS_TOL), (step, key)
        for key in ("actor/grad_norm", "actor/grad_norm_max"):
            assert y[key] == pytest.approx(x[key], rel=GRAD_NORM_REL), (step, key)
    a, b = _load(one, "after"), _load(two, "after")
    assert a.keys() == b.keys()
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    moved = 0.0
    for k in a:
        assert a[k].shape == b[k].shape, k
        assert (a[k] - b[k]).abs().max().item() < PARAM_ATOL, k
        name = k.removeprefix("model/")
        if name in base:
            moved = max(moved, (a[k] - base[name]).abs().max().item())
    assert moved > 1e-3  # 3 updates at lr 1e-3 moved the weights: the equality is not vacuous
    assert any(k.startswith("opt/") and k.endswith("exp_avg_sq") for k in b)  # AdamW state compared too


def test_sharded_checkpoint_resumes_exactly(runs: tuple[Path, Path]) -> None:
    _, two = runs
    ck = Path(json.loads((two / "recs.json").read_text())["checkpoint"])
    assert (ck / "sharded" / ".metadata").is_file()
    assert sorted(p.name for p in (ck / "sharded").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert not (ck / "model.safetensors").exists() and (ck / "state.json").is_file()
    assert not list(ck.parent.glob(".step_*"))  # the temp folder was renamed into place
    at_k, loaded = _load(two, "at_k"), _load(two, "loaded")
    assert at_k.keys() == loaded.keys()
    for k in at_k:
        assert at_k[k].equal(loaded[k]), k  # parameters and AdamW moments and step counts
    recs = json.loads((two / "recs.json").read_text())
    for key in (*LOSS_KEYS, "actor/grad_norm"):
        assert recs["resumed"][key] == recs["recs"][2][key], key
    after, resumed = _load(two, "after"), _load(two, "resumed_after")
    for k in after:
        assert after[k].equal(resumed[k]), k


def test_sharded_publish_writes_the_single_process_folder(runs: tuple[Path, Path]) -> None:
    from safetensors.torch import load_file

    one, two = runs
    fa, fb = one / "weights" / "v000001", two / "weights" / "v000001"
    assert sorted(p.name for p in fa.iterdir()) == sorted(p.name for p in fb.iterdir())
    assert json.loads((fb / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    wa, wb = load_file(str(fa / "model.safetensors")), load_file(str(fb / "model.safetensors"))
    assert wa.keys() == wb.keys() and "lm_head.weight" not in wb  # the tied head written once
    gathered = _load(two, "after")
    for k in wa:
        assert wa[k].dtype == wb[k].dtype and wa[k].shape == wb[k].shape, k
        assert (wa[k] - wb[k]).abs().max().item() < PARAM_ATOL, k
        assert wb[k].equal(gathered["model/" + k]), k  # the publish is the trained shards, gathered
    marker = json.loads((fb / "COMPLETE").read_text())
    assert marker["version"] == 1 and marker["step"] == 3 and set(marker["files"]) >= {"model.safetensors"}


def test_a_sharded_checkpoint_resumes_on_one_ddp_process(
    runs: tuple[Path, Path], tiny_model_dir: Path, tokenizer: Any
) -> None:
    """DCP reshards on load: the 2-rank fsdp checkpoint continues in a single replicated process."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from llds_trainer.config import TrainerConfig
    from llds_trainer.core import Trainer
    from llds_trainer.synthetic import synthetic_groups

    _, two = runs
    recs = json.loads((two / "recs.json").read_text())
    tr = Trainer(TrainerConfig(model=str(tiny_model_dir), optimizer={"lr": 1e-3, "implementation": "foreach"},
                               micro_batch_size=1, minibatches_per_step=2, num_threads=1, kl_coef=0.01,
                               regularizer={"answer_weight_mode": "adaptive_code"}, seed=3,
                               old_from_first_update=False))  # fmt: skip
    tr.load_checkpoint(Path(recs["checkpoint"]))
    assert tr.state.step == 2
    at_k = _load(two, "at_k")
    msd, osd = get_state_dict(tr.model, tr.optimizer)
    for name, t in msd.items():
        assert torch.equal(t, at_k["model/" + name]), name
    for name, st in osd["state"].items():
        for k, v in st.items():
            assert torch.equal(torch.as_tensor(v), at_k[f"opt/{name}/{k}"]), (name, k)
    groups = synthetic_groups(tokenizer, 4, 3, seed=11, think_words=3, doc_words=6)
    rec = tr.train_step(groups[:2])
    for key in LOSS_KEYS:
        assert rec[key] == pytest.approx(recs["recs"][2][key], **LOSS_TOL), key
