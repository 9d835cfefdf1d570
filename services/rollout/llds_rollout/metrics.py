"""Prometheus metrics of one rollout service instance (own registry, so several apps can coexist)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from llds_rollout.agent import Episode


class RolloutMetrics:
    """Every ``llds_rollout_*`` series."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.generated_tokens = Counter(
            "llds_rollout_generated_tokens_total",
            "Tokens sampled by the engine (rate = tokens/s)",
            ["kind"],
            registry=r,
        )
        self.trajectories = Counter(
            "llds_rollout_trajectories_total", "Finished trajectories by outcome", ["status"], registry=r
        )
        self.turns = Histogram(
            "llds_rollout_turns_per_trajectory",
            "Assistant turns per trajectory",
            buckets=range(1, 18),
            registry=r,
        )
        self.valid_searches = Histogram(
            "llds_rollout_valid_searches_per_trajectory",
            "Searches that produced an observation, per trajectory",
            buckets=range(0, 17),
            registry=r,
        )
        self.invalid_actions = Counter(
            "llds_rollout_invalid_actions_total",
            "Turns with neither a complete search nor an answer",
            registry=r,
        )
        self.reward = Histogram(
            "llds_rollout_reward",
            "Reward per training trajectory",
            buckets=(0.0, 0.1, 0.2, 0.5, 0.8, 1.0),
            registry=r,
        )
        self.retriever_latency = Histogram(
            "llds_rollout_retriever_latency_seconds",
            "Successful retriever call latency",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.retriever_errors = Counter(
            "llds_rollout_retriever_errors_total", "Failed retriever attempts by cause", ["cause"], registry=r
        )
        self.weights_version = Gauge("llds_rollout_weights_version", "Weights version serving", registry=r)
        self.trainer_version = Gauge(
            "llds_rollout_trainer_version", "Newest version the trainer published", registry=r
        )
        self.swap_seconds = Histogram(
            "llds_rollout_weight_swap_seconds",
            "Weight update: request to serving the new version",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.weight_rejects = Counter(
            "llds_rollout_weight_updates_rejected_total",
            "Weight updates refused (old weights kept)",
            registry=r,
        )
        self.weight_swap_failures = Counter(
            "llds_rollout_weight_swap_failures_total",
            "Weight swaps that failed after they began, or whose files changed meanwhile (engine failed)",
            registry=r,
        )
        self.groups = Counter(
            "llds_rollout_groups_total", "Finished groups by outcome", ["status"], registry=r
        )
        self.data_position = Gauge(
            "llds_rollout_data_position",
            "The highest position of the run's shared data order this replica claimed (epoch = position // rows)",
            registry=r,
        )
        self.data_claims = Counter(
            "llds_rollout_data_claims_total",
            "Positions of the data order claimed: new (off the cursor), retaken (a dead replica's lease ran "
            "out) or retried (a failed attempt's)",
            ["how"],
            registry=r,
        )
        self.data_dropped = Counter(
            "llds_rollout_data_dropped_total",
            "Positions recorded as dropped (in the run's data:dropped stream), by why",
            ["why"],
            registry=r,
        )
        self.data_claims_lost = Counter(
            "llds_rollout_data_claims_lost_total",
            "Groups not pushed because their position was no longer this replica's (its lease ran out and "
            "another replica took it over)",
            registry=r,
        )
        self.stale_drops = Counter(
            "llds_rollout_stale_groups_dropped_total",
            "Groups dropped for exceeding the staleness bound",
            registry=r,
        )
        self.admission_wait = Counter(
            "llds_rollout_admission_wait_seconds_total",
            "Time new groups waited to be admitted (weights within K, the trainer's capacity)",
            registry=r,
        )
        self.admission_capacity = Gauge(
            "llds_rollout_admission_capacity_groups",
            "Groups the trainer can train within K versions (queued + in flight), at the last decision",
            registry=r,
        )
        self.groups_in_flight = Gauge(
            "llds_rollout_groups_in_flight",
            "Groups started and not yet in the stream, on every live replica, at the last decision",
            registry=r,
        )
        self.catch_ups = Counter(
            "llds_rollout_weight_catch_ups_total",
            "Newest published versions loaded by the replica itself (late start, missed notice)",
            ["status"],
            registry=r,
        )
        self.buffer = Gauge(
            "llds_rollout_redis_buffer_groups", "Finished groups waiting to be pushed", registry=r
        )
        self.queued_groups = Gauge(
            "llds_rollout_queued_groups",
            "Groups queued for the trainer: unacknowledged entries less those already trained (admission input)",
            registry=r,
        )
        self.redis_errors = Counter("llds_rollout_redis_errors_total", "Failed Redis operations", registry=r)
        self.in_flight = Gauge(
            "llds_rollout_trajectories_in_flight", "Trajectories being sampled", registry=r
        )
        self.answer_latency = Histogram(
            "llds_rollout_answer_latency_seconds",
            "/answer wall time",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.answers_in_flight = Gauge(
            "llds_rollout_answers_in_flight", "/answer requests running (answer_max_in_flight)", registry=r
        )
        self.answers_queued = Gauge(
            "llds_rollout_answers_queued",
            "/answer requests waiting for a slot (answer_max_queued)",
            registry=r,
        )
        self.answers_rejected = Counter(
            "llds_rollout_answers_rejected_total",
            "/answer requests refused with 503 because running and queued slots were full",
            registry=r,
        )
        self.answer_queue_wait = Histogram(
            "llds_rollout_answer_queue_seconds",
            "Time an /answer request waited for a running slot",
            buckets=(0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )

    def observe_episode(self, ep: Episode, kind: str) -> None:
        """Count one finished conversation (``kind`` is ``train`` or ``answer``)."""
        t = ep.trajectory
        self.generated_tokens.labels(kind=kind).inc(sum(len(g.token_ids) for g in ep.generations))
        self.trajectories.labels(status="ok").inc()
        self.turns.observe(t.num_turns)
        self.valid_searches.observe(t.num_valid_searches)
        self.invalid_actions.inc(ep.invalid_actions)
        if kind == "train":
            self.reward.observe(t.reward)

    def render(self) -> bytes:
        return generate_latest(self.registry)
