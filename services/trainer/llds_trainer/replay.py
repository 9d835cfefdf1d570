"""``llds trainer replay-alarm``: the LLD monitor replayed on step logs, under any ``[lld]`` settings.

A monitor setting is judged by when it would have warned, and a training run costs half an hour on
the CPU; the monitor reads only four logged signals per step (correct-response log-likelihood, the
fraction of correct responses whose likelihood fell, entropy, gradient norm), so it can be replayed on
committed logs in milliseconds. Replayed with a run's own settings it reproduces the run's logged
``lld/alarm`` column (tested on the committed study logs); with others it says when those would have
warned, against the step from which the run's reward stayed 0.

    llds trainer replay-alarm docs/experiment-lld/logs/grpo-s*.jsonl --set persist_steps=1 --set window=5

Replays stop at the first step an acting alarm changed the run (``lld/action``): after it the logged
signals are those of another objective.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llds_proto import steplog as K
from llds_trainer.lld import ALARM_LEVEL, LLDMonitor


@dataclass(frozen=True)
class Replay:
    name: str
    steps: int
    logged_warning: int | None
    """First step the run's own monitor was in warning or alarm."""
    replayed_warning: int | None
    """First step the replayed monitor was."""
    dead_from: int | None
    """First step of the run's final stretch of zero reward (None: the run did not end on zero reward)."""
    levels: list[float]
    """The replayed alarm level per step."""


def replay(rows: list[dict[str, Any]], monitor: LLDMonitor) -> list[float]:
    """The alarm level (0 ok, 1 warning, 2 alarm) ``monitor`` gives each step of ``rows``, up to and
    including the first step an acting alarm changed (``lld/action`` = 1)."""
    levels = []
    for r in rows:
        monitor.update(r.get(K.LLD_CORRECT_LOGP_TOKEN), r.get(K.LLD_FELL_FRACTION_RESPONSES),
                       r.get(K.ACTOR_ENTROPY), r.get(K.ACTOR_GRAD_NORM))  # fmt: skip
        levels.append(float(ALARM_LEVEL[monitor.state]))
        if r.get(K.LLD_ACTION):
            break
    return levels


def _first(steps: list[int], values: list[float | None], at_least: float) -> int | None:
    return next((s for s, v in zip(steps, values, strict=False) if v is not None and v >= at_least), None)


def replay_log(path: Path, section: Any) -> Replay:
    rows = K.read_records(path)
    steps = [int(r[K.STEP]) for r in rows]
    levels = replay(rows, LLDMonitor.from_config(section))
    dead_from = None
    for s, r in zip(reversed(steps), reversed(rows), strict=True):
        if r.get(K.REWARD_MEAN) != 0:
            break
        dead_from = s
    return Replay(path.stem, len(rows), _first(steps, [r.get(K.LLD_ALARM) for r in rows], 1),
                  _first(steps, levels, 1), dead_from, levels)  # fmt: skip


def table(replays: list[Replay]) -> list[str]:
    lines = ["| run | steps | logged first warning | replayed first warning | reward 0 from step | lead (steps) |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in replays:
        lead = (
            "-"
            if r.replayed_warning is None or r.dead_from is None
            else str(r.dead_from - r.replayed_warning)
        )
        lines.append(f"| {r.name} | {r.steps} | {r.logged_warning or '-'} | {r.replayed_warning or '-'} "
                     f"| {r.dead_from or '-'} | {lead} |")  # fmt: skip
    return lines


def replay_main(argv: list[str]) -> int:
    from pydantic import ValidationError

    from llds_trainer.config import LLDMonitorConfig

    p = argparse.ArgumentParser(prog="llds trainer replay-alarm", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "logs", nargs="+", type=Path, help="step logs (train_log.jsonl or the experiment's compact logs)"
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an [lld] monitor field: window, slope_threshold, fell_fraction, persist_steps, spike_factor")  # fmt: skip
    args = p.parse_args(argv)
    kw: dict[str, str] = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or key not in LLDMonitorConfig.model_fields or key in ("probe", "alarm"):
            p.error(f"--set {item!r}: expected KEY=VALUE with KEY one of window, slope_threshold, "
                    "fell_fraction, persist_steps, spike_factor")  # fmt: skip
        kw[key] = value
    try:
        section = LLDMonitorConfig.model_validate(kw)
    except ValidationError as e:
        p.error(f"--set: {e}")
    if missing := [str(x) for x in args.logs if not x.is_file()]:
        p.error(f"no such step log: {', '.join(missing)}")
    shown = {
        k: getattr(section, k)
        for k in ("window", "slope_threshold", "fell_fraction", "persist_steps", "spike_factor")
    }
    print("monitor: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    print("\n".join(table([replay_log(x, section) for x in args.logs])))
    return 0
