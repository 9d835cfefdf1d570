"""The synthetic world is deterministic, answerable only by search, and split by entity."""

import json
from pathlib import Path

from llds import world
from llds_proto.search_protocol import split_contents


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_same_seed_same_bytes_other_seed_other_world(tmp_path: Path) -> None:
    world.build(tmp_path / "a", seed=3)
    world.build(tmp_path / "b", seed=3)
    world.build(tmp_path / "c", seed=4)
    for name in ("corpus.jsonl", "train.jsonl", "eval.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()


def test_rows_are_well_formed_and_supported_by_the_corpus(tmp_path: Path) -> None:
    counts = world.build(tmp_path, seed=0)
    corpus = {d["id"]: d["contents"] for d in _read(tmp_path / "corpus.jsonl")}
    assert len(corpus) == counts["passages"] > 100
    train, evals = _read(tmp_path / "train.jsonl"), _read(tmp_path / "eval.jsonl")
    assert len(train) == counts["train"] and len(evals) == counts["eval"] and len(evals) > 50
    assert {r["hops"] for r in train} == {1, 2} == {r["hops"] for r in evals}
    for r in train + evals:
        assert r["reward_model"]["ground_truth"]["target"] == r["golden_answers"]
        assert r["prompt"][0]["content"].endswith(f"Question: {r['question']}?\n")
        assert len(r["support"]) == r["hops"]
        # the answer is written in the last hop's gold passage
        _title, text = split_contents(corpus[r["support"][-1]["doc_id"]])
        assert r["golden_answers"][0] in text
    ids = [r["extra_info"]["index"] for r in train]
    assert ids == list(range(len(train)))


def test_eval_entities_never_appear_in_train_questions(tmp_path: Path) -> None:
    world.build(tmp_path, seed=0)
    train, evals = _read(tmp_path / "train.jsonl"), _read(tmp_path / "eval.jsonl")
    train_docs = {s["doc_id"] for r in train for s in r["support"]}
    for r in evals:
        # at least one hop of every eval question is about an entity no train question touches
        assert any(s["doc_id"] not in train_docs for s in r["support"]), r["question"]
