"""Keys of the trainer's step record: one JSON object per RL step.

The trainer (producer) writes the record to ``train_log.jsonl``, serves it at ``GET /history`` and
hands it to its trackers and its Prometheus gauges; the launcher's dashboard, ``llds report`` and
``llds experiment`` (consumers) read it. Both sides name the keys through these constants, so a
renamed key is renamed everywhere (or fails a test). Values are numbers, or null where the step had
nothing to measure (no correct response, no KL term, ...). docs/observability.md lists the keys.

Every reader of the log goes through :func:`read_step_log` / :func:`read_records` (whole files) or
:class:`StepLogTail` (a live log), so a record torn by a kill is handled the same way everywhere.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

# ------------------------------------------------------------------ bookkeeping
STEP = "step"
"""RL steps completed, this one included (1-based)."""
TIME_UNIX = "time/unix"
"""Wall-clock time the step's updates finished (Unix seconds)."""
WEIGHTS_VERSION = "weights/version"
"""Newest policy version published after this step."""

# ------------------------------------------------------------------ data
DATA_GROUPS = "data/groups"
"""Groups trained on."""
DATA_TRAJECTORIES = "data/trajectories"
"""Trajectories trained on."""
DATA_LOSS_TOKENS = "data/loss_tokens"
"""Loss (action) tokens trained on."""
DATA_STALE_TOKENS = "data/stale_tokens"
"""Loss tokens sampled by a policy version older than the trainer's."""
DATA_MIXED_VERSION_TRAJECTORIES = "data/mixed_version_trajectories"
"""Trajectories whose loss tokens were sampled by more than one policy version (a swap reached them)."""
DATA_OVERLONG = "data/overlong"
"""Truncated responses masked out of the loss by overlong filtering (0 when it is off)."""
DATA_UNIFORM_SKIPPED = "data/uniform_skipped"
"""Groups with uniform rewards skipped before this step (dynamic sampling only)."""
DATA_UNIFORM_SKIPPED_FRAC = "data/uniform_skipped_frac"
"""Those skipped groups over skipped plus trained (dynamic sampling only)."""
DATA_DEAD_LETTERED = "data/dead_lettered"
"""Stream entries set aside in the run's dead-letter stream since the previous step (poison)."""
DATA_FAILED_ATTEMPTS = "data/failed_attempts"
"""Training steps that raised since the previous step and were retried without the failing entries."""

# ------------------------------------------------------------------ reward
REWARD_MEAN = "reward/mean"
"""Mean reward of the step's trajectories."""
REWARD_EXACT_MATCH = "reward/exact_match"
"""Mean exact match of the step's trajectories."""

# ------------------------------------------------------------------ losses (means over micro-batches)
LOSS_TOTAL = "loss/total"
"""Total loss: policy + kl_coef * kl - entropy_coef * entropy + llds."""
LOSS_POLICY = "loss/policy"
"""PPO-clip / GSPO policy loss."""
LOSS_LLDS = "loss/llds"
"""LLDS regulariser term (0 with LLDS off)."""
LOSS_KL = "loss/kl"
"""KL penalty to the reference policy (null without one)."""
LOSS_ENTROPY = "loss/entropy"
"""Entropy bonus term (null without one)."""

# ------------------------------------------------------------------ LLDS regulariser
LLDS_GATED_FRACTION = "llds/gated_fraction"
"""Fraction of gate units of likelihood-preserving responses that LLDS gated on."""
LLDS_ANSWER_WEIGHT = "llds/answer_weight"
"""Weight of the answer tokens in the LLDS term (answer-weight mode)."""
LLDS_LAMBDA = "llds/lambda"
"""LLDS lambda the step trained with (0 = LLDS off)."""

# ------------------------------------------------------------------ optimiser
ACTOR_LR = "actor/lr"
"""Learning rate of the step."""
ACTOR_UPDATES = "actor/updates"
"""Optimiser updates applied."""
ACTOR_NONFINITE_UPDATES = "actor/nonfinite_updates"
"""Updates skipped for a non-finite gradient norm."""
ACTOR_SKIPPED_UPDATES = "actor/skipped_updates"
"""Updates ``optimizer.skip_updates`` left out (a zero gradient, or no advantage in the mini-batch)."""
ACTOR_GRAD_NORM = "actor/grad_norm"
"""Mean pre-clip gradient norm of the step's updates."""
ACTOR_GRAD_NORM_MAX = "actor/grad_norm_max"
"""Largest pre-clip gradient norm of the step's updates."""
ACTOR_CLIP_FRAC = "actor/clip_frac"
"""Fraction of loss tokens where the PPO clip was active."""
ACTOR_DUAL_CLIP_FRAC = "actor/dual_clip_frac"
"""Fraction of loss tokens where the dual clip's bound was taken (None when it is off)."""
ACTOR_RATIO_MAX = "actor/ratio_max"
"""Largest pi_theta / pi_old ratio in the step."""
ACTOR_ENTROPY = "actor/entropy"
"""Mean token entropy of pi_old on loss tokens (nats)."""

# ------------------------------------------------------------------ sampler / trainer mismatch
MISMATCH_KL = "mismatch/kl"
"""KL(sampler || trainer pi_old) per loss token (k3 estimator)."""
MISMATCH_ABS_LOGP_DIFF = "mismatch/abs_logp_diff"
"""Mean absolute difference of sampler and trainer log-probs per loss token."""
IS_WEIGHT_MEAN = "is/weight_mean"
"""Mean weight of the loss tokens the correction acted on and kept (null when off or none)."""
IS_TRUNCATED_FRAC = "is/truncated_frac"
"""Fraction of those tokens whose weight the cap truncated (null when off, none, or a masking method)."""
IS_MASKED_TOKEN_FRAC = "is/masked_token_frac"
"""Fraction of loss tokens the correction dropped from the loss (null when off)."""
IS_DROPPED_SEQ_FRAC = "is/dropped_seq_frac"
"""Fraction of trajectories with loss tokens that the correction dropped whole (null when off)."""
IS_RATIO_P1_STALE0 = "is/ratio_p1_stale0"
"""1st percentile of pi_old / sampler over loss tokens of the trainer's own version (null: none)."""
IS_RATIO_P50_STALE0 = "is/ratio_p50_stale0"
"""Median of pi_old / sampler over loss tokens of the trainer's own version (null: none)."""
IS_RATIO_P99_STALE0 = "is/ratio_p99_stale0"
"""99th percentile of pi_old / sampler over loss tokens of the trainer's own version (null: none)."""
IS_RATIO_P1_STALE1 = "is/ratio_p1_stale1"
"""1st percentile of pi_old / sampler over loss tokens one version behind (null: none)."""
IS_RATIO_P50_STALE1 = "is/ratio_p50_stale1"
"""Median of pi_old / sampler over loss tokens one version behind (null: none)."""
IS_RATIO_P99_STALE1 = "is/ratio_p99_stale1"
"""99th percentile of pi_old / sampler over loss tokens one version behind (null: none)."""
IS_RATIO_P1_STALE2PLUS = "is/ratio_p1_stale2plus"
"""1st percentile of pi_old / sampler over loss tokens two or more versions behind (null: none)."""
IS_RATIO_P50_STALE2PLUS = "is/ratio_p50_stale2plus"
"""Median of pi_old / sampler over loss tokens two or more versions behind (null: none)."""
IS_RATIO_P99_STALE2PLUS = "is/ratio_p99_stale2plus"
"""99th percentile of pi_old / sampler over loss tokens two or more versions behind (null: none)."""

# ------------------------------------------------------------------ the trajectories
ROLLOUT_VALID_SEARCHES_MEAN = "rollout/valid_searches_mean"
"""Mean valid searches per trajectory."""
ROLLOUT_TURNS_MEAN = "rollout/turns_mean"
"""Mean turns per trajectory."""
ROLLOUT_RESPONSE_LEN_MEAN = "rollout/response_len_mean"
"""Mean response length (tokens)."""

RUN_START_DIGEST = "run/start_digest"
"""Short tensors digest of the policy the run started from (a string; null: hub name or older run)."""

# ------------------------------------------------------------------ timing
PERF_STEP_S = "perf/step_s"
"""Wall time of the learner's step: scoring, updates and the LLD probe (seconds)."""
# A step's record is written before its own checkpoint and publish: their times go into the next
# record (perf/prev_*).
PERF_WAIT_S = "perf/wait_s"
"""Time the trainer waited for the step's groups (reading the stream, seconds)."""
PERF_PROBE_S = "perf/probe_s"
"""Time of the LLD probe pass after the last update (seconds; part of ``perf/step_s``)."""
PERF_PREV_CHECKPOINT_S = "perf/prev_checkpoint_s"
"""Time the previous step's checkpoint took (seconds; null on the first step after a start)."""
PERF_PREV_PUBLISH_S = "perf/prev_publish_s"
"""Time the previous step's weights took to write to the weights root (seconds; 0: no publish)."""
PERF_PREV_NOTIFY_S = "perf/prev_notify_s"
"""Time the previous step's notices took until every replica answered, i.e. had swapped (seconds)."""
PERF_OLD_PASS_S = "perf/old_pass_s"
"""Time of the pi_old (and reference) scoring pass (seconds)."""
PERF_OLD_FROM_UPDATE_FRAC = "perf/old_from_update_frac"
"""Share of the samples whose pi_old came from the first update's forward, not the pi_old pass."""
PERF_UPDATE_S = "perf/update_s"
"""Time of the update passes (seconds)."""
PERF_TRAIN_TOKENS_PER_S = "perf/train_tokens_per_s"
"""Tokens per second in the update passes."""
PERF_LOAD1 = "perf/load1"
"""The host's 1-minute load average when the step's record was written (load changes staleness)."""

# ------------------------------------------------------------------ LLD signals (correct responses, pi_old)
LLD_N_CORRECT = "lld/n_correct"
"""Correct responses in the step."""
LLD_CORRECT_LOGP_TOKEN = "lld/correct_logp_token"
"""Mean per-token log-likelihood of correct responses."""
LLD_CORRECT_LOGP_RESPONSE = "lld/correct_logp_response"
"""Mean summed log-likelihood per correct response."""
LLD_INCORRECT_LOGP_TOKEN = "lld/incorrect_logp_token"
"""Mean per-token log-likelihood of incorrect responses."""
LLD_CORRECT_INCORRECT_GAP = "lld/correct_incorrect_gap"
"""Per-token log-likelihood gap, correct minus incorrect."""
LLD_FIRST_ACTION_LOGP = "lld/first_action_logp"
"""Per-token log-likelihood of first actions (correct responses)."""
LLD_LATER_ACTION_LOGP = "lld/later_action_logp"
"""Per-token log-likelihood of later actions (correct responses)."""
LLD_DISPLACEMENT_MEAN = "lld/displacement_mean"
"""Mean sum(logp_after - logp_old) per correct response (needs the LLD probe)."""
LLD_FELL_FRACTION_RESPONSES = "lld/fell_fraction_responses"
"""Fraction of correct responses whose likelihood fell in the step."""
LLD_FELL_FRACTION_ACTIONS = "lld/fell_fraction_actions"
"""Fraction of correct responses' actions whose likelihood fell in the step."""
LLD_FIRST_ACTION_DISPLACEMENT = "lld/first_action_displacement"
"""Per-token likelihood change of first actions in the step."""
LLD_LATER_ACTION_DISPLACEMENT = "lld/later_action_displacement"
"""Per-token likelihood change of later actions in the step."""
LLD_LLDS_TERM = "lld/llds_term"
"""The LLDS term again (a copy of ``loss/llds`` under the LLD prefix)."""
LLD_CORRECT_LOGP_SLOPE = "lld/correct_logp_slope"
"""Slope per step of ``lld/correct_logp_token`` over the monitor's window."""
LLD_FELL_FRACTION_SLOPE = "lld/fell_fraction_slope"
"""Slope per step of ``lld/fell_fraction_responses`` over the monitor's window."""
LLD_ALARM = "lld/alarm"
"""LLD alarm after this step: 0 ok, 1 warning, 2 alarm."""
LLD_ACTION = "lld/action"
"""1 if the acting alarm changed the regulariser at this step (from the next step on), else 0."""

KEYS: frozenset[str] = frozenset(v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str))
"""Every key a step record may carry."""


# ------------------------------------------------------------------ reading the log
log = logging.getLogger("llds.steplog")


class StepLogError(ValueError):
    """A line of a step log that is not a JSON object; the message names the file and the line."""


def _record(line: bytes, path: Path, lineno: int) -> dict[str, Any]:
    try:
        rec = json.loads(line)
    except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
        raise StepLogError(f"{path}:{lineno} is not JSON: {e}") from e
    if not isinstance(rec, dict):
        raise StepLogError(f"{path}:{lineno} is not a JSON object")
    return rec


@dataclass(frozen=True)
class StepLog:
    """A step log as read: its records in file order and the torn last line left out, if any."""

    records: list[dict[str, Any]]
    torn_line: int | None = None
    """Number (1-based) of the last line, left out because it is not JSON: the writer was killed mid-record."""


def read_step_log(path: Path | str) -> StepLog:
    """Read a JSONL step log (``train_log.jsonl`` or a compact copy of one).

    A missing file holds no records. The last line may be torn (a writer killed mid-record leaves a
    line without its end, which is not JSON): it is left out. Any other line that is not a JSON
    object raises :class:`StepLogError` naming the file and the line: the log is damaged where no
    kill can damage it, and reading on would misreport the run.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return StepLog([])
    lines = [(i, line) for i, line in enumerate(data.split(b"\n"), start=1) if line.strip()]
    records: list[dict[str, Any]] = []
    for i, line in lines:
        try:
            records.append(_record(line, path, i))
        except StepLogError as e:
            if i == lines[-1][0] and isinstance(e.__cause__, ValueError):
                return StepLog(records, torn_line=i)
            raise
    return StepLog(records)


def read_records(path: Path | str) -> list[dict[str, Any]]:
    """The records of a step log, a torn last line left out (see :func:`read_step_log`)."""
    return read_step_log(path).records


class StepLogTail:
    """The records appended to a live step log since the previous :meth:`read` (the console, the dashboard).

    Only whole lines are read: a record still being written waits for its newline. A file that
    shrank was cut by a restarted trainer (:func:`read_step_log` semantics, records of lost steps
    removed): ``after_cut = "reread"`` reads it again from its start, ``"skip"`` goes on after what it
    holds then. A whole line that is not a JSON object is logged and counted in ``bad_lines``, not
    raised: a viewer of a live run reports damage, it does not stop the run.
    """

    def __init__(self, path: Path | str, after_cut: Literal["reread", "skip"] = "reread"):
        self.path = Path(path)
        self.after_cut = after_cut
        self.offset = 0
        """Bytes of whole lines read so far."""
        self.lines = 0
        """Lines read so far (the number of the next line is ``lines + 1``)."""
        self.bad_lines = 0
        """Whole lines skipped because they are not JSON objects."""

    def skip_existing(self) -> None:
        """Go on after the whole lines the log holds now (a resumed run's viewer shows new steps only)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        self.offset = data.rfind(b"\n") + 1
        self.lines = data[: self.offset].count(b"\n")

    def read(self) -> list[dict[str, Any]]:
        """New records; a missing file is no records yet."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:
            self.offset = self.lines = 0
            if self.after_cut == "skip":
                self.skip_existing()
                return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        end = data.rfind(b"\n") + 1
        self.offset += end
        records: list[dict[str, Any]] = []
        for line in data[:end].split(b"\n")[:-1]:
            self.lines += 1
            if not line.strip():
                continue
            try:
                records.append(_record(line, self.path, self.lines))
            except StepLogError as e:
                self.bad_lines += 1
                log.warning("%s; skipped (%d such lines so far)", e, self.bad_lines)
        return records
