"""The committed inflight run (docs/inflight-run) regenerates: its report is what ``llds_bench.inflight_run``
writes from the committed per-step log, and that log bounds the mismatch the report states."""

from __future__ import annotations

import json
from pathlib import Path

from llds_bench.inflight_run import main, report
from llds_proto import steplog as K

RUN = Path(__file__).resolve().parents[3] / "docs" / "inflight-run"


def test_the_report_is_rebuilt_from_the_committed_steps(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in (RUN / "steps.jsonl").read_text().splitlines()]
    assert len(rows) == 50 and [r[K.STEP] for r in rows] == list(range(1, 51))
    assert report(rows) == (RUN / "report.md").read_text()
    assert max(r[K.MISMATCH_KL] for r in rows) < 1e-4
    (tmp_path / "steps.jsonl").write_text((RUN / "steps.jsonl").read_text())
    assert main(["--out", str(tmp_path), "--report-only"]) == 0
    assert (tmp_path / "report.md").read_text() == (RUN / "report.md").read_text()
