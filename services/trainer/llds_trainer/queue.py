"""The trajectory queue: a Redis stream read through the ``trainers`` consumer group.

Delivery guarantee (with :class:`llds_trainer.service.TrainerService`): an entry is acknowledged
only after a durable checkpoint includes the optimizer step that used it (or after it was dropped on
purpose: stale, or already in the checkpoint's consumed set, or set aside as poison into the run's
dead-letter stream: undecodable, or failing the training step too often). Unacknowledged entries stay
in the pending list of the consumer that read them; a restarted trainer with the same consumer name
first re-reads its own pending entries (ID ``0``), and entries of consumers idle for longer than
``claim_idle_ms`` are taken over with ``XAUTOCLAIM``. Together with the consumed ids in every
checkpoint: after a kill -9 at any point, no group is lost and none is trained twice.

Acknowledged entries are trimmed away (:meth:`StreamQueue.trim`, ``XTRIM MINID``) so the stream
does not grow for ever; an entry that is pending or not yet delivered to any consumer group is
never trimmed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import redis

from llds_proto.codec import CodecError, decode_group
from llds_proto.messages import TrajectoryGroup
from llds_proto.streams import DEAD_LETTER_MAXLEN, DEFAULT_KEYS, GROUP_FIELD, TRAINER_GROUP

log = logging.getLogger("llds.trainer.queue")


@dataclass(frozen=True)
class Entry:
    """One stream entry: its id and the decoded group, or why it could not be decoded."""

    entry_id: str
    group: TrajectoryGroup | None
    error: str | None = None
    raw: bytes | None = None
    """The entry's ``group`` field as stored (what the dead-letter stream keeps)."""
    failures: int = 0
    """Training steps it made fail so far (``count_failure``; read with the entry, kept across restarts)."""


class StreamQueue:
    """Consumer-group reader of a run's trajectory stream (``RunKeys.stream``) for one named consumer."""

    def __init__(
        self,
        client: redis.Redis,
        consumer: str,
        *,
        claim_idle_ms: int = 60_000,
        block_ms: int = 1000,
        stream: str = DEFAULT_KEYS.stream,
        group: str = TRAINER_GROUP,
        dead_letter: str = DEFAULT_KEYS.dead_letter,
        failures: str = DEFAULT_KEYS.entry_failures,
    ):
        self.r = client
        self.dead_letter_stream = dead_letter
        self.failures = failures
        self.consumer = consumer
        self.claim_idle_ms = claim_idle_ms
        self.block_ms = block_ms
        self.stream = stream
        self.group = group
        self._pending_cursor: str | None = "0"
        self._claim_cursor = "0-0"
        self.held: set[str] = set()
        """Entries handed out and not yet acknowledged."""

    def ensure_group(self) -> None:
        """Create the consumer group (and the stream) if missing, reading from the beginning."""
        try:
            self.r.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def _decode(self, raw: list) -> list[Entry]:  # type: ignore[type-arg]
        fresh = []
        for eid, fields in raw:
            eid = eid.decode() if isinstance(eid, bytes) else str(eid)
            if eid not in self.held:
                self.held.add(eid)
                fresh.append((eid, fields))
        # Failure counts of the whole batch in one round trip (almost always none).
        counts = self.r.hmget(self.failures, [eid for eid, _ in fresh]) if fresh else []
        out = []
        for (eid, fields), n in zip(fresh, counts, strict=True):
            failures = int(n) if n is not None else 0
            data = (fields or {}).get(GROUP_FIELD)
            if data is None:
                out.append(
                    Entry(eid, None, "entry has no 'group' field (deleted or foreign)", failures=failures)
                )
                continue
            try:
                out.append(Entry(eid, decode_group(data), raw=data, failures=failures))
            except CodecError as e:
                out.append(Entry(eid, None, str(e), raw=data, failures=failures))
        return out

    def _read_own_pending(self, n: int) -> list[Entry]:
        """Entries delivered to this consumer name earlier (a previous run) and never acknowledged."""
        got: list[Entry] = []
        while self._pending_cursor is not None and len(got) < n:
            resp = self.r.xreadgroup(self.group, self.consumer, {self.stream: self._pending_cursor}, count=n)
            raw = resp[0][1] if resp else []
            if not raw:
                self._pending_cursor = None
                break
            last = raw[-1][0]
            self._pending_cursor = last.decode() if isinstance(last, bytes) else str(last)
            got.extend(self._decode(raw))
        return got

    def _claim(self, n: int) -> list[Entry]:
        """Take over entries other consumers left pending for longer than ``claim_idle_ms``."""
        resp = self.r.xautoclaim(
            self.stream, self.group, self.consumer, self.claim_idle_ms, start_id=self._claim_cursor, count=n
        )
        nxt, raw = resp[0], resp[1]
        deleted = resp[2] if len(resp) > 2 else []
        self._claim_cursor = nxt.decode() if isinstance(nxt, bytes) else str(nxt)
        for d in deleted:
            log.warning("pending entry %s was deleted from the stream before training", d)
        return self._decode(raw)

    def fetch(self, n: int, should_stop: Callable[[], bool]) -> list[Entry]:
        """Up to ``n`` entries: own pending first, then reclaimed, then new; blocks until ``n`` or stop."""
        got = self._read_own_pending(n)
        while len(got) < n and not should_stop():
            got.extend(self._claim(n - len(got)))
            if len(got) >= n:
                break
            resp = self.r.xreadgroup(
                self.group, self.consumer, {self.stream: ">"}, count=n - len(got), block=self.block_ms
            )
            if resp:
                got.extend(self._decode(resp[0][1]))
        return got

    def ack(self, entry_ids: list[str], also_set: tuple[str, str] | None = None) -> None:
        """XACK the entries; with ``also_set = (key, value)`` SET that key in the same MULTI/EXEC, so
        no reader sees the acknowledgement without the value (the trainer's info that goes with it)."""
        if not entry_ids and also_set is None:
            return
        pipe = self.r.pipeline(transaction=True)
        if entry_ids:
            pipe.xack(self.stream, self.group, *entry_ids)
            pipe.hdel(self.failures, *entry_ids)
        if also_set is not None:
            pipe.set(*also_set)
        pipe.execute()
        self.held.difference_update(entry_ids)

    def set_aside(self, entry: Entry, reason: str, error: str) -> str:
        """Move ``entry`` to the dead-letter stream (its bytes, why) and acknowledge it, in one
        MULTI/EXEC: a crash leaves it either pending here or set aside there, never lost. Returns the
        dead-letter entry's id."""
        pipe = self.r.pipeline(transaction=True)
        pipe.xadd(
            self.dead_letter_stream,
            {"entry": entry.entry_id, "reason": reason, "error": error[:2000], GROUP_FIELD: entry.raw or b""},
            maxlen=DEAD_LETTER_MAXLEN,
            approximate=True,
        )
        pipe.xack(self.stream, self.group, entry.entry_id)
        pipe.hdel(self.failures, entry.entry_id)
        dead_id = pipe.execute()[0]
        self.held.discard(entry.entry_id)
        return dead_id.decode() if isinstance(dead_id, bytes) else str(dead_id)

    def count_failure(self, entry_ids: list[str]) -> list[int]:
        """One more failed training step for each entry; returns each one's count so far (kept in Redis,
        so a crash loop ends: a restarted trainer sets an entry aside once it has failed enough)."""
        if not entry_ids:
            return []
        pipe = self.r.pipeline(transaction=True)
        for eid in entry_ids:
            pipe.hincrby(self.failures, eid, 1)
        return [int(n) for n in pipe.execute()]

    def release(self, entries: list[Entry]) -> None:
        """Forget entries fetched but not used (shutdown); they stay pending for the next run."""
        self.held.difference_update(e.entry_id for e in entries)

    def trim(self) -> int:
        """Delete the entries no consumer group still needs; returns how many went.

        Needed are, per group, its pending entries and those after its last-delivered id, so the
        stream is cut (``XTRIM MINID``, exact) below the smallest of: the oldest pending id, the id
        right after the last-delivered one. The last-delivered id is read *before* the pending
        summary: an entry delivered in between has a larger id than the one read, so it is never
        below the cut. No group: nothing is known to be consumed, nothing is trimmed.
        """
        try:
            groups = cast(list[dict[Any, Any]], self.r.xinfo_groups(self.stream))
        except redis.ResponseError as e:
            if "no such key" in str(e).lower():
                return 0
            raise
        cut: tuple[int, int] | None = None
        for g in groups:
            name = _text(g.get("name") or g.get(b"name"))
            need = _next_id(_parse_id(_text(g.get("last-delivered-id") or g.get(b"last-delivered-id"))))
            summary = cast(dict[str, Any], self.r.xpending(self.stream, name))
            if summary and int(summary.get("pending") or 0) > 0 and summary.get("min") is not None:
                need = min(need, _parse_id(_text(summary["min"])))
            cut = need if cut is None else min(cut, need)
        if cut is None:
            return 0
        return int(self.r.xtrim(self.stream, minid=f"{cut[0]}-{cut[1]}", approximate=False))

    def length(self) -> int:
        """Entries in the stream now."""
        return int(self.r.xlen(self.stream))

    def lag(self) -> int:
        """Entries in the stream not yet delivered to the group plus those pending (approximate)."""
        try:
            info = self.r.xinfo_groups(self.stream)
        except redis.ResponseError:
            return 0
        for g in info:
            name = g.get("name") or g.get(b"name")
            if (name.decode() if isinstance(name, bytes) else name) == self.group:
                lag = g.get("lag") or g.get(b"lag") or 0
                pending = g.get("pending") or g.get(b"pending") or 0
                return int(lag) + int(pending)
        return 0


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


_MAX_SEQ = 2**64 - 1


def _next_id(entry_id: tuple[int, int]) -> tuple[int, int]:
    """The smallest stream id greater than ``entry_id``."""
    ms, seq = entry_id
    return (ms + 1, 0) if seq == _MAX_SEQ else (ms, seq + 1)
