"""``llds bench soak`` for a few steps, so that it cannot rot: the whole system runs, every series is
sampled into RUN_DIR/soak_samples.jsonl, and the one-screen summary and report are written. (Too few
steps for a verdict on growth: ``--report-only``; the verdicts are unit-tested.)"""

from __future__ import annotations

import json
from pathlib import Path

from up_kit import LLDS_UP_MARKS, LldsProcess

pytestmark = LLDS_UP_MARKS


def test_soak_samples_every_series_and_reports(tmp_path: Path) -> None:
    run_dir = tmp_path / "soak"
    out = tmp_path / "soak_bench.md"
    soak = LldsProcess(["bench", "soak", "--preset", "tiny", "--steps", "3", "--sample-every", "1",
                        "--warmup", "0", "--report-only", "--run-dir", str(run_dir), "--out", str(out)],
                       drop_env=("REDIS_URL",))  # fmt: skip
    code = soak.wait_exit(600)
    text = soak.output(120)
    assert code == 0, text
    samples = [json.loads(x) for x in (run_dir / "soak_samples.jsonl").read_text().splitlines()]
    assert len(samples) >= 3 and samples[-1]["step"] >= 3, samples
    last = samples[-1]
    for svc in ("launcher", "retriever", "rollout", "trainer", "dashboard", "redis"):
        # the last sample may come after the trainer exited at its last step
        seen = [s for s in samples if f"rss_bytes/{svc}" in s]
        assert len(seen) >= 2, (svc, samples)
        assert seen[-1][f"rss_bytes/{svc}"] > 1 << 20 and seen[-1][f"open_files/{svc}"] > 0, (svc, seen[-1])
    assert last["processes/rollout"] >= 1
    assert last["redis/used_memory_bytes"] > 0 and last["redis/stream_length"] >= 0
    assert last["run_dir/checkpoints"] >= 1 and last["run_dir/state_bytes"] > 0
    assert "| rss_bytes/trainer |" in text and "| redis/stream_length |" in text
    assert out.read_text().startswith("# Soak") and (run_dir / "soak_report.md").exists()
