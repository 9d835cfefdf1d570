"""The run's data order, shared by every replica and kept in Redis: each prompt of it is sampled by one
replica, and ends in the trajectory stream or in the drop record, whatever dies on the way.

A *position* p names the p-th prompt of the run's data order (epoch ``p // n``, row ``order(epoch)[p
% n]``: :class:`llds_rollout.dataset.DataOrder`). A replica *claims* a position before it samples its
group: a dead claim (its lease not renewed for ``lease_s``: the replica died, froze or lost Redis)
first, else the next one off the run's cursor. The claim ends in exactly one of

- **pushed**: the group's stream entry is added and the claim removed in one script, only while the
  claim is still this replica's (a replica that was presumed dead and comes back pushes nothing: its
  position was taken over, and ``lost`` counts it);
- **dropped**: a record in ``data:dropped`` (position, prompt, group, why) and the claim removed in one
  script (a group too stale to train, a prompt that failed ``max_attempts`` times);
- **released**: a group that failed (retriever or engine errors) gives its position back at once, for
  any replica to sample again, its attempts counted.

So the positions below the cursor are, at any moment, each in the stream, in the drop record, or
claimed, and a position reaches the stream at most once. A restarted rollout goes on from the cursor
(``llds up --resume`` keeps Redis), and replicas share one order instead of each walking all of it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis.asyncio as aioredis

from llds_proto.streams import DATA_DROPPED_MAXLEN, RunKeys

log = logging.getLogger("llds.rollout.cursor")

# A claim's value: "<owner>\t<lease start, Redis time>\t<attempts before this one>". Every script starts
# with these two functions: one reading of the value, one ownership check.
_COMMON = """
local function parse(v)
  return string.match(v, '^(.-)\\t([^\\t]*)\\t([^\\t]*)$')
end
local function owned(claims, p, owner)
  local v = redis.call('HGET', claims, p)
  if not v then return nil end
  local who, t, n = parse(v)
  if who ~= owner then return nil end
  return n
end
"""

_CLAIM = (
    _COMMON
    + """
local claims, cursor = KEYS[1], KEYS[2]
local owner, now, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local all = redis.call('HGETALL', claims)
local best, best_who, best_n = nil, nil, nil
for i = 1, #all, 2 do
  local who, t, n = parse(all[i + 1])
  t = tonumber(t)
  -- (not this owner's own: it is alive, it is claiming; its late renewal is not a death)
  if t ~= nil and who ~= owner and t + lease < now and (best == nil or tonumber(all[i]) < tonumber(best)) then
    best, best_who, best_n = all[i], who, n
  end
end
if best ~= nil then
  redis.call('HSET', claims, best, owner .. '\\t' .. ARGV[2] .. '\\t' .. best_n)
  return {best, best_who, best_n}
end
local p = redis.call('INCR', cursor) - 1
redis.call('HSET', claims, p, owner .. '\\t' .. ARGV[2] .. '\\t0')
return {tostring(p), '', '0'}
"""
)

_RENEW = (
    _COMMON
    + """
local claims, owner, now = KEYS[1], ARGV[1], ARGV[2]
local kept = 0
for i = 3, #ARGV do
  local n = owned(claims, ARGV[i], owner)
  if n ~= nil then
    redis.call('HSET', claims, ARGV[i], owner .. '\\t' .. now .. '\\t' .. n)
    kept = kept + 1
  end
end
return kept
"""
)

_PUSH = (
    _COMMON
    + """
local claims, stream = KEYS[1], KEYS[2]
local p, owner = ARGV[1], ARGV[2]
if owned(claims, p, owner) == nil then return false end
local id = redis.call('XADD', stream, '*', ARGV[3], ARGV[4])
redis.call('HDEL', claims, p)
return id
"""
)

_DROP = (
    _COMMON
    + """
local claims, dropped = KEYS[1], KEYS[2]
local p, owner = ARGV[1], ARGV[2]
if owned(claims, p, owner) == nil then return false end
local id = redis.call('XADD', dropped, 'MAXLEN', '~', ARGV[3], '*', 'position', p, 'prompt_id', ARGV[4],
                      'group_id', ARGV[5], 'why', ARGV[6], 'producer', owner)
redis.call('HDEL', claims, p)
return id
"""
)

_RELEASE = (
    _COMMON
    + """
local claims = KEYS[1]
local p, owner = ARGV[1], ARGV[2]
local n = owned(claims, p, owner)
if n == nil then return false end
local n2 = tonumber(n) + tonumber(ARGV[3])
redis.call('HSET', claims, p, 'released\\t0\\t' .. tostring(n2))
return n2
"""
)


@dataclass(frozen=True)
class Claim:
    position: int
    attempts: int
    """Earlier attempts at this position that failed and released it (0: a fresh one)."""
    retaken_from: str = ""
    """The owner whose lease ran out ("released": a failed attempt's), empty for a fresh position."""


class DataCursor:
    """One replica's handle on the run's shared data order (see the module docstring)."""

    def __init__(self, redis: aioredis.Redis, keys: RunKeys, owner: str, lease_s: float) -> None:
        if "\t" in owner:
            raise ValueError(f"cursor owner {owner!r} has a tab")
        self.redis = redis
        self.keys = keys
        self.owner = owner
        self.lease_s = lease_s
        self._claim = redis.register_script(_CLAIM)
        self._renew = redis.register_script(_RENEW)
        self._push = redis.register_script(_PUSH)
        self._drop = redis.register_script(_DROP)
        self._release = redis.register_script(_RELEASE)

    async def _now(self) -> str:
        sec, usec = await self.redis.time()
        return f"{sec + usec / 1e6:.6f}"

    async def claim(self) -> Claim:
        """The next position this replica samples: a dead claim's first, else a new one."""
        p, who, n = await self._claim(
            keys=[self.keys.data_claims, self.keys.data_cursor],
            args=[self.owner, await self._now(), self.lease_s],
        )
        who = who.decode() if isinstance(who, bytes) else str(who)
        return Claim(int(p), int(n), who)

    async def renew(self, positions: list[int]) -> int:
        """Extend this replica's leases on ``positions``; returns how many are still its own."""
        if not positions:
            return 0
        return int(
            await self._renew(keys=[self.keys.data_claims], args=[self.owner, await self._now(), *positions])
        )

    async def push(self, position: int, field: str, data: bytes) -> str | None:
        """Add the group's entry to the stream and end the claim, atomically; None (nothing added) when
        the claim is no longer this replica's."""
        got = await self._push(
            keys=[self.keys.data_claims, self.keys.stream], args=[position, self.owner, field, data]
        )
        if not got:
            return None
        return got.decode() if isinstance(got, bytes) else str(got)

    async def drop(self, position: int, prompt_id: str, group_id: str, why: str) -> bool:
        """Record the position as dropped (``why``) and end the claim, atomically; False when the claim
        is no longer this replica's (nothing recorded)."""
        got = await self._drop(
            keys=[self.keys.data_claims, self.keys.data_dropped],
            args=[position, self.owner, DATA_DROPPED_MAXLEN, prompt_id, group_id, why],
        )
        return bool(got)

    async def release(self, position: int, failed: bool = True) -> int | None:
        """Give the position back for any replica to claim at once: a failed attempt's (counted), or
        one this replica stops before sampling it (``failed=False``: a shutdown). Returns its failed
        attempts so far (None: the claim was no longer this replica's)."""
        got = await self._release(keys=[self.keys.data_claims], args=[position, self.owner, int(failed)])
        return None if got is None or got is False else int(got)
