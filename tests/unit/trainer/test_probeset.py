"""The fixed probe set of LLD (llds trainer probe-lld): the same trajectories under every policy, scored
on their assistant tokens; a policy trained on them scores them higher."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llds_trainer import probeset


def test_probe_set_is_fixed_and_scored_on_assistant_tokens(
    tiny_model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    world = _world(tmp_path)
    a = probeset.probe_samples(tokenizer, world, first=4, count=3)
    b = probeset.probe_samples(tokenizer, world, first=4, count=3)
    assert [s.response_ids for s in a] == [s.response_ids for s in b]  # fixed: same tokens every time
    assert [s.group_id for s in a] == [r["id"] for r in _rows(world)[4:7]]
    per = probeset.score(tiny_model_dir, a)
    assert [n for _, n in per] == [sum(s.loss_mask) for s in a]  # documents and prompt are not scored
    assert all(v < 0 for v, _ in per)


def test_cli_writes_one_score_per_model_and_names_bad_input(tiny_model_dir: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    world = _world(tmp_path)
    out = tmp_path / "lld.json"
    assert probeset.main(["--world", str(world), "--model", str(tiny_model_dir), "--model", str(tiny_model_dir),
                          "--first", "2", "--count", "2", "--out", str(out)]) == 0  # fmt: skip
    rep = json.loads(out.read_text())
    assert len(rep["models"]) == 2 and rep["models"][0]["logp_token"] == rep["models"][1]["logp_token"]
    with pytest.raises(SystemExit):
        probeset.main(["--world", str(world), "--model", str(tmp_path / "nope")])
    assert "not a policy folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        probeset.main(["--world", str(world), "--model", str(tiny_model_dir), "--first", "100000"])
    assert "no 32 demonstrations from row 100000" in capsys.readouterr().err


def _rows(world: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (world / "train.jsonl").read_text().splitlines() if x.strip()]


def _world(tmp_path: Path) -> Path:
    from llds import world

    out = tmp_path / "world"
    if not (out / "meta.json").exists():
        world.build(out, seed=0)
    return out
