"""Training stays correct with staleness above one (issue 16, item 6).

Four trajectories are sampled on the transformers engine in ``inflight`` mode while the weights move
from version 0 to 1 to 2 under them, so single turns hold tokens of two or three versions. The
trainer at version 2 with ``staleness_k = 2`` takes the group, and every token is corrected against
its own sampling version: the version and sampler log-prob the trainer reads for each loss token are
the ones the engine recorded for it, its staleness is 2 minus that version, and its truncated-IS
weight is ``min(c, pi_old / sampler)`` with that token's own sampler log-prob (1 on version-2 tokens,
which are not stale).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from llds_proto import steplog as K
from llds_proto.messages import Trajectory, TrajectoryGroup
from llds_rollout.engine.base import GenerationRequest
from llds_rollout.engine.hf import TransformersEngine
from llds_trainer.batch import collate, samples_from_groups
from llds_trainer.config import TrainerConfig
from llds_trainer.core import Trainer
from llds_trainer.correction import RATIO_QUANTILE_KEYS
from llds_trainer.synthetic import synthetic_groups

pytestmark = [pytest.mark.integration]

CAP = 2.0
TOKENS = 120


def _versions(tiny_model_dir: Path, root: Path) -> list[Path]:
    """Folders of versions 0, 1, 2: the tiny model and two perturbations of it, each loadable alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = [tiny_model_dir]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    torch.manual_seed(0)
    for v in (1, 2):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.03 * torch.randn_like(p))
        folder = root / f"w{v}"
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        out.append(folder)
    return out


def _sample_across_swaps(
    engine: TransformersEngine, prompts: list[list[int]], folders: list[Path]
) -> list[Any]:
    async def main() -> list[Any]:
        tasks = [
            asyncio.create_task(engine.generate(GenerationRequest(p, max_tokens=TOKENS, temperature=1.0)))
            for p in prompts
        ]
        for v in (1, 2):
            start = engine.stats()["generated_tokens"]
            while engine.stats()["generated_tokens"] < start + len(prompts) * TOKENS // 3:
                assert not any(t.done() for t in tasks), "a request ended before the swap"
                await asyncio.sleep(0.002)
            await engine.update_weights(load_file(str(folders[v] / "model.safetensors")), folders[v], v)
        return list(await asyncio.gather(*tasks))

    return asyncio.run(main())


def test_every_token_is_corrected_against_its_own_sampling_version(
    tiny_model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    folders = _versions(tiny_model_dir, tmp_path)
    (template,) = synthetic_groups(tokenizer, 1, 4, seed=2)
    engine = TransformersEngine(str(tiny_model_dir), max_batch_size=8, swap_mode="inflight", seed=1)
    engine.start()
    try:
        results = _sample_across_swaps(engine, [t.prompt_ids for t in template.trajectories], folders)
    finally:
        engine.shutdown()
    assert all(len(r.token_ids) == TOKENS for r in results)
    assert all(len(set(r.versions)) >= 2 for r in results), [sorted(set(r.versions)) for r in results]
    assert {v for r in results for v in r.versions} == {0, 1, 2}

    trajs = [
        Trajectory.model_validate(
            t.model_dump()
            | {
                "response_ids": r.token_ids,
                "logprobs": r.logprobs,
                "loss_mask": [1] * TOKENS,
                "versions": r.versions,
                "action_spans": [(0, TOKENS)],
                "answer_span": None,
                "reward": float(i % 2),
            }
        )
        for i, (t, r) in enumerate(zip(template.trajectories, results, strict=True))
    ]
    group = TrajectoryGroup.model_validate(template.model_dump() | {"trajectories": trajs})
    assert group.min_version == 0 and group.max_version == 2

    cfg = TrainerConfig(model=str(folders[2]), staleness_k=2, micro_batch_size=2, num_threads=1, seed=0,
                        correction={"type": "tis", "tokens": "stale", "cap": CAP}, lld={"probe": False})  # fmt: skip
    tr = Trainer(cfg)
    tr.state.version = 2
    samples = samples_from_groups([group])
    old = tr.scorer.score(samples, entropy=False, ref=False)[0]
    out, _ = tr._correct(samples, old)
    assert out is not None
    full = collate(samples, range(len(samples)), tr.pad_id)
    logp_old = tr.scorer.place(full, samples, old)
    loss = full.loss_mask.bool()
    for row, r in enumerate(results):  # what the trainer reads per token is what the engine recorded
        assert full.versions[row][loss[row]].tolist() == r.versions
        assert full.logp_sampler[row][loss[row]].tolist() == pytest.approx(r.logprobs, abs=1e-6)
    ratio = torch.exp(logp_old - full.logp_sampler).clamp(max=CAP)
    want = torch.where(full.versions < 2, ratio, torch.ones_like(ratio))
    assert torch.allclose(out.weights[loss], want[loss], rtol=1e-5, atol=1e-6)
    stale = (full.versions < 2) & loss
    assert bool((out.weights[loss & ~stale] == 1.0).all()) and bool((out.weights[stale] != 1.0).any())

    rec = tr.train_step([group])
    assert math.isfinite(rec[K.LOSS_TOTAL]) and rec[K.DATA_STALE_TOKENS] == int(stale.sum())
    assert rec[K.DATA_MIXED_VERSION_TRAJECTORIES] == len(results)
    for b in (0, 1, 2):  # every staleness bucket has tokens
        p1, p50, p99 = (rec[k] for k in RATIO_QUANTILE_KEYS[b])
        assert p1 is not None and p1 <= p50 <= p99, (b, p1, p50, p99)
