"""The panel catalogue: named charts of known signals, and one panel per unknown history-key prefix
or metric family, so new signals show up without touching the dashboard."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from llds.dashboard.scrape import metric_family
from llds_proto import steplog as K

Source = Literal["history", "metrics"]


@dataclass(frozen=True)
class Panel:
    """A named chart: which series it draws and from where."""

    id: str
    title: str
    source: Source
    series: tuple[str, ...]
    section: str
    unit: str = ""
    """``s`` (seconds), ``/s`` (rate) or empty."""
    stepped: bool = False
    """Draw as steps (versions, alarm levels)."""
    y_range: tuple[float, float] | None = None
    """Fixed y axis (e.g. the alarm's 0..2); none: fit the data."""


H: Source = "history"
M: Source = "metrics"
# History series are the trainer's step-record keys (llds_proto.steplog); metric series are sample
# keys of the services' Prometheus families as scrape.derive names them (rate:, mean:, p95:).
PANELS: tuple[Panel, ...] = (
    Panel("reward", "Reward and exact match", H, (K.REWARD_MEAN, K.REWARD_EXACT_MATCH), "Reward"),
    Panel("lld_alarm", "LLD alarm (0 ok, 1 warning, 2 alarm)", H, (K.LLD_ALARM,), "Reward", stepped=True,
          y_range=(0, 2)),
    Panel("loss_llds", "LLDS term", H, (K.LOSS_LLDS,), "Reward"),
    Panel("llds_lambda", "LLDS lambda and alarm actions (1 = the alarm acted)", H, (K.LLDS_LAMBDA, K.LLD_ACTION),
          "Reward", stepped=True),
    Panel("loss", "Losses", H, (K.LOSS_TOTAL, K.LOSS_POLICY, K.LOSS_KL), "Reward"),
    Panel("lld_logp", "Log-likelihood per token (correct, first / later actions, incorrect)", H,
          (K.LLD_CORRECT_LOGP_TOKEN, K.LLD_FIRST_ACTION_LOGP, K.LLD_LATER_ACTION_LOGP, K.LLD_INCORRECT_LOGP_TOKEN),
          "LLD signals"),
    Panel("lld_slope", "Correct log-likelihood slope", H, (K.LLD_CORRECT_LOGP_SLOPE,), "LLD signals"),
    Panel("lld_displaced", "Fraction displaced (fell) and LLDS-gated", H,
          (K.LLD_FELL_FRACTION_RESPONSES, K.LLD_FELL_FRACTION_ACTIONS, K.LLDS_GATED_FRACTION), "LLD signals"),
    Panel("lld_displacement", "Intra-step displacement (sum of logp change)", H,
          (K.LLD_DISPLACEMENT_MEAN, K.LLD_FIRST_ACTION_DISPLACEMENT, K.LLD_LATER_ACTION_DISPLACEMENT), "LLD signals"),
    Panel("lld_gap", "Correct - incorrect log-likelihood gap", H, (K.LLD_CORRECT_INCORRECT_GAP,), "LLD signals"),
    Panel("entropy", "Token entropy", H, (K.ACTOR_ENTROPY,), "Policy"),
    Panel("grad_norm", "Gradient norm (pre-clip)", H, (K.ACTOR_GRAD_NORM, K.ACTOR_GRAD_NORM_MAX), "Policy"),
    Panel("clip_frac", "Clip fraction and max ratio", H, (K.ACTOR_CLIP_FRAC, K.ACTOR_RATIO_MAX), "Policy"),
    Panel("response_length", "Response length (tokens)", H, (K.ROLLOUT_RESPONSE_LEN_MEAN,), "Policy"),
    Panel("turns", "Turns and valid searches", H, (K.ROLLOUT_TURNS_MEAN, K.ROLLOUT_VALID_SEARCHES_MEAN), "Policy"),
    Panel("weights_step", "Weights version per step", H, (K.WEIGHTS_VERSION,), "Policy", stepped=True),
    Panel("queue", "Stream length and consumer lag (entries)", M,
          ("llds_trainer_stream_length_entries", "llds_trainer_consumer_lag_entries", "llds_rollout_redis_buffer_groups"), "System"),
    Panel("staleness", "Groups dropped (stale)", M,
          ("rate:llds_rollout_stale_groups_dropped_total", "rate:llds_trainer_groups_dropped_total"), "System", "/s"),
    Panel("dead_letter", "Entries set aside (dead-letter stream) and failed step attempts, per step", H,
          (K.DATA_DEAD_LETTERED, K.DATA_FAILED_ATTEMPTS), "System"),
    Panel("tokens", "Tokens/s (generated, trained)", M,
          ("rate:llds_rollout_generated_tokens_total", "llds_trainer_train_tokens_per_second"), "System", "/s"),
    Panel("trajectories", "Trajectories/s (generated, trained)", M,
          ("rate:llds_rollout_trajectories_total", "rate:llds_trainer_trajectories_consumed_total"), "System", "/s"),
    Panel("retrieval_qps", "Retrieval requests/s and queries/s", M,
          ("rate:llds_retriever_requests_total", "rate:llds_retriever_queries_total"), "System", "/s"),
    Panel("retrieval_latency", "Retrieval latency (server mean / p95, seen by rollout p95)", M,
          ("mean:llds_retriever_request_latency_seconds", "p95:llds_retriever_request_latency_seconds",
           "p95:llds_rollout_retriever_latency_seconds"), "System", "s"),
    Panel("weights", "Weights version (trainer, rollout)", M,
          ("llds_trainer_weights_version", "llds_rollout_weights_version", "llds_rollout_trainer_version"),
          "System", stepped=True),
    Panel("swaps", "Weight swaps/s", M, ("rate:llds_rollout_weight_swap_seconds_count",), "System", "/s"),
    Panel("swap_time", "Weight swap time", M, ("mean:llds_rollout_weight_swap_seconds",), "System", "s"),
    Panel("trainer_step", "Trainer step", M, ("llds_trainer_step",), "System", stepped=True),
)  # fmt: skip
TRAINER_GAUGES_SECTION = "Trainer gauges (the last step's values, as Prometheus sees them)"
HIDDEN_HISTORY = {K.STEP, K.TIME_UNIX, K.LLD_LLDS_TERM}
"""History keys no panel draws: bookkeeping, and the trainer's copy of ``loss/llds`` (drawn as that)."""


def _matches(series: str, keys: Iterable[str]) -> list[str]:
    """Keys that ``series`` names: itself and its labelled variants."""
    return sorted(k for k in keys if k == series or k.startswith(series + "{"))


def layout(metric_keys: Iterable[str], history_keys: Iterable[str]) -> list[dict[str, Any]]:
    """Panels to draw: every known panel (with the series present now and those still missing),
    then one panel per unknown history-key prefix and one per unknown metric family."""
    mkeys, hkeys = set(metric_keys), set(history_keys)
    panels: list[dict[str, Any]] = []
    claimed_h: set[str] = set()
    claimed_m: set[str] = set()
    for p in PANELS:
        keys = hkeys if p.source == H else mkeys
        present: list[str] = []
        missing: list[str] = []
        for series in p.series:
            found = _matches(series, keys)
            present.extend(found)
            if not found:
                missing.append(series)
            if p.source == H:
                claimed_h.add(series)
            else:
                claimed_m.add(metric_family(series))
        panels.append({"id": p.id, "title": p.title, "source": p.source, "section": p.section, "unit": p.unit,
                       "stepped": p.stepped, "series": present, "missing": missing, "known": True,
                       "collapsed": False, "y_range": p.y_range})  # fmt: skip
    by_prefix: dict[str, list[str]] = {}
    for k in sorted(hkeys - claimed_h - HIDDEN_HISTORY):
        by_prefix.setdefault(k.split("/", 1)[0] if "/" in k else "other", []).append(k)
    for prefix, hseries in by_prefix.items():
        panels.append({"id": f"h:{prefix}", "title": f"{prefix}/*", "source": H, "section": "More training keys",
                       "unit": "", "stepped": False, "series": hseries, "missing": [], "known": False,
                       "collapsed": False})  # fmt: skip
    by_family: dict[tuple[str, bool], list[str]] = {}
    for k in sorted(mkeys):
        fam = metric_family(k)
        if fam in claimed_m:
            continue
        # Raw counter totals are drawn as rates, histogram counts as rate/mean/p95.
        if (k.endswith("_total") or k.endswith("_count")) and not k.startswith("rate:"):
            continue
        by_family.setdefault((fam, k.startswith("rate:")), []).append(k)
    for (fam, is_rate), mseries in by_family.items():
        unit = "/s" if is_rate else ("s" if fam.endswith("_seconds") else "")
        pid, title = (f"m:{fam}:rate", f"{fam} (per second)") if is_rate else (f"m:{fam}", fam)
        # The trainer's gauges repeat its last step record, already drawn per step: fold them away.
        mirror = fam.startswith("llds_trainer_") and not is_rate and not any(":" in k for k in mseries)
        section = TRAINER_GAUGES_SECTION if mirror else "More metrics"
        panels.append({"id": pid, "title": title, "source": M, "section": section, "unit": unit,
                       "stepped": False, "series": mseries, "missing": [], "known": False,
                       "collapsed": mirror})  # fmt: skip
    return panels
