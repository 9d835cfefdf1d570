"""LLD monitor: the likelihood-displacement signals of ``llds.md`` section 5 and an alarm rule.

The per-step signals are computed in :mod:`llds_trainer.core` from token log-probs; this module keeps
their history and turns it into a slope and an alarm state. Pure Python, no torch.

Alarm rule (our own design; the paper defines signals, not thresholds):

- *warning*: for ``persist`` consecutive steps, the least-squares slope of the mean per-token
  log-likelihood of correct responses over the last ``window`` steps is below ``-slope_threshold``
  **and** the likelihood of correct responses is being displaced: the fraction of correct responses
  whose likelihood fell during the step is at least ``fell_fraction``, or that fraction itself has
  a positive slope over the window (phase II of the death spiral).
- *alarm*: a warning **and** a spike in the current step: token entropy or pre-clip gradient norm
  above ``spike_factor`` times its median over the preceding window (phase III).
- *ok*: otherwise.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from llds_proto import steplog as K

AlarmState = Literal["ok", "warning", "alarm"]
ALARM_LEVEL: dict[AlarmState, int] = {"ok": 0, "warning": 1, "alarm": 2}


def slope(values: Sequence[float]) -> float | None:
    """Least-squares slope of ``values`` against their index; None with fewer than 3 points."""
    n = len(values)
    if n < 3:
        return None
    mx = (n - 1) / 2
    my = sum(values) / n
    num = sum((i - mx) * (v - my) for i, v in enumerate(values))
    den = sum((i - mx) ** 2 for i in range(n))
    return num / den


@dataclass
class LLDMonitor:
    """History of the LLD signals and the alarm state machine."""

    window: int = 10
    slope_threshold: float = 0.0
    fell_fraction: float = 0.5
    persist: int = 3
    spike_factor: float = 3.0
    correct_logp: deque[float] = field(default_factory=deque)
    fell: deque[float] = field(default_factory=deque)
    entropy: deque[float] = field(default_factory=deque)
    grad_norm: deque[float] = field(default_factory=deque)
    streak: int = 0
    state: AlarmState = "ok"

    @classmethod
    def from_config(cls, section: Any) -> LLDMonitor:
        """The monitor of an ``[lld]`` section (``llds_trainer.config``)."""
        return cls(window=section.window, slope_threshold=section.slope_threshold,
                   fell_fraction=section.fell_fraction, persist=section.persist_steps,
                   spike_factor=section.spike_factor)  # fmt: skip

    def update(
        self,
        correct_logp: float | None,
        fell_fraction: float | None,
        entropy: float | None,
        grad_norm: float | None,
    ) -> dict[str, float | None]:
        """Add one step's signals; returns the slope keys and the new alarm state for the step log."""
        spike = False
        for hist, v in ((self.entropy, entropy), (self.grad_norm, grad_norm)):
            if v is not None and len(hist) >= 3 and v > self.spike_factor * statistics.median(hist):
                spike = True
        for hist, v in (
            (self.correct_logp, correct_logp),
            (self.fell, fell_fraction),
            (self.entropy, entropy),
            (self.grad_norm, grad_norm),
        ):
            if v is not None:
                hist.append(v)
                while len(hist) > self.window:
                    hist.popleft()
        s = slope(list(self.correct_logp))
        fell_slope = slope(list(self.fell))
        displaced = fell_fraction is not None and (
            fell_fraction >= self.fell_fraction or (fell_slope is not None and fell_slope > 0)
        )
        if correct_logp is None and fell_fraction is None:
            # No correct response this step: no evidence either way, so the streak holds. (Resetting
            # it let a collapse hide the alarm: the steps where reward falls to 0 are such steps.)
            pass
        elif s is not None and s < -self.slope_threshold and displaced:
            self.streak += 1
        else:
            self.streak = 0
        if self.streak >= self.persist:
            self.state = "alarm" if spike else "warning"
        else:
            self.state = "ok"
        return {
            K.LLD_CORRECT_LOGP_SLOPE: s,
            K.LLD_FELL_FRACTION_SLOPE: fell_slope,
            K.LLD_ALARM: float(ALARM_LEVEL[self.state]),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "correct_logp": list(self.correct_logp),
            "fell": list(self.fell),
            "entropy": list(self.entropy),
            "grad_norm": list(self.grad_norm),
            "streak": self.streak,
            "state": self.state,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        # A checkpoint of a run with a larger window must not leave longer histories than this one keeps.
        w = self.window
        self.correct_logp = deque(d["correct_logp"][-w:])
        self.fell = deque(d["fell"][-w:])
        self.entropy = deque(d["entropy"][-w:])
        self.grad_norm = deque(d["grad_norm"][-w:])
        self.streak = int(d["streak"])
        self.state = d["state"]


AlarmActionName = Literal["none", "enable_llds", "raise_lambda"]


@dataclass
class AlarmAction:
    """What the trainer does when the alarm enters ``trigger`` (our extension; the paper only monitors).

    ``enable_llds`` switches the LLDS regulariser on, with lambda ``on_lambda``, the first time the
    state enters ``trigger`` (or worse) from a milder state; ``raise_lambda`` multiplies the lambda in
    force by ``factor``, capped at ``lambda_max``, each time it does. The new regulariser applies from
    the next step; the step whose monitor update fired carries the event (``lld/action`` = 1).
    """

    action: AlarmActionName = "none"
    trigger: AlarmState = "warning"
    on_lambda: float = 0.2
    factor: float = 2.0
    lambda_max: float = 1.0
    lam: float | None = None
    """The LLDS lambda in force; None while LLDS is off."""
    fired_steps: list[int] = field(default_factory=list)
    """Steps at which the action changed the regulariser."""

    def react(self, before: AlarmState, after: AlarmState, step: int) -> bool:
        """Act on one monitor update (state ``before`` -> ``after`` at ``step``); True if it acted."""
        level = ALARM_LEVEL[self.trigger]
        if self.action == "none" or not ALARM_LEVEL[after] >= level > ALARM_LEVEL[before]:
            return False
        if self.action == "enable_llds":
            new = self.on_lambda if self.lam is None else self.lam
        else:
            if self.lam is None:
                return False
            new = min(self.lam * self.factor, self.lambda_max)
        if new == self.lam:
            return False
        self.lam = new
        self.fired_steps.append(step)
        return True

    @classmethod
    def from_config(cls, section: Any, lam: float | None) -> AlarmAction:
        """The action of a ``[lld.alarm]`` section (``llds_trainer.config``), starting at lambda ``lam``."""
        kw: dict[str, Any] = {"action": section.type, "lam": lam}
        if section.type != "none":
            kw["trigger"] = section.trigger
        if section.type == "enable_llds":
            kw["on_lambda"] = section.llds.coef
        if section.type == "raise_lambda":
            kw |= {"factor": section.factor, "lambda_max": section.max}
        return cls(**kw)

    def state_dict(self) -> dict[str, Any]:
        return {"lam": self.lam, "fired_steps": list(self.fired_steps)}

    def load_state_dict(self, d: dict[str, Any] | None) -> None:
        """Restore; ``None`` (a checkpoint from before acting alarms) keeps the configured start."""
        if d is not None:
            self.lam = None if d["lam"] is None else float(d["lam"])
            self.fired_steps = [int(s) for s in d["fired_steps"]]
