"""Every preset TOML in configs/ states only what differs from its settings class's defaults: a key
whose removal leaves the resolved config unchanged is a default repeated, and a preset that repeats
defaults hides which of its values matter (and goes stale when a default changes)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llds.experiment import PRESETS as EXPERIMENT_PRESETS
from llds_rollout.config import RolloutSettings
from llds_server.settings import ServiceSettings, merged
from llds_trainer.config import TrainerConfig

REPO = Path(__file__).resolve().parents[3]
CLASSES: dict[str, type[ServiceSettings]] = {"trainer": TrainerConfig, "rollout": RolloutSettings}
PRESETS = sorted(p for p in (REPO / "configs").glob("*.toml") if p.name.split("_")[0] in CLASSES)
OVERLAYS = {overlay: base for base, overlay in EXPERIMENT_PRESETS.values() if overlay is not None}
"""An overlay preset (``cpu_collapse``) -> the preset it is merged on (``cpu``): it states what differs from that."""
NEEDED = {"rollout": {"dataset": "train.jsonl"}}
"""What a class needs to validate that no preset sets (the launcher passes it)."""


def _leaves(d: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, (*prefix, k))
        else:
            yield (*prefix, k)


def _without(d: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    out = dict(d)
    if len(path) == 1:
        del out[path[0]]
    else:
        out[path[0]] = _without(out[path[0]], path[1:])
    return out


def _resolved(cls: type[ServiceSettings], data: dict[str, Any]) -> dict[str, Any]:
    return cls(**data).model_dump(mode="json")


def test_the_presets_are_found() -> None:
    names = {p.name for p in PRESETS}
    assert {"trainer_cpu.toml", "trainer_tiny.toml", "trainer_gpu.toml", "rollout_cpu.toml"} <= names


@pytest.mark.parametrize("path", PRESETS, ids=[p.name for p in PRESETS])
def test_a_preset_states_only_what_differs_from_the_defaults(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("LLDS_"):
            monkeypatch.delenv(name)
    kind, _, preset = path.stem.partition("_")
    cls = CLASSES[kind]
    data = tomllib.loads(path.read_text())
    under = NEEDED.get(kind, {})
    if preset in OVERLAYS:
        under = merged(under, tomllib.loads((path.parent / f"{kind}_{OVERLAYS[preset]}.toml").read_text()))
    full = _resolved(cls, merged(under, data))
    repeated = [
        ".".join(p) for p in _leaves(data) if _resolved(cls, merged(under, _without(data, p))) == full
    ]
    assert not repeated, f"{path.name} repeats defaults: {repeated}"
