"""``llds report`` on a synthetic train_log.jsonl."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llds.report import ReportError, build, find_log, main, read_log, series


def _records(n: int = 12) -> list[dict[str, float]]:
    recs = []
    for s in range(1, n + 1):
        recs.append({
            "step": s, "reward/mean": 0.1 + 0.03 * s, "reward/exact_match": 0.05 * s,
            "lld/correct_logp_token": -1.0 - 0.05 * s, "lld/correct_logp_slope": -0.05,
            "lld/fell_fraction_responses": min(1.0, 0.08 * s), "lld/fell_fraction_actions": 0.1,
            "lld/first_action_logp": -2.0, "lld/later_action_logp": -1.2, "lld/correct_incorrect_gap": 0.4,
            "lld/alarm": 0 if s < 5 else (1 if s < 9 else 2), "llds/gated_fraction": 0.3, "loss/llds": 0.01 * s,
            "loss/total": 1.0 / s, "actor/entropy": 1.2, "actor/grad_norm": 3.0 if s != 7 else math.nan,
            "rollout/response_len_mean": 120.0, "rollout/turns_mean": 2.0, "rollout/valid_searches_mean": 1.0,
        })  # fmt: skip
    return recs


def _write(path: Path, recs: list[dict[str, float]], tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + tail)
    return path


def test_report_writes_plots_and_summary(tmp_path: Path) -> None:
    _write(tmp_path / "run" / "train_log.jsonl", _records())
    written = build(tmp_path / "run")
    assert set(written) == {"reward", "lld", "training", "summary"}
    for name in ("reward", "lld", "training"):
        data = written[name].read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000, name
        assert written[name].parent == tmp_path / "run" / "report"
    md = written["summary"].read_text()
    assert "step records: 12 (steps 1-12)" in md
    assert "reward/mean: first 0.13, last 0.46, best 0.46 at step 12" in md
    assert (
        "final **alarm**; steps ok 4, warning 4, alarm 4; first warning at step 5, first alarm at step 9"
        in md
    )
    assert "| `lld/correct_logp_slope` | -0.05 | -0.05 | -0.05 | -0.05 |" in md
    assert "![lld](lld.png)" in md


def test_report_finds_the_log_where_llds_up_puts_it(tmp_path: Path) -> None:
    log = _write(tmp_path / "run" / "trainer" / "train_log.jsonl", _records(3))
    assert find_log(tmp_path / "run") == log
    assert main([str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "report" / "summary.md").is_file()
    assert main([str(log), "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "reward.png").is_file()


def test_report_tolerates_missing_keys_and_a_truncated_last_line(tmp_path: Path) -> None:
    log = _write(tmp_path / "train_log.jsonl", [{"step": 1, "reward/mean": 0.2}, {"step": 2, "reward/mean": 0.3}],
                 tail='{"step": 3, "rew')  # fmt: skip
    assert len(read_log(log)) == 2
    written = build(tmp_path)
    assert set(written) == {"reward", "summary"}  # no LLD keys logged: no empty LLD figure
    assert "LLD alarm: not logged" in written["summary"].read_text()


def test_series_skips_non_finite_and_non_numeric() -> None:
    recs = [
        {"step": 1, "x": 1.0},
        {"step": 2, "x": math.nan},
        {"step": 3, "x": "a"},
        {"step": 4, "x": True},
        {"x": 2},
    ]
    assert series(recs, "x") == ([1.0, 5.0], [1.0, 2.0])


def test_report_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 2
    assert "no train log" in capsys.readouterr().err
    bad = _write(tmp_path / "train_log.jsonl", [], tail='{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ReportError, match=r"train_log.jsonl:2 is not JSON"):
        read_log(bad)
    _write(tmp_path / "train_log.jsonl", [])
    with pytest.raises(ReportError, match="no step records"):
        read_log(tmp_path / "train_log.jsonl")


def test_report_reads_the_trainers_own_key_names(tmp_path: Path) -> None:
    recs = [{"step": s, "reward/mean": 0.1 * s, "lld/correct_logp_token": -1.0 - s, "lld/fell_fraction_responses": 0.5,
             "llds/gated_fraction": 0.2, "rollout/turns_mean": 2.0, "lld/alarm": 0} for s in (1, 2, 3)]  # fmt: skip
    _write(tmp_path / "train_log.jsonl", recs)
    written = build(tmp_path)
    assert {"reward", "lld", "training"} <= set(written)
    md = written["summary"].read_text()
    assert "| `lld/correct_logp_token` | -2 | -4 | -4 | -2 |" in md
    assert "| `llds/gated_fraction` |" in md and "| `rollout/turns_mean` |" in md
    assert series(recs, "lld/correct_logp_token") == ([1.0, 2.0, 3.0], [-2.0, -3.0, -4.0])
