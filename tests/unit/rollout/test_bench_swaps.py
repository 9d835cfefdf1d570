"""``llds bench swaps`` end to end on the transformers engine and the tiny model (seconds): every mode
is measured on a real service with real swaps, and the report carries every figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from llds_bench import swaps
from llds_bench.swaps import Progress

ROOT = Path(__file__).resolve().parents[3]


def test_a_stall_is_the_longest_gap_without_a_token_around_the_swap() -> None:
    p = Progress(engine=None)
    p.rises = [0.0, 0.1, 0.2, 1.0, 1.05, 3.0]
    assert p.stall(0.15, 0.5) == pytest.approx(0.8)  # 0.2 -> 1.0 overlaps the swap
    assert p.stall(1.1, 1.2) == pytest.approx(1.95)  # 1.05 -> 3.0, nothing inside
    assert p.stall(0.05, 0.06) == pytest.approx(0.1)


@pytest.mark.slow
def test_every_mode_measured_with_no_failure(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "swap_bench.md"
    code = swaps.main(
        ["--model", str(tiny_model_dir), "--engine", "transformers", "--rollout-config",
         str(ROOT / "configs" / "rollout_tiny.toml"), "--clients", "2", "--seconds", "2", "--swap-every", "0.5",
         "--trajectories", "4", "--concurrency", "2", "--latency-ms", "5", "--out", str(out)]
    )  # fmt: skip
    report = out.read_text()
    assert code == 0, report
    rows = [line for line in report.splitlines() if line.startswith(("| drain", "| inflight", "| abort"))]
    assert [r.split("|")[1].strip() for r in rows] == [
        "drain:version",
        "inflight:version",
        "inflight:latest",
        "abort:latest",
    ], report
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[-1] == "0" and "nan" not in row, row  # no failure, every figure measured
    assert "Goals: stall <= 2x the bare reload" in report


def test_bad_flags_are_refused_by_name(capsys: pytest.CaptureFixture[str], tiny_model_dir: Path) -> None:
    with pytest.raises(SystemExit):
        swaps.main(["--model", str(tiny_model_dir), "--modes", "drain,sideways"])
    assert "sideways" in capsys.readouterr().err
