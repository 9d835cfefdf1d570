"""Every service's /metrics text parses with prometheus_client and carries the documented names, and
the step-record keys of ``llds_proto.steplog`` are the documented ones.

The documented sets are the metric table and the step-record table of docs/observability.md (the
README's reference); the text is what each service's registry renders for GET /metrics.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llds_proto import steplog

DOC = Path(__file__).resolve().parents[3] / "docs" / "observability.md"
NAME_RE = re.compile(r"^llds_(retriever|rollout|trainer|dashboard)_[a-z0-9_]+$")


def documented(service: str) -> set[str]:
    """Names in the doc table rows of ``service``; ``_suffix`` entries reuse the row's prefix."""
    names: set[str] = set()
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 4 or cells[1] != service:
            continue
        for tok in re.findall(r"`([a-z_0-9]+)(?:\{[^}]*\})?`", cells[2]):
            names.add(tok if tok.startswith("llds_") else f"llds_{service}{tok}")
    return names


def _registry(service: str):  # type: ignore[no-untyped-def]
    if service == "retriever":
        from llds_retriever.metrics import RetrieverMetrics

        return RetrieverMetrics().registry
    if service == "rollout":
        from llds_rollout.metrics import RolloutMetrics

        return RolloutMetrics().registry
    if service == "trainer":
        from llds_trainer.metrics import TrainerMetrics

        return TrainerMetrics().registry
    from llds.dashboard.metrics import DashboardMetrics

    return DashboardMetrics().registry


@pytest.mark.parametrize("service", ["retriever", "rollout", "trainer", "dashboard"])
def test_metrics_parse_and_match_the_documented_set(service: str) -> None:
    text = generate_latest(_registry(service)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # prometheus_client's own creation-timestamp series of counters and histograms
    families = {
        n: f
        for n, f in families.items()
        if not (n.endswith("_created") and n[: -len("_created")] in families)
    }
    exposed = {f"{n}_total" if f.type == "counter" else n for n, f in families.items()}
    docs = documented(service)
    assert len(docs) >= 5, f"no documented metrics found for {service} in {DOC}"
    assert docs <= exposed, f"documented but not exposed: {sorted(docs - exposed)}"
    assert exposed <= docs, f"exposed but not documented: {sorted(exposed - docs)}"
    for name, fam in families.items():
        assert NAME_RE.match(name) and name.startswith(f"llds_{service}_"), name
        assert ":" not in name
        if fam.type == "counter":
            assert f"{name}_total" in exposed


def documented_step_keys() -> list[str]:
    """Keys in the first column of the doc's "Step records" table."""
    section = DOC.read_text().split("### Step records", 1)[1].split("\n### ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, flags=re.MULTILINE)


def test_step_record_keys_are_documented() -> None:
    keys = documented_step_keys()
    assert len(keys) == len(set(keys)), "a key is documented twice"
    assert set(keys) == steplog.KEYS, (
        f"in steplog, not documented: {sorted(steplog.KEYS - set(keys))}; "
        f"documented, not in steplog: {sorted(set(keys) - steplog.KEYS)}"
    )
