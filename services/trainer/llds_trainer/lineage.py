"""Version lineage: which published version numbers are real policy updates, across restarts.

The trainer publishes versions 1, 2, 3, ... but checkpoints on its own cadence
(``checkpoint_every``), so a crash can lose published versions: a restart from a checkpoint at
version V, after versions up to P > V went out, continues from V's weights. Rollouts may already have
sampled with V+1..P, and a rollout refuses a version that is not newer than the one it serves, so the
trainer must never hand out a number twice. On such a restart it therefore:

- records V+1..P as **orphaned** (their weights are not ancestors of anything trained from now on;
  groups with any token sampled by them are dropped);
- republishes its restored weights as version P+1, an **alias** (the same policy as V plus the
  updates the checkpoint holds since V was published: no update of its own).

Staleness is then the *lineage distance* of a group: the number of versions in
``(group.min_version, current]`` that are real updates (neither orphaned nor an alias).

Records older than what staleness can still reach are pruned (:meth:`Lineage.prune`), so the state
stays small however many restarts a run sees. Pure Python, no torch, no Redis.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


class LineageError(ValueError):
    """A lineage state that cannot be right (overlapping or unordered records)."""


@dataclass
class Lineage:
    """Version numbers that are not real updates: orphaned ranges and restart aliases."""

    orphaned: list[tuple[int, int]] = field(default_factory=list)
    """Inclusive ranges ``(lo, hi)`` of versions published by a lost branch, ascending."""
    aliases: list[int] = field(default_factory=list)
    """Versions a restart republished its restored weights under, ascending."""

    def is_orphaned(self, version: int) -> bool:
        return any(lo <= version <= hi for lo, hi in self.orphaned)

    def is_real(self, version: int) -> bool:
        """Whether ``version`` (>= 1) is an optimizer update in the current lineage."""
        return version >= 1 and not self.is_orphaned(version) and version not in self.aliases

    def any_orphaned(self, versions: Iterable[int]) -> bool:
        return any(self.is_orphaned(v) for v in versions)

    def distance(self, min_version: int, current: int) -> int:
        """Real updates in ``(min_version, current]``: how many versions behind a group sampled by
        ``min_version`` is (0 if it is the current version or only aliases/orphans came since)."""
        lo = max(min_version + 1, 1)
        if current < lo:
            return 0
        n = current - lo + 1
        for a, b in self.orphaned:
            n -= max(0, min(b, current) - max(a, lo) + 1)
        n -= sum(1 for a in self.aliases if lo <= a <= current)
        return n

    def restart(self, version: int, published: int) -> tuple[int, tuple[int, int] | None]:
        """Resume at checkpoint ``version`` after versions up to ``published`` went out.

        Returns the version the restored weights are (re)published as and the orphaned range, if
        any. ``published <= version``: nothing was lost (the checkpoint's version itself may still
        have to be published); otherwise ``version+1..published`` are orphaned and ``published + 1``
        is a new alias.
        """
        if published <= version:
            return version, None
        lost = (version + 1, published)
        self.orphaned.append(lost)
        self.aliases.append(published + 1)
        return published + 1, lost

    def prune(self, current: int, staleness_k: int) -> None:
        """Forget records below the (k+1)-th newest real update: any group sampled before it is stale
        however the records below are read, so dropping them changes no decision except that such a
        group is dropped as ``stale`` rather than ``orphaned``."""
        seen, v = 0, current
        floor = None
        while v >= 1:
            if self.is_real(v):
                seen += 1
                if seen == staleness_k + 1:
                    floor = v
                    break
            v -= 1
        if floor is None:
            return
        self.orphaned = [(lo, hi) for lo, hi in self.orphaned if hi > floor]
        self.aliases = [a for a in self.aliases if a > floor]

    def state_dict(self) -> dict[str, Any]:
        return {"orphaned": [list(r) for r in self.orphaned], "aliases": list(self.aliases)}

    @classmethod
    def from_state(cls, d: dict[str, Any] | None) -> Lineage:
        """Read :meth:`state_dict`'s output; ``None`` (a checkpoint from before lineages) is empty."""
        if not d:
            return cls()
        orphaned = [(int(lo), int(hi)) for lo, hi in d.get("orphaned", [])]
        aliases = [int(a) for a in d.get("aliases", [])]
        prev = 0
        for lo, hi in orphaned:
            if lo > hi or lo <= prev:
                raise LineageError(f"orphaned ranges {orphaned} overlap or are out of order")
            prev = hi
        if aliases != sorted(set(aliases)):
            raise LineageError(f"aliases {aliases} are not strictly ascending")
        return cls(orphaned=orphaned, aliases=aliases)
