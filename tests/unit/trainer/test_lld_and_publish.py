"""LLD alarm rule, weight publishing layout, stale-group policy."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llds_trainer.lld import LLDMonitor, slope
from llds_trainer.publish import MARKER, gc_versions, publish_folder, sha256_file


def test_slope_least_squares() -> None:
    assert slope([1.0, 2.0]) is None
    assert slope([0.0, -1.0, -2.0, -3.0]) == pytest.approx(-1.0)
    assert slope([1.0, 3.0, 2.0]) == pytest.approx(0.5)


def test_alarm_escalates_ok_warning_alarm_and_recovers() -> None:
    m = LLDMonitor(window=5, persist=3, fell_fraction=0.5, spike_factor=3.0)
    states = []
    for i in range(6):  # correct-response likelihood falling, most correct responses displaced
        m.update(-1.0 - 0.1 * i, 0.8, 2.0, 1.0)
        states.append(m.state)
    assert states == ["ok", "ok", "ok", "ok", "warning", "warning"]
    out = m.update(-1.7, 0.8, 2.0, 5.0)  # gradient-norm spike on top of the warning
    assert m.state == "alarm" and out["lld/alarm"] == 2.0
    for v in (-1.0, -0.5, 0.0, 0.5):  # likelihood rising again
        m.update(v, 0.2, 2.0, 1.0)
    assert m.state == "ok"


def test_falling_likelihood_without_displacement_is_not_a_warning() -> None:
    m = LLDMonitor(window=5, persist=2)
    for i in range(8):
        m.update(-1.0 - 0.1 * i, 0.1, 2.0, 1.0)  # few responses fell, and that fraction is flat
    assert m.state == "ok"


def test_monitor_state_round_trips() -> None:
    m = LLDMonitor()
    for i in range(4):
        m.update(-float(i), 0.9, 1.0, 1.0)
    n = LLDMonitor()
    n.load_state_dict(json.loads(json.dumps(m.state_dict())))
    assert n.state_dict() == m.state_dict()


def test_publish_writes_marker_last_and_gcs(tiny_model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    for v in (1, 2, 3):
        publish_folder(model, tokenizer, tmp_path, v, step=10 * v, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000002", "v000003"]
    marker = json.loads((tmp_path / "v000003" / MARKER).read_text())
    assert marker["version"] == 3 and marker["step"] == 30
    assert set(marker["files"]) == {p.name for p in (tmp_path / "v000003").iterdir() if p.name != MARKER}
    assert all(sha256_file(tmp_path / "v000003" / n) == h for n, h in marker["files"].items())
    # Every file the marker lists was written before the marker itself.
    mtime = (tmp_path / "v000003" / MARKER).stat().st_mtime_ns
    assert all((tmp_path / "v000003" / n).stat().st_mtime_ns <= mtime for n in marker["files"])
    (tmp_path / ".v000001.crashed").mkdir()
    assert tmp_path / ".v000001.crashed" in gc_versions(tmp_path, keep=2)


def test_stale_groups_are_dropped(tokenizer: Any) -> None:
    from llds_trainer.config import TrainerConfig
    from llds_trainer.queue import Entry
    from llds_trainer.service import TrainerService
    from llds_trainer.synthetic import synthetic_groups

    svc = TrainerService(TrainerConfig(staleness_k=1))
    svc.trainer = SimpleNamespace(state=SimpleNamespace(version=3, consumed_set={"old"}))
    g_v1 = synthetic_groups(tokenizer, 1, 2, version=1, think_words=2, doc_words=3)[0]
    g_v2 = synthetic_groups(tokenizer, 1, 2, version=2, think_words=2, doc_words=3, start_index=5)[0]
    assert svc._drop_reason(Entry("1-0", g_v1), set()) == "stale"
    assert svc._drop_reason(Entry("1-1", g_v2), set()) is None
    assert svc._drop_reason(Entry("1-2", g_v2), {g_v2.group_id}) == "duplicate"
    assert svc._drop_reason(Entry("1-3", None, "bad"), set()) == "invalid"
