"""Redis names shared by the rollout (producer) and the trainer (consumer).

Every key carries the run's id (``llds:{run_id}:...``), so that two runs on one Redis (a restarted
compose or Kubernetes deployment with a persistent Redis, or ``llds up`` twice) never read each
other's groups, versions or replicas. Services get the id from their config (``run_id``);
``llds up`` gives each run its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_RUN_ID = "default"
"""Run id of services started without one."""

RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
"""Allowed run ids: they become part of Redis keys, folder names and metric labels."""

TRAINER_GROUP = "trainers"
"""Consumer group the trainer processes read the trajectory stream through."""

GROUP_FIELD = b"group"
"""Stream entry field holding the encoded group."""

DEAD_LETTER_MAXLEN = 10_000
"""Approximate cap of a run's dead-letter stream (``XADD MAXLEN ~``): Redis stays bounded even when
a producer sends nothing but poison."""

DATA_DROPPED_MAXLEN = 100_000
"""Approximate cap of a run's drop record (a few MB): Redis stays bounded, an audit of a long run
still sees every drop."""

POISON_REASONS = ("invalid", "out_of_vocab", "too_long", "failed")
"""Drop reasons that set an entry aside in the dead-letter stream (the entry itself is bad); other
drops (stale, duplicate, foreign, ...) are normal operation and are only counted."""


class RunIdError(ValueError):
    """A run id that cannot be part of a Redis key."""


def check_run_id(run_id: str) -> str:
    if not re.match(RUN_ID_PATTERN, run_id):
        raise RunIdError(f"run id {run_id!r} must match {RUN_ID_PATTERN}")
    return run_id


@dataclass(frozen=True)
class RunKeys:
    """The Redis keys of one run."""

    run_id: str = DEFAULT_RUN_ID

    def __post_init__(self) -> None:
        check_run_id(self.run_id)

    @property
    def stream(self) -> str:
        """Stream of finished trajectory groups; one entry per group, field ``group`` = codec bytes."""
        return f"llds:{self.run_id}:trajectories"

    @property
    def dead_letter(self) -> str:
        """Stream of entries the trainer set aside (undecodable, outside the policy's vocabulary or
        positions, or failing the training step ``max_entry_failures`` times): fields ``entry`` (the
        original entry id), ``reason``, ``error`` and ``group`` (the original bytes, empty if none).
        Capped at :data:`DEAD_LETTER_MAXLEN` entries (oldest go first)."""
        return f"llds:{self.run_id}:trajectories:dead"

    @property
    def entry_failures(self) -> str:
        """Hash: stream entry id -> how many training steps it failed in (deleted when acknowledged)."""
        return f"llds:{self.run_id}:trajectories:failures"

    @property
    def registry(self) -> str:
        """Hash: rollout replica name -> its base URL, so the trainer can notify every replica."""
        return f"llds:{self.run_id}:rollout:replicas"

    @property
    def heartbeats(self) -> str:
        """Sorted set: rollout replica name -> unix time of its last heartbeat. The trainer prunes a
        registry entry whose heartbeat is older than its ``replica_ttl_s`` (a replica that died
        without deregistering); an entry with no heartbeat at all (added by hand) is left alone."""
        return f"llds:{self.run_id}:rollout:heartbeats"

    @property
    def weight_pins(self) -> str:
        """Sorted set: ``<version>/<replica name>`` -> unix time a replica started reading that
        published version's folder. The trainer's clean-up of old versions keeps a folder pinned by
        an entry younger than its ``pin_ttl_s`` (a replica that died mid-read lets go by itself)."""
        return f"llds:{self.run_id}:weights:pins"

    @property
    def in_flight(self) -> str:
        """Hash: rollout replica name -> groups it is sampling now (admission across replicas)."""
        return f"llds:{self.run_id}:rollout:in_flight"

    @property
    def data_cursor(self) -> str:
        """String (integer): the next position of the run's data order no replica has claimed yet.
        Position p is the prompt at ``p % n`` of epoch ``p // n``'s order (the rollout's dataset, seed
        and shuffle); a resumed run goes on from here."""
        return f"llds:{self.run_id}:data:cursor"

    @property
    def data_claims(self) -> str:
        """Hash: position -> ``<replica>\t<lease start>\t<failed attempts>``, the positions being
        sampled now. A claim's end and its group's stream entry (or drop record) are one write; a claim
        whose lease (Redis time) ran out is taken over by another replica."""
        return f"llds:{self.run_id}:data:claims"

    @property
    def data_dropped(self) -> str:
        """Stream of positions that will never reach the trajectory stream: fields ``position``,
        ``prompt_id``, ``group_id``, ``why`` (``stale``: too far behind the trainer when sampled;
        ``failed``: failed ``max_attempts`` times) and ``producer``. Capped at
        :data:`DATA_DROPPED_MAXLEN` entries (approximately: oldest go first)."""
        return f"llds:{self.run_id}:data:dropped"

    @property
    def trainer_version(self) -> str:
        """String: the newest policy version the trainer has published (rollout staleness control)."""
        return f"llds:{self.run_id}:trainer:version"

    @property
    def trainer_info(self) -> str:
        """String: JSON :class:`llds_proto.messages.TrainerInfo`, what the rollout's admission needs."""
        return f"llds:{self.run_id}:trainer:info"


DEFAULT_KEYS = RunKeys()
"""Keys of the default run (services started without a run id, and most tests)."""
