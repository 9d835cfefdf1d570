"""Warm-start demonstrations are token-identical to rollout trajectories; the CLI trains and saves."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from llds_proto.search_protocol import TrajectoryBuilder, observation_ids, prompt_ids
from llds_trainer.warmstart import build_demonstration, build_demonstrations, main

CORPUS = [
    {"id": "d1", "contents": '"Zorvath"\nZorvath is a city founded by Elena Marsh.'},
    {"id": "d2", "contents": '"Elena Marsh"\nElena Marsh was born in Quillby.'},
    {"id": "d3", "contents": '"Quillby"\nQuillby is a village on the Tarn river.'},
    {"id": "d4", "contents": '"Tarn"\nThe Tarn is a long river.'},
]
ROWS = [
    {"id": "w-0", "data_source": "world", "question": "Who founded Zorvath", "golden_answers": ["Elena Marsh"],
     "hops": 1, "support": [{"query": "founder of Zorvath", "doc_id": "d1"}]},
    {"id": "w-1", "data_source": "world", "question": "Where was the founder of Zorvath born?",
     "golden_answers": ["Quillby"], "hops": 2,
     "support": [{"query": "founder of Zorvath", "doc_id": "d1"}, {"query": "Elena Marsh birthplace", "doc_id": "d2"}]},
]  # fmt: skip


@pytest.fixture()
def world(tmp_path: Path) -> Path:
    d = tmp_path / "world"
    d.mkdir()
    (d / "corpus.jsonl").write_text("".join(json.dumps(x) + "\n" for x in CORPUS))
    (d / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in ROWS))
    return d


def test_demonstration_tokens_equal_rollout_layout(tokenizer: Any) -> None:
    corpus = {d["id"]: d for d in CORPUS}
    demo = build_demonstration(tokenizer, ROWS[1], corpus, random.Random(3))
    # Rebuild independently, the way the rollout assembles a trajectory turn by turn.
    b = TrajectoryBuilder()
    for k, turn in enumerate(demo.turns):
        ids = tokenizer.encode(turn, add_special_tokens=False)
        b.add_generated(ids, [0.0] * len(ids), 0)
        if k < 2:
            obs_start = len(b)
            # The observation is whatever documents were shown: recover them from the demo's tokens.
            n_obs = (
                demo.loss_mask[obs_start:].index(1)
                if 1 in demo.loss_mask[obs_start:]
                else len(demo.loss_mask) - obs_start
            )
            b.add_observation(demo.response_ids[obs_start : obs_start + n_obs])
    assert demo.prompt_ids == prompt_ids(tokenizer, ROWS[1]["question"])
    assert demo.response_ids == b.response_ids
    assert demo.loss_mask == b.loss_mask
    text = tokenizer.decode(demo.response_ids)
    assert "<search> founder of Zorvath </search>" in text
    assert "<search> Elena Marsh birthplace </search>" in text
    assert text.endswith("<answer> Quillby </answer>")
    assert text.count("<information>") == 2
    # Each observation is exactly observation_ids of three documents, the gold passage among them.
    corpus_list = list(corpus.values())
    obs_ids = [i for i, m in zip(demo.response_ids, demo.loss_mask, strict=True) if m == 0]
    candidates = []
    import itertools

    for combo in itertools.permutations(corpus_list, 3):
        candidates.append(observation_ids(tokenizer, list(combo)))
    first = next(c for c in candidates if obs_ids[: len(c)] == c)
    assert "Zorvath is a city" in tokenizer.decode(first)
    assert sum(1 for x in demo.loss_mask if x) == sum(
        len(tokenizer.encode(t, add_special_tokens=False)) for t in demo.turns
    )


def test_unknown_doc_id_is_a_clear_error(tokenizer: Any, world: Path) -> None:
    from llds_trainer.warmstart import WarmstartError

    bad = dict(ROWS[0], support=[{"query": "q", "doc_id": "nope"}])
    with pytest.raises(WarmstartError, match="nope"):
        build_demonstration(tokenizer, bad, {d["id"]: d for d in CORPUS}, random.Random(0))
    assert len(build_demonstrations(tokenizer, world)) == 2


@pytest.mark.parametrize("mode", ["--full", "--lora"])
def test_cli_trains_and_writes_a_loadable_folder(
    tiny_model_dir: Path, world: Path, tmp_path: Path, mode: str
) -> None:
    out = tmp_path / "out"
    assert main(["--model", str(tiny_model_dir), "--world", str(world), "--out", str(out), "--epochs", "2",
                 "--batch-size", "2", "--lr", "1e-2", mode]) == 0  # fmt: skip
    info = json.loads((out / "warmstart.json").read_text())
    assert info["loss_last"] < info["loss_first"]
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(out))
    assert not any("lora" in n for n, _ in m.named_parameters())
    assert (out / "tokenizer.json").is_file()
