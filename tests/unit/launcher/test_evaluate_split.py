"""``llds eval --split-by data_source`` and the Search-R1 table layout, against a fake ``/answer``."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llds.data_fetch import SEARCH_R1_EVAL
from llds.evaluate import PAPER_LABELS, EvalError, Example, main, paper_table, split_examples

SOURCES = [name for name, _ in SEARCH_R1_EVAL]


def test_paper_labels_cover_the_fetched_sets() -> None:
    assert set(PAPER_LABELS) == set(SOURCES)


def test_split_groups_by_source_in_the_table_order_and_names_rows_without_one() -> None:
    exs = [Example("1", "q", ["a"], "bamboogle"), Example("2", "q", ["a"], "zeta"),
           Example("3", "q", ["a"], "nq"), Example("4", "q", ["a"], "nq"), Example("5", "q", ["a"], "alpha")]  # fmt: skip
    groups = split_examples("test", exs, "data_source")
    assert [(n, [e.id for e in g]) for n, g in groups] == [
        ("nq", ["3", "4"]),
        ("bamboogle", ["1"]),
        ("alpha", ["5"]),
        ("zeta", ["2"]),
    ]
    assert split_examples("test", exs, None) == [("test", exs)]
    with pytest.raises(EvalError, match=r"--split-by data_source: row 1 \(q7\) of test has no data_source"):
        split_examples("test", [exs[0], Example("q7", "q", ["a"])], "data_source")


def test_paper_table_puts_each_set_in_its_column_and_averages_over_sets() -> None:
    rows = [{"dataset": "hotpotqa", "n": 4, "em": 0.25, "f1": 0.5},
            {"dataset": "nq", "n": 2, "em": 0.5, "f1": 0.75},
            {"dataset": "synthworld-eval", "n": 9, "em": 1.0, "f1": 1.0}]  # fmt: skip
    table = paper_table(rows)  # type: ignore[arg-type]
    assert (
        "| | NQ† | TriviaQA* | PopQA* | HotpotQA† | 2wiki* | Musique* | Bamboogle* | Avg. (2 of 7) |" in table
    )
    assert "| EM | 0.500 | – | – | 0.250 | – | – | – | 0.375 |" in table
    assert "| F1 | 0.750 | – | – | 0.500 | – | – | – | 0.625 |" in table
    assert "| n | 2 | – | – | 4 | – | – | – | 6 |" in table
    assert paper_table([{"dataset": "synthworld-eval", "n": 1, "em": 1.0, "f1": 1.0}]) == ""


class _Rollout(BaseHTTPRequestHandler):
    """``/answer`` that gives the gold answer to questions containing "right" and "nope" otherwise."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        q = body["question"]
        answer = q.split("->")[1].strip().rstrip("?") if "right" in q else "nope"
        data = json.dumps(
            {"answer": answer, "turns": [{"search_query": "s"}, {}], "weights_version": 3}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def rollout_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Rollout)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _row(source: str, question: str, gold: str) -> dict[str, object]:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": f"Answer the given question. Question: {question}\n"}],
        "reward_model": {"style": "rule", "ground_truth": {"target": [gold]}},
    }


def test_split_by_data_source_gives_a_row_per_set_and_the_table_layout(
    rollout_url: str, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # set k has k + 1 questions, the first k right: EM of set k = k / (k + 1)
    rows = []
    for k, source in enumerate(SOURCES):
        for j in range(k + 1):
            rows.append(
                _row(source, f"{source} {j} {'right' if j < k else 'wrong'} -> gold{k}{j}?", f"gold{k}{j}")
            )
    test = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(rows[::-1]), test)  # order in the file does not matter
    out = tmp_path / "eval"
    rc = main(["--rollout-url", rollout_url, "--data", str(test), "--split-by", "data_source", "--out", str(out),
               "--concurrency", "4"])  # fmt: skip
    assert rc == 0
    report = json.loads((out / "eval.json").read_text())
    summary = {r["dataset"]: r for r in report["summary"]}
    assert [r["dataset"] for r in report["summary"]] == [*SOURCES, "average"]
    for k, source in enumerate(SOURCES):
        assert summary[source]["n"] == k + 1
        assert summary[source]["em"] == pytest.approx(k / (k + 1))
        assert {e["data_source"] for e in report["examples"][source]} == {source}
    avg_em = sum(k / (k + 1) for k in range(7)) / 7
    assert summary["average"]["em"] == pytest.approx(avg_em)
    assert report["meta"]["split_by"] == "data_source"
    md = (out / "eval.md").read_text()
    ems = " | ".join(f"{k / (k + 1):.3f}" for k in range(7))
    assert f"| EM | {ems} | {avg_em:.3f} |" in md and "| Avg. |" in md

    # --limit applies to each set
    rc = main(["--rollout-url", rollout_url, "--data", str(test), "--split-by", "data_source", "--out", str(out),
               "--limit", "1"])  # fmt: skip
    assert rc == 0
    assert [r["n"] for r in json.loads((out / "eval.json").read_text())["summary"]] == [1] * 7 + [7]


def test_split_by_needs_the_field_in_every_row(
    rollout_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "nq.jsonl"
    f.write_text(json.dumps({"id": "a", "question": "q", "golden_answers": ["x"]}) + "\n")
    rc = main(
        ["--rollout-url", rollout_url, "--data", str(f), "--split-by", "data_source", "--out", str(tmp_path)]
    )
    assert rc == 2 and "row 0 (a) of nq has no data_source" in capsys.readouterr().err
