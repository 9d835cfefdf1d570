"""Exactness: real multi-turn trajectories of the rollout service (transformers engine), through Redis,
scored by the trainer's own collation and pi_old pass.

- At the sampling version, the trainer's per-token log-probs equal the sampler's
  (``Trajectory.logprobs``) on every loss token, within ``TOLERANCES`` (any token; mean over the
  tokens). Why these numbers: both sides run the same float32 weights on the CPU, so only rounding
  separates them, and the dominant part is the samplers' own: both engines take ``log_softmax`` in
  float32, which on torch 2.13's CPU kernel errs by up to ~1e-4 nats over 49152 classes once logits
  reach ~12 (as in the fine-tuned model; measured against float64: 9.8e-5), while the trainer's
  ``gather - logsumexp`` stays within 1e-6 of float64. Measured: mean |delta| 5.5e-5, max 1.05e-4 on
  both engines (the random model, logits ~0.2, gives ~2e-6). A wrong alignment, temperature or
  context is off by 0.1 to 10 nats, three orders of magnitude above the bounds.
- Observation tokens (``<information>`` passages, invalid-action feedback) carry no trainer log-prob
  (exact zeros, never computed), their recorded sampler values and versions change nothing in a step
  (bit-identical weights and record), garbage in the trainer's outputs on masked positions changes
  nothing either, and the loss mask is 0 exactly on the observation spans the agent appended.

The random tiny model does not search; ``searching_model`` fine-tunes a copy for a few seconds so
that it asks the real (in-process) retriever, and the turns after the observation are sampled freely.
``test_exactness_vllm.py`` runs the same checks on the vLLM engine and imports the helpers from here.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import torch
from test_rollout_service import PASSAGES, QUESTION, _wait, retriever_app

from llds_proto.codec import decode_group
from llds_proto.messages import TrainerInfo, TrajectoryGroup
from llds_proto.search_protocol import invalid_action_ids, observation_ids, parse_action, prompt_ids
from llds_proto.streams import DEFAULT_KEYS, DEFAULT_RUN_ID
from llds_server.http import BackgroundServer

pytestmark = pytest.mark.integration

TOLERANCES = {"vllm": (5e-4, 2e-4), "transformers": (5e-4, 2e-4)}
"""Engine -> (largest |trainer - sampler| log-prob on any loss token, largest mean over the loss
tokens), in nats."""
QUERY = "hamlet author"
MAX_OBS_TOKENS = 200


def ranked_docs(query: str, topk: int = 3) -> list[dict[str, Any]]:
    """What ``retriever_app`` returns for ``query`` (deterministic word-overlap ranking)."""
    words = set(query.lower().split())
    return sorted(PASSAGES, key=lambda p: (-len(words & set(p["contents"].lower().split())), p["id"]))[:topk]


def searching_model(
    base: Path, out: Path, query: str, answer: str | None = None, *, max_steps: int = 300
) -> Path:
    """Fine-tune a copy of ``base`` until, after the prompt of ``QUESTION``, it emits
    ``<search> query </search>`` (and, when ``answer`` is given, after that search's observation,
    ``<answer> answer </answer>``) with probability ~0.99 per token; save it with the tokenizer.

    Only those tokens carry the loss, so elsewhere (after an observation, with no ``answer``) the
    model stays near its random start and samples freely.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base))
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    prompt = prompt_ids(tok, QUESTION)
    search = tok.encode(f"<search> {query} </search>", add_special_tokens=False)
    ids = prompt + search
    targets = [-100] * len(ids)
    targets[len(prompt) - 1 : len(ids) - 1] = search
    if answer is not None:
        ids += observation_ids(tok, ranked_docs(query), MAX_OBS_TOKENS)
        ans = tok.encode(f"<answer> {answer} </answer>", add_special_tokens=False)
        targets += [-100] * (len(ids) - len(targets))
        targets[len(ids) - 1 : len(ids) - 1 + len(ans)] = ans
        ids += ans
        targets += [-100] * (len(ids) - len(targets))
    x = torch.tensor([ids])  # [1, L]
    y = torch.tensor(targets[: len(ids)])  # [L]
    first = int((y != -100).nonzero().min())
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    loss = torch.tensor(math.inf)
    for _ in range(max_steps):
        logits = model(input_ids=x, logits_to_keep=len(ids) - first).logits[0]  # [L - first, V]
        loss = torch.nn.functional.cross_entropy(logits, y[first:], ignore_index=-100)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if loss.item() < 0.01:
            break
    assert loss.item() < 0.01, f"fine-tune did not converge (loss {loss.item():.3f})"
    model.save_pretrained(str(out))
    for f in base.iterdir():
        if f.is_file() and not (out / f.name).exists():
            shutil.copy(f, out / f.name)
    return out


def write_dataset(path: Path) -> Path:
    row = {"id": "q0", "data_source": "world", "question": QUESTION,
           "golden_answers": ["William Shakespeare"], "extra_info": {"index": 0}}  # fmt: skip
    path.write_text(json.dumps(row) + "\n")
    return path


def admit_groups(redis_url: str) -> None:
    """What a trainer writes on start (admission control reads it), with room for many groups."""
    info = TrainerInfo(run_id=DEFAULT_RUN_ID, version=0, step=0, groups_per_step=16, publish_every=1,
                       staleness_k=100)  # fmt: skip
    redis.Redis.from_url(redis_url).set(DEFAULT_KEYS.trainer_info, info.model_dump_json())


def produce_groups(
    model_dir: Path, engine: dict[str, Any], redis_url: str, tmp: Path, n_groups: int, timeout_s: float
) -> list[TrajectoryGroup]:
    """Run the rollout service (training on) against a real retriever and Redis until ``n_groups``
    groups are on the stream; return them decoded."""
    from llds_rollout.app import create_app
    from llds_rollout.config import RolloutSettings

    calls: list[dict[str, Any]] = []
    r = redis.Redis.from_url(redis_url)
    admit_groups(redis_url)
    with BackgroundServer(retriever_app(calls)) as retriever:
        settings = RolloutSettings.load(
            overrides={
                "model": str(model_dir),
                "retriever_url": retriever.url,
                "redis_url": redis_url,
                "dataset": write_dataset(tmp / "train.jsonl"),
                "group_size": 4,
                "max_turns": 2,
                "max_tokens_per_turn": 16,
                "max_obs_tokens": MAX_OBS_TOKENS,
                "max_groups_in_flight": 2,
                "max_staleness": 100,
                "version_poll_s": 0.05,
                "engine": engine,
            }
        )
        with BackgroundServer(create_app(settings)) as srv:
            _wait(lambda: httpx.get(f"{srv.url}/health").status_code == 200, timeout_s, "engine load")
            _wait(lambda: r.xlen(DEFAULT_KEYS.stream) >= n_groups, timeout_s, f"{n_groups} groups")
    assert calls, "no search reached the retriever"
    return [decode_group(f[b"group"]) for _, f in r.xrange(DEFAULT_KEYS.stream)]


def runs(mask: Sequence[int], value: int) -> list[tuple[int, int]]:
    """Maximal runs of ``value`` in ``mask`` as half-open spans."""
    out: list[tuple[int, int]] = []
    start = None
    for j, m in enumerate([*mask, 1 - value]):
        if m == value and start is None:
            start = j
        elif m != value and start is not None:
            out.append((start, j))
            start = None
    return out


def check_observation_spans(groups: Sequence[TrajectoryGroup], tok: Any) -> int:
    """Every maximal loss-mask-0 run is exactly what the agent appended after the turn before it
    (the observation of that turn's query, or the invalid-action feedback), with log-prob 0.0 and
    version -1; every loss-mask-1 run is one assistant turn. Returns the number of ``<information>``
    observations seen."""
    n_info = 0
    for g in groups:
        for t in g.trajectories:
            gens, obs = runs(t.loss_mask, 1), runs(t.loss_mask, 0)
            assert t.action_spans == gens
            assert len(obs) in (len(gens), len(gens) - 1), (gens, obs)
            for (a, e), (oa, oe) in zip(gens, obs, strict=False):
                assert oa == e
                action = parse_action(tok.decode(t.response_ids[a:e], skip_special_tokens=False))
                if action is not None and action[0] == "search" and action[1]:
                    expected = observation_ids(tok, ranked_docs(action[1]), MAX_OBS_TOKENS)
                    n_info += 1
                    assert tok.decode(t.response_ids[oa:oe]).lstrip().startswith("<information>")
                else:
                    expected = invalid_action_ids(tok)
                assert t.response_ids[oa:oe] == expected[: oe - oa]
                assert oe - oa == len(expected) or (
                    oe == len(t.response_ids) and t.finish_reason == "context"
                )
                assert all(x == 0.0 for x in t.logprobs[oa:oe]) and set(t.versions[oa:oe]) == {-1}
    return n_info


def check_collation_alignment(groups: Sequence[TrajectoryGroup], pad_id: int) -> None:
    """In the trainer's micro-batch, target position ``p - 1 + j`` predicts response token ``j`` and
    carries that token's mask, sampler log-prob and version; everything else is masked."""
    from llds_trainer.batch import collate, samples_from_groups

    samples = samples_from_groups(groups)
    mb = collate(samples, list(range(len(samples))), pad_id)
    for b, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        assert mb.input_ids[b, p : p + r].tolist() == list(s.response_ids)
        assert mb.targets[b, p - 1 : p - 1 + r].tolist() == list(s.response_ids)
        assert mb.loss_mask[b, p - 1 : p - 1 + r].tolist() == [float(m) for m in s.loss_mask]
        assert mb.logp_sampler[b, p - 1 : p - 1 + r].tolist() == pytest.approx(list(s.logprobs), abs=0)
        assert mb.versions[b, p - 1 : p - 1 + r].tolist() == list(s.versions)
        outside = torch.ones(mb.loss_mask.shape[1], dtype=torch.bool)
        outside[p - 1 : p - 1 + r] = False
        assert not mb.loss_mask[b, outside].any()


def trainer_config(model_dir: Path, run_dir: Path, **kw: Any) -> Any:
    from llds_trainer.config import TrainerConfig

    base = {"model": str(model_dir), "run_dir": str(run_dir), "device": "cpu", "num_threads": 1,
            "micro_batch_size": 4, "temperature": 1.0, "kl_coef": 0.0}  # fmt: skip
    return TrainerConfig(**{**base, **kw})


def logprob_deltas(groups: Sequence[TrajectoryGroup], model_dir: Path, run_dir: Path) -> dict[str, Any]:
    """The trainer's pi_old pass on the groups: |trainer - sampler| on loss tokens, and the trainer's
    values on every other response position."""
    from llds_trainer.batch import samples_from_groups
    from llds_trainer.core import Trainer

    trainer = Trainer(trainer_config(model_dir, run_dir))
    samples = samples_from_groups(groups)
    old = trainer.scorer.score(samples, entropy=False, ref=False)[0]
    deltas: list[float] = []
    off_mask: list[float] = []
    for s, lp in zip(samples, old, strict=True):
        m = torch.tensor(s.loss_mask, dtype=torch.bool)
        deltas += (lp - torch.tensor(s.logprobs))[m].abs().tolist()
        off_mask += lp[~m].tolist()
    rec = trainer.train_step(groups)
    return {"deltas": deltas, "off_mask": off_mask, "record": rec, "samples": samples}


def check_exactness(result: dict[str, Any], engine: str) -> None:
    tol_max, tol_mean = TOLERANCES[engine]
    d = torch.tensor(result["deltas"], dtype=torch.float64)
    rec = result["record"]
    print(
        f"\n[{engine}] {len(d)} loss tokens: mean |delta| {float(d.mean()):.2e}, max {float(d.max()):.2e}; "
        f"trainer mismatch/abs_logp_diff {rec['mismatch/abs_logp_diff']:.2e}, mismatch/kl {rec['mismatch/kl']:.2e}"
    )
    assert len(d) > 0
    assert float(d.max()) <= tol_max, f"max |delta| {float(d.max()):.3e}"
    assert float(d.mean()) <= tol_mean, f"mean |delta| {float(d.mean()):.3e}"
    # the same number as the trainer itself logs every step
    assert rec["mismatch/abs_logp_diff"] == pytest.approx(float(d.mean()), rel=1e-3, abs=1e-9)
    assert abs(rec["mismatch/kl"]) <= tol_max**2  # k3 >= 0 up to float rounding
    # observation positions: never computed (exact zeros, not a small number)
    assert result["off_mask"] and all(x == 0.0 for x in result["off_mask"])


def perturbed(groups: Sequence[TrajectoryGroup], seed: int = 1) -> list[TrajectoryGroup]:
    """The groups with random sampler log-probs and versions on every observation token."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for g in groups:
        trajs = []
        for t in g.trajectories:
            noise = (-10 * torch.rand(len(t.logprobs), generator=gen)).tolist()
            trajs.append(
                t.model_copy(
                    update={
                        "logprobs": [
                            x if m else n for x, m, n in zip(t.logprobs, t.loss_mask, noise, strict=True)
                        ],
                        "versions": [v if m else 7 for v, m in zip(t.versions, t.loss_mask, strict=True)],
                    }
                )
            )
        out.append(g.model_copy(update={"trajectories": trajs}))
    return out


def check_observations_never_enter_the_loss(
    groups: Sequence[TrajectoryGroup], model_dir: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One step with every loss term on (PPO clip with IS weights on all tokens, KL to a reference,
    entropy, LLDS, the LLD probe), three ways: as sampled; with the recorded sampler log-probs and
    versions of observation tokens randomised; and with the trainer's own log-probs and entropies
    replaced by garbage on every masked position. Same record, bit-identical weights."""
    from llds_trainer.core import Trainer
    from llds_trainer.scoring import Scorer

    kw = {"kl_coef": 0.01, "entropy_coef": 0.01, "correction": {"tokens": "all"}, "regularizer": "llds",
          "minibatches_per_step": 2, "lld": {"probe": True}, "optimizer": {"lr": 1e-3}}  # fmt: skip

    def step(gs: Sequence[TrajectoryGroup], name: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        trainer = Trainer(trainer_config(model_dir, tmp / name, **kw))
        rec = trainer.train_step(gs)
        return rec, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}

    ref_rec, ref_w = step(groups, "ref")
    assert ref_rec["actor/updates"] == 2 and ref_rec["loss/kl"] is not None and ref_rec["loss/llds"] != 0.0
    variants = {"sampler": step(perturbed(groups), "sampler")}

    real_logp = Scorer.logp

    def garbage_logp(self: Any, model: Any, mb: Any, want_entropy: bool) -> Any:
        logp, ent = real_logp(self, model, mb, want_entropy)
        off = 1.0 - mb.loss_mask  # [B, L-1]
        return logp + 7.0 * off, (ent + 3.0 * off if ent is not None else None)

    with monkeypatch.context() as m:
        m.setattr(Scorer, "logp", garbage_logp)
        variants["trainer"] = step(groups, "trainer")

    skip = ("perf/", "time/")
    for name, (rec, w) in variants.items():
        diff = {k: (ref_rec[k], rec[k]) for k in ref_rec if not k.startswith(skip) and rec[k] != ref_rec[k]}
        assert not diff, f"{name}: {diff}"
        assert all(torch.equal(ref_w[k], w[k]) for k in ref_w), f"{name}: weights differ"


# ---------------------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def searcher_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return searching_model(tiny_model_dir, tmp_path_factory.mktemp("searcher"), QUERY)


@pytest.fixture(scope="module")
def hf_groups(
    searcher_dir: Path, redis_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[TrajectoryGroup]]:
    url = redis_server.url
    redis.Redis.from_url(url).flushall()
    engine = {"type": "transformers", "max_batch_size": 8, "torch_threads": 1}
    yield produce_groups(searcher_dir, engine, url, tmp_path_factory.mktemp("hf"), 2, 240.0)


def test_hf_trajectories_are_multi_turn_and_the_mask_is_the_observation_spans(
    hf_groups: list[TrajectoryGroup], tokenizer: Any
) -> None:
    assert check_observation_spans(hf_groups, tokenizer) >= len(hf_groups)
    assert any(t.num_valid_searches >= 1 and t.num_turns >= 2 for g in hf_groups for t in g.trajectories)
    check_collation_alignment(hf_groups, pad_id=tokenizer.pad_token_id or 0)


def test_hf_trainer_logprobs_equal_the_samplers_on_every_loss_token(
    hf_groups: list[TrajectoryGroup], searcher_dir: Path, tmp_path: Path
) -> None:
    check_exactness(logprob_deltas(hf_groups, searcher_dir, tmp_path), "transformers")


def test_hf_observation_tokens_never_enter_the_loss(
    hf_groups: list[TrajectoryGroup], searcher_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_observations_never_enter_the_loss(hf_groups, searcher_dir, tmp_path, monkeypatch)
