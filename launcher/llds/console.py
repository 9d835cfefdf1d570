"""What ``llds up`` shows on its console: one line per training step, and a child's errors at once.

The children's full output always goes to ``RUN_DIR/logs/<service>.log``; the console (unless
``--verbose``) gets only what a person watching a run needs:

    step  3/20 [##--------]  reward 0.625  EM 0.625  llds 0.00012  alarm ok       swap 0.41 s  stale 0  12.3 s/step

Each line is built from the trainer's step log (the record it appends after every step) and the
rollout's Prometheus counters (weight-swap time, stale groups dropped), read when the line is printed.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx
from prometheus_client.parser import text_string_to_metric_families

from llds_proto import steplog as K

ALARM_NAMES = {0.0: "ok", 1.0: "warning", 2.0: "alarm"}
"""``lld/alarm`` levels of the step log (the LLD monitor's states)."""

SWAP_SECONDS = "llds_rollout_weight_swap_seconds"
STALE_DROPS = "llds_rollout_stale_groups_dropped_total"

_ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL|FATAL)\b|^Traceback \(most recent call last\):")
"""A child's output line shown on the console even when its output is not streamed."""


class ErrorEcho:
    """Decides which of a child's lines reach the console when its output is not streamed: error lines
    and whole tracebacks, the first of them with the path of the child's full log."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.shown = False
        self.in_traceback = False

    def __call__(self, line: str) -> str | None:
        """The console text for ``line`` (None: the log file only)."""
        if self.in_traceback:
            # A traceback ends with the first unindented line after its header: the exception.
            self.in_traceback = line[:1] in (" ", "\t") or not line
            return line
        if not _ERROR_LINE.search(line):
            return None
        self.in_traceback = line.startswith("Traceback")
        if self.shown:
            return line
        self.shown = True
        return f"{line}   (full log: {self.log_path})"


@dataclass
class RolloutCounters:
    """Weight-swap time and stale drops, from one scrape of the rollout's ``/metrics``."""

    swaps: float = 0.0
    swap_seconds: float = 0.0
    stale_drops: float = 0.0

    @classmethod
    def parse(cls, text: str) -> RolloutCounters:
        out = cls()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == f"{SWAP_SECONDS}_count":
                    out.swaps += s.value
                elif s.name == f"{SWAP_SECONDS}_sum":
                    out.swap_seconds += s.value
                elif s.name == STALE_DROPS:
                    out.stale_drops += s.value
        return out


def scrape_rollout(url: str, client: httpx.Client) -> RolloutCounters | None:
    """The rollout's counters, or None when it does not answer (the line then shows ``-``)."""
    try:
        r = client.get(f"{url}/metrics")
    except httpx.HTTPError:
        return None
    return RolloutCounters.parse(r.text) if r.status_code == 200 else None


def _num(rec: dict[str, Any], key: str, fmt: str) -> str:
    v = rec.get(key)
    return format(v, fmt) if isinstance(v, int | float) else "-"


def progress_bar(done: int, total: int, width: int = 10) -> str:
    """``[####------]``: ``done`` of ``total`` steps."""
    filled = min(width, round(width * done / total)) if total else 0
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def step_line(rec: dict[str, Any], total: int, swap_s: float | None, stale: float | None) -> str:
    """The console line of one step record (``swap_s``: mean seconds of the swaps since the last
    line, None when there was none; ``stale``: stale groups dropped so far)."""
    width = len(str(total)) if total else 3
    step = int(rec[K.STEP])
    of = f"/{total} {progress_bar(step, total)}" if total else ""
    alarm = ALARM_NAMES.get(float(rec.get(K.LLD_ALARM, 0.0)), str(rec.get(K.LLD_ALARM)))
    swap = f"{swap_s:.2f} s" if swap_s is not None else "-"
    drops = f"{stale:.0f}" if stale is not None else "-"
    return (
        f"step {step:>{width}}{of}  reward {_num(rec, K.REWARD_MEAN, '.3f')}"
        f"  EM {_num(rec, K.REWARD_EXACT_MATCH, '.3f')}  llds {_num(rec, K.LOSS_LLDS, '.5f')}"
        f"  alarm {alarm:<7}  swap {swap}  stale {drops}  {_num(rec, K.PERF_STEP_S, '.1f')} s/step"
    )


@dataclass
class StepReporter:
    """Prints one line per new record of the trainer's step log (call :meth:`poll` periodically)."""

    train_log: Path
    total_steps: int
    rollout_url: str | None = None
    out: TextIO = field(default_factory=lambda: sys.stdout)
    _last: RolloutCounters = field(default_factory=RolloutCounters)
    _client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=2.0))
    lines: int = 0
    _tail: K.StepLogTail = field(init=False)

    def __post_init__(self) -> None:
        # A restarted trainer cuts the log back to its checkpoint: the steps kept were printed already.
        self._tail = K.StepLogTail(self.train_log, after_cut="skip")

    def skip_existing(self) -> None:
        """Start after what the log already holds (a resumed run prints only its new steps)."""
        self._tail.skip_existing()

    def poll(self) -> int:
        """Print the lines of the steps logged since the last call; returns how many."""
        recs = self._tail.read()
        if not recs:
            return 0
        now = scrape_rollout(self.rollout_url, self._client) if self.rollout_url else None
        swap_s: float | None = None
        stale: float | None = None
        if now is not None:
            swaps = now.swaps - self._last.swaps
            swap_s = (now.swap_seconds - self._last.swap_seconds) / swaps if swaps > 0 else None
            stale = now.stale_drops
            self._last = now
        for i, rec in enumerate(recs):
            last = i == len(recs) - 1  # the rollout's counters belong to the newest step
            line = step_line(rec, self.total_steps, swap_s if last else None, stale if last else None)
            self.out.write(line + "\n")
        self.out.flush()
        self.lines += len(recs)
        return len(recs)

    def close(self) -> None:
        self._client.close()
