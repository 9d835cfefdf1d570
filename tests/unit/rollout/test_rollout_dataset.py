"""Training prompts from JSONL with Search-R1 columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llds_proto.search_protocol import prompt_text
from llds_rollout.dataset import DataOrder, DatasetError, load_rows


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


def test_the_data_order_is_every_row_once_an_epoch_in_the_order_one_replica_always_walked(
    tmp_path: Path,
) -> None:
    """Position p -> (row, epoch): every row once per epoch, each epoch reshuffled by one generator
    seeded with the seed; the same positions give the same rows in any order they are asked for, and
    the order is the one a single replica walked before the shared cursor (a study's data order did not
    change with it)."""
    import random

    rows = load_rows(
        _write(tmp_path / "d.jsonl", [{"id": i, "question": "q", "golden_answers": ["a"]} for i in range(5)])
    )

    def walked(seed: int) -> list[tuple[str, int]]:  # the generator the rollout used before positions
        rng, out = random.Random(seed), []
        for epoch in range(4):
            order = list(rows)
            rng.shuffle(order)
            out += [(r.prompt_id, epoch) for r in order]
        return out

    order = DataOrder(rows, shuffle=True, seed=1)
    got = [(r.prompt_id, e) for r, e in (order.at(p) for p in range(20))]
    assert got == walked(1)
    assert sorted(p for p, e in got if e == 2) == [f"data:{i}" for i in range(5)]
    assert got != walked(2) and len(order) == 5
    late = DataOrder(rows, shuffle=True, seed=1)  # a replica that starts at position 17
    assert [(late.at(p)[0].prompt_id, late.at(p)[1]) for p in (17, 3, 12)] == [got[17], got[3], got[12]]
    plain = DataOrder(rows, shuffle=False, seed=1)
    assert [plain.at(p)[0].prompt_id for p in (0, 4, 5, 7)] == ["data:0", "data:4", "data:0", "data:2"]
    with pytest.raises(ValueError, match="-1"):
        order.at(-1)
    with pytest.raises(DatasetError, match="empty"):
        DataOrder([], shuffle=True, seed=0)
