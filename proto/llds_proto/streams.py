"""Redis names shared by the rollout (producer) and the trainer (consumer)."""

TRAJECTORY_STREAM = "llds:trajectories"
"""Stream of finished trajectory groups; one entry per group, field ``group`` = codec bytes."""

TRAINER_GROUP = "trainers"
"""Consumer group the trainer processes read the trajectory stream through."""

GROUP_FIELD = b"group"
"""Stream entry field holding the encoded group."""

ROLLOUT_REGISTRY = "llds:rollout:replicas"
"""Hash: rollout replica name -> its base URL, so the trainer can notify every replica."""

TRAINER_VERSION_KEY = "llds:trainer:version"
"""String: the newest policy version the trainer has published (rollout staleness control)."""

CONSUMED_KEY = "llds:trainer:consumed"
"""Set of group ids the trainer has trained on (checkpointed too); guards against double training."""
