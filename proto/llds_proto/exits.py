"""Exit statuses a service's supervisor (``llds up``, an orchestrator) reads as more than a failure.

A process manager sees only the number, so these are contracts like the wire formats: the trainer
sets them, ``llds up`` passes them on as its own exit status, and a script driving ``llds up`` (the
experiment, a job scheduler) can tell "the policy has nothing left to learn from" from a crash.
"""

EXIT_FAILED = 1
"""Any failure without a status of its own (a crash, a bad model folder, an unreachable Redis)."""

EXIT_BAD_CONFIG = 2
"""The configuration was refused before anything started."""

EXIT_NO_SIGNAL = 3
"""The trainer stopped because no learning signal was left: dynamic sampling skipped
``dynamic_sampling_max_skips`` groups in a row whose rewards were all equal (a collapsed policy
whose every answer scores 0, or a solved world where every answer scores 1). Restarting cannot help."""
