"""Keys of the trainer's step record: one JSON object per RL step.

The trainer (producer) writes the record to ``train_log.jsonl``, serves it at ``GET /history`` and
hands it to its trackers and its Prometheus gauges; the launcher's dashboard, ``llds report`` and
``llds experiment`` (consumers) read it. Both sides name the keys through these constants, so a
renamed key is renamed everywhere (or fails a test). Values are numbers, or null where the step had
nothing to measure (no correct response, no KL term, ...). docs/observability.md lists the keys.
"""

from __future__ import annotations

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
DATA_OVERLONG = "data/overlong"
"""Truncated responses masked out of the loss by overlong filtering (0 when it is off)."""
DATA_UNIFORM_SKIPPED = "data/uniform_skipped"
"""Groups with uniform rewards skipped before this step (dynamic sampling only)."""
DATA_UNIFORM_SKIPPED_FRAC = "data/uniform_skipped_frac"
"""Those skipped groups over skipped plus trained (dynamic sampling only)."""

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
"""Mean truncated importance weight where the correction applied (null when off)."""
IS_TRUNCATED_FRAC = "is/truncated_frac"
"""Fraction of those tokens whose importance weight was truncated."""

# ------------------------------------------------------------------ the trajectories
ROLLOUT_VALID_SEARCHES_MEAN = "rollout/valid_searches_mean"
"""Mean valid searches per trajectory."""
ROLLOUT_TURNS_MEAN = "rollout/turns_mean"
"""Mean turns per trajectory."""
ROLLOUT_RESPONSE_LEN_MEAN = "rollout/response_len_mean"
"""Mean response length (tokens)."""

# ------------------------------------------------------------------ timing
PERF_STEP_S = "perf/step_s"
"""Wall time of the step (seconds)."""
PERF_OLD_PASS_S = "perf/old_pass_s"
"""Time of the pi_old (and reference) scoring pass (seconds)."""
PERF_UPDATE_S = "perf/update_s"
"""Time of the update passes (seconds)."""
PERF_TRAIN_TOKENS_PER_S = "perf/train_tokens_per_s"
"""Tokens per second in the update passes."""

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
