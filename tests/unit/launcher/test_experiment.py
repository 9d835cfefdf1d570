"""The LLD experiment's analysis: series, slopes, plots and the Markdown table from trainer logs."""

import argparse
import json
from pathlib import Path

from llds import experiment


def _write_log(run_dir: Path, logps: list[float]) -> None:
    (run_dir / "trainer").mkdir(parents=True)
    rows = [{"step": i + 1, "reward/mean": 0.5, "lld/correct_logp_token": v, "loss/llds": 0.01 * i,
             "lld/fell_fraction_responses": 0.6} for i, v in enumerate(logps)]  # fmt: skip
    (run_dir / "trainer" / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_slope_ignores_missing_points_and_needs_three() -> None:
    assert experiment._slope([1.0, None, 3.0, 4.0]) == 1.0
    assert experiment._slope([1.0, 2.0]) is None


def test_report_and_plots_from_logs(tmp_path: Path) -> None:
    results = []
    for arm, logps in (("grpo", [-0.5, -0.6, -0.8]), ("grpo_llds", [-0.5, -0.5, -0.49])):
        _write_log(tmp_path / arm, logps)
        log = experiment._read_log(tmp_path / arm)
        r = {"arm": arm, "steps": len(log), "train_s": 1.0, "eval_em": 0.5}
        for key, _ in experiment.SIGNALS:
            s = experiment._series(log, key)
            vals = [v for v in s if v is not None]
            r[f"{key}:first"], r[f"{key}:last"] = (vals[0], vals[-1]) if vals else (None, None)
            r[f"{key}:slope"] = experiment._slope(s)
        r["series"] = {key: experiment._series(log, key) for key, _ in experiment.SIGNALS}
        results.append(r)
    assert results[0]["lld/correct_logp_token:slope"] < 0 < results[1]["lld/correct_logp_token:slope"]
    plots = experiment.plot(results, tmp_path)
    assert {p.name for p in plots} >= {"reward_mean.png", "lld_correct_logp_token.png", "loss_llds.png"}
    args = argparse.Namespace(preset="tiny", steps=3, eval_limit=5, seed=0)
    md = experiment.report(results, args, plots)
    assert "| grpo | 3 | 0.5000 -> 0.5000 | -0.5000 -> -0.8000 (-0.1500)" in md
    assert "![lld_correct_logp_token](lld_correct_logp_token.png)" in md
