"""Prometheus metrics of the trainer (``llds_trainer_<thing>_<unit>``, ``_total`` on counters)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from llds_proto import steplog as K

GAUGES: dict[str, tuple[str, str]] = {
    K.REWARD_MEAN: ("llds_trainer_reward_mean", "Mean reward of the step's trajectories."),
    K.REWARD_EXACT_MATCH: ("llds_trainer_exact_match_ratio", "Mean exact match of the step's trajectories."),
    K.LOSS_TOTAL: ("llds_trainer_loss", "Total loss (mean over micro-batches)."),
    K.LOSS_POLICY: ("llds_trainer_policy_loss", "PPO-clip / GSPO policy loss."),
    K.LOSS_LLDS: ("llds_trainer_llds_term", "LLDS regulariser term (mean over micro-batches)."),
    K.LLDS_GATED_FRACTION: ("llds_trainer_llds_gated_ratio", "Fraction of gate units of preserving responses LLDS gated."),
    K.ACTOR_GRAD_NORM: ("llds_trainer_grad_norm", "Mean pre-clip gradient norm of the step's updates."),
    K.ACTOR_CLIP_FRAC: ("llds_trainer_clip_ratio", "Fraction of loss tokens where the PPO clip was active."),
    K.ACTOR_RATIO_MAX: ("llds_trainer_importance_ratio_max", "Largest pi_theta / pi_old ratio in the step."),
    K.ACTOR_ENTROPY: ("llds_trainer_entropy_nats", "Mean token entropy of pi_old on loss tokens."),
    K.ACTOR_LR: ("llds_trainer_learning_rate", "Learning rate of the step."),
    K.MISMATCH_KL: ("llds_trainer_mismatch_kl_nats", "KL(sampler || trainer pi_old) per loss token (k3)."),
    K.PERF_TRAIN_TOKENS_PER_S: ("llds_trainer_train_tokens_per_second", "Tokens per second in the update passes."),
    K.ROLLOUT_VALID_SEARCHES_MEAN: ("llds_trainer_valid_searches_mean", "Mean valid searches per trajectory."),
    K.ROLLOUT_RESPONSE_LEN_MEAN: ("llds_trainer_response_length_tokens", "Mean response length."),
    K.LLD_CORRECT_LOGP_TOKEN: ("llds_trainer_lld_correct_logp_nats", "Mean per-token log-likelihood of correct responses."),
    K.LLD_CORRECT_LOGP_SLOPE: ("llds_trainer_lld_correct_logp_slope_nats", "Slope per step of the above over the window."),
    K.LLD_DISPLACEMENT_MEAN: ("llds_trainer_lld_displacement_nats", "Mean sum(logp_after - logp_old) per correct response."),
    K.LLD_FELL_FRACTION_RESPONSES: ("llds_trainer_lld_fell_responses_ratio", "Fraction of correct responses whose likelihood fell."),
    K.LLD_FELL_FRACTION_ACTIONS: ("llds_trainer_lld_fell_actions_ratio", "Fraction of correct responses' actions whose likelihood fell."),
    K.LLD_FIRST_ACTION_LOGP: ("llds_trainer_lld_first_action_logp_nats", "Per-token log-likelihood of first actions (correct)."),
    K.LLD_LATER_ACTION_LOGP: ("llds_trainer_lld_later_action_logp_nats", "Per-token log-likelihood of later actions (correct)."),
    K.LLD_CORRECT_INCORRECT_GAP: ("llds_trainer_lld_correct_incorrect_gap_nats", "Per-token log-likelihood gap, correct minus incorrect."),
    K.LLD_ALARM: ("llds_trainer_lld_alarm_state", "LLD alarm: 0 ok, 1 warning, 2 alarm."),
    K.LLD_ACTION: ("llds_trainer_lld_alarm_action", "1 if the acting alarm changed the regulariser at this step."),
    K.LLDS_LAMBDA: ("llds_trainer_llds_lambda", "LLDS lambda the step trained with (0 = LLDS off)."),
}  # fmt: skip


class TrainerMetrics:
    """The trainer's registry; :meth:`observe_step` exports one step record."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.step = Gauge("llds_trainer_step", "RL steps completed.", registry=r)
        self.version = Gauge("llds_trainer_weights_version", "Newest published policy version.", registry=r)
        self.groups = Counter("llds_trainer_groups_consumed_total", "Groups trained on.", registry=r)
        self.trajectories = Counter(
            "llds_trainer_trajectories_consumed_total", "Trajectories trained on.", registry=r
        )
        self.dropped = Counter(
            "llds_trainer_groups_dropped_total", "Groups dropped unused, by reason.", ["reason"], registry=r
        )
        self.dead_lettered = Counter(
            "llds_trainer_dead_lettered_total",
            "Stream entries set aside in the run's dead-letter stream, by reason.",
            ["reason"],
            registry=r,
        )
        self.failed_steps = Counter(
            "llds_trainer_failed_steps_total", "Training steps that raised and were retried.", registry=r
        )
        self.replicas_pruned = Counter(
            "llds_trainer_replicas_pruned_total",
            "Registered rollout replicas pruned for a stale heartbeat.",
            registry=r,
        )
        self.replicas_refused = Counter(
            "llds_trainer_replicas_refused_total",
            "Registered replica URLs refused (host not in replica_hosts); counted once per URL.",
            registry=r,
        )
        self.notify_failures = Counter(
            "llds_trainer_notify_failures_total", "Failed weight-update notices.", registry=r
        )
        self.step_seconds = Histogram(
            "llds_trainer_step_seconds",
            "Wall time of one RL step (training only).",
            buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800),
            registry=r,
        )
        self.checkpoint_seconds = Gauge(
            "llds_trainer_checkpoint_seconds", "Last checkpoint's write time.", registry=r
        )
        self.publish_seconds = Gauge("llds_trainer_publish_seconds", "Last weights publish time.", registry=r)
        self.stream_length = Gauge(
            "llds_trainer_stream_length_entries",
            "Entries in the run's trajectory stream (after trimming).",
            registry=r,
        )
        self.consumer_lag = Gauge(
            "llds_trainer_consumer_lag_entries",
            "Stream entries not yet delivered to the trainers' group plus those pending.",
            registry=r,
        )
        self.redis_memory = Gauge(
            "llds_trainer_redis_used_memory_bytes", "Redis used_memory (INFO memory).", registry=r
        )
        self.trimmed = Counter(
            "llds_trainer_stream_trimmed_entries_total",
            "Acknowledged stream entries trimmed away.",
            registry=r,
        )
        self.orphaned_versions = Counter(
            "llds_trainer_orphaned_versions_total",
            "Published versions a restart from an older checkpoint orphaned.",
            registry=r,
        )
        self.gauges = {k: Gauge(name, doc, registry=r) for k, (name, doc) in GAUGES.items()}

    def observe_step(self, rec: dict[str, Any]) -> None:
        self.step.set(rec[K.STEP])
        self.groups.inc(rec[K.DATA_GROUPS])
        self.trajectories.inc(rec[K.DATA_TRAJECTORIES])
        self.step_seconds.observe(rec[K.PERF_STEP_S])
        for k, g in self.gauges.items():
            v = rec.get(k)
            if v is not None:
                g.set(float(v))
