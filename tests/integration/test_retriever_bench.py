"""``llds bench retriever --quick`` end to end on a tiny corpus: both servers, recall, report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPICS = [
    ("Paris", "Paris is the capital and largest city of France.", "what is the capital of france"),
    ("Berlin", "Berlin is the capital of Germany.", "capital city of germany"),
    ("Jupiter", "Jupiter is the largest planet in the Solar System.", "which planet is the largest"),
    ("Hamlet", "Hamlet is a tragedy written by William Shakespeare.", "who wrote hamlet"),
]


def test_quick_bench_writes_a_report(tmp_path: Path) -> None:
    from llds_bench.retriever import main

    corpus, questions = tmp_path / "corpus.jsonl", tmp_path / "questions.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "contents": f'"{t}"\n{x}'}) + "\n"
            for i, (t, x, _) in enumerate(TOPICS)
        )
    )
    questions.write_text(
        "".join(json.dumps({"question": q, "gold_id": f"p{i}"}) + "\n" for i, (_, _, q) in enumerate(TOPICS))
    )
    out = tmp_path / "bench.md"
    argv = [
        "--quick", "--corpus", str(corpus), "--questions", str(questions), "--clients", "1,4",
        "--seconds", "1", "--warmup", "0.2", "--work-dir", str(tmp_path / "work"), "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    text = out.read_text()
    assert "| dense | 1.000 | 1.000 |" in text
    report = json.loads(out.with_suffix(".json").read_text())
    assert [r["clients"] for r in report["ours"]] == [1, 4]
    assert all(r["qps"] > 0 and r["errors"] == 0 for r in report["ours"] + report["baseline"])
    assert max(report["ceiling"].values()) > 0
