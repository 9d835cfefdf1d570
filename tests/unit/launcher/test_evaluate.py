"""Evaluation datasets load in FlashRAG and Search-R1 forms; bad rows are named."""

import json
from pathlib import Path

import pytest

from llds.evaluate import EvalError, load_dataset, markdown, row_to_example, summarize


def test_flashrag_row() -> None:
    ex = row_to_example({"id": "q1", "question": "who?", "golden_answers": ["A", "B"]}, 0)
    assert (ex.id, ex.question, ex.golds) == ("q1", "who?", ["A", "B"])


def test_search_r1_row_takes_question_from_prompt_and_golds_from_reward_model() -> None:
    row = {
        "prompt": [{"role": "user", "content": "Answer ... Question: who wrote hamlet?\n"}],
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare"]}},
    }
    ex = row_to_example(row, 7)
    assert (ex.id, ex.question, ex.golds) == ("7", "who wrote hamlet?", ["Shakespeare"])


def test_row_without_answers_is_named() -> None:
    with pytest.raises(EvalError, match="row 3"):
        row_to_example({"question": "q"}, 3)


def test_builtin_and_file_sets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLDS_CACHE_DIR", str(tmp_path / "cache"))
    name, exs = load_dataset("synthworld-eval")
    assert name == "synthworld-eval" and len(exs) > 50
    f = tmp_path / "mini.jsonl"
    f.write_text(json.dumps({"question": "q", "golden_answers": "a"}) + "\n")
    assert load_dataset(str(f))[1][0].golds == ["a"]
    with pytest.raises(EvalError, match="no such"):
        load_dataset(str(tmp_path / "nope.jsonl"))


def test_summary_means_and_markdown() -> None:
    rows = [{"em": 1.0, "f1": 1.0, "substring": 1.0, "searches": 2, "turns": 3},
            {"em": 0.0, "f1": 0.5, "substring": 1.0, "searches": 0, "turns": 1}]  # fmt: skip
    s = summarize("x", rows)
    assert (s["n"], s["em"], s["f1"], s["searches"]) == (2, 0.5, 0.75, 1.0)
    md = markdown([s], {"model": "m", "max_turns": 4, "weights_version": 0, "seconds": 1.0})
    assert "| x | 2 | 0.500 | 0.750 |" in md


def test_nq_bigbench_questions_load_when_the_sdist_is_cached(tmp_path: Path) -> None:
    """The restored NQ set (evaluation only) loads in the FlashRAG form; skipped without the sdist."""
    from llds import assets

    if not (assets.cache_dir() / "downloads" / "bigbench-1.0.0.tar.gz").exists():
        pytest.skip("the bigbench sdist (358 MB) is not in the cache; `llds bench retriever` fetches it")
    name, exs = load_dataset("nq-bigbench")
    assert name == "nq-bigbench" and len(exs) > 10_000
    assert all(ex.question and ex.golds for ex in exs[:100])


def test_mixed_built_in_sets_without_a_retriever_are_refused(tmp_path: Path) -> None:
    import argparse

    from llds.evaluate import run

    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps({"question": "q", "golden_answers": ["a"]}) + "\n")
    args = argparse.Namespace(data=["synthworld-eval", str(f)], limit=1, out=str(tmp_path / "o"), rollout_url=None,
                              model="m", retriever_url=None, world_seed=0, max_turns=1, concurrency=1,
                              split_by=None)  # fmt: skip
    with pytest.raises(EvalError, match="retriever"):
        run(args)


def test_rollout_config_needs_model_and_a_file_and_sets_the_reported_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llds.evaluate import answer_shape, main, markdown

    with pytest.raises(SystemExit):
        main(
            ["--rollout-url", "http://127.0.0.1:1", "--data", "synthworld-eval", "--rollout-config", "x.toml"]
        )
    with pytest.raises(SystemExit):
        main(
            ["--model", "m", "--data", "synthworld-eval", "--rollout-config", str(tmp_path / "missing.toml")]
        )
    assert "--rollout-config" in capsys.readouterr().err
    cfg = tmp_path / "rollout.toml"
    cfg.write_text("topk = 2\nmax_obs_tokens = 160\nmax_tokens_per_turn = 64\n")
    shape = answer_shape(cfg)
    assert shape == {"topk": 2, "max_tokens_per_turn": 64, "max_obs_tokens": 160}
    meta = {"model": "m", "max_turns": 4, "weights_version": 3, "seconds": 1.0, "shape": shape,
            "rollout_config": str(cfg)}  # fmt: skip
    assert "top-2 retrieval, at most 64 tokens a turn and 160 per search" in markdown([], meta)
