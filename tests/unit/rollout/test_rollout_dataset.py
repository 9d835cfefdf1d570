"""Training prompts from JSONL with Search-R1 columns."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from llds_proto.search_protocol import prompt_text
from llds_rollout.dataset import DatasetError, endless, load_rows


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_reads_both_column_styles(tmp_path: Path) -> None:
    rows = load_rows(
        _write(
            tmp_path / "d.jsonl",
            [
                {"id": "a", "data_source": "world", "question": "who?", "golden_answers": ["X"],
                 "extra_info": {"split": "train", "index": 4}},
                {"data_source": "nq", "prompt": [{"role": "user", "content": prompt_text("where is paris")}],
                 "reward_model": {"style": "rule", "ground_truth": {"target": ["France"]}},
                 "extra_info": {"index": 4}},
            ],
        )
    )  # fmt: skip
    assert [(r.prompt_id, r.question, r.golds) for r in rows] == [
        ("world:4", "who?", ["X"]),
        ("nq:4", "where is paris?", ["France"]),
    ]


def test_rejects_bad_rows(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no gold answers"):
        load_rows(_write(tmp_path / "a.jsonl", [{"id": 1, "question": "q"}]))
    with pytest.raises(DatasetError, match="duplicate"):
        load_rows(_write(tmp_path / "b.jsonl", [{"id": 1, "question": "q", "golden_answers": ["a"]}] * 2))
    (tmp_path / "c.jsonl").write_text("{not json\n")
    with pytest.raises(DatasetError, match=r"c.jsonl:1"):
        load_rows(tmp_path / "c.jsonl")


def test_endless_cycles_epochs(tmp_path: Path) -> None:
    rows = load_rows(
        _write(tmp_path / "d.jsonl", [{"id": i, "question": "q", "golden_answers": ["a"]} for i in range(3)])
    )
    drawn = list(itertools.islice(endless(rows, shuffle=True, seed=1), 7))
    assert sorted(r.prompt_id for r, e in drawn if e == 0) == ["data:0", "data:1", "data:2"]
    assert [e for _, e in drawn] == [0, 0, 0, 1, 1, 1, 2]
