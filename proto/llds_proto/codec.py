"""Compact binary codec for trajectory groups on the Redis stream.

msgpack maps whose token arrays are raw little-endian bytes (int32 ids, float32 log-probs,
uint8 loss mask, int32 versions): ~5x smaller than JSON lists and decoded without a Python loop.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from llds_proto.messages import SCHEMA_VERSION, Trajectory, TrajectoryGroup

_ARRAYS: dict[str, str] = {
    "prompt_ids": "<i4",
    "response_ids": "<i4",
    "logprobs": "<f4",
    "loss_mask": "u1",
    "versions": "<i4",
}


class CodecError(ValueError):
    """Raised on bytes that are not a trajectory group this version understands."""


def _pack_trajectory(t: Trajectory) -> dict[str, Any]:
    d = t.model_dump(exclude=set(_ARRAYS))
    for name, dtype in _ARRAYS.items():
        d[name] = np.asarray(getattr(t, name), dtype=dtype).tobytes()
    d["action_spans"] = [list(s) for s in t.action_spans]
    d["answer_span"] = list(t.answer_span) if t.answer_span else None
    return d


def encode_group(group: TrajectoryGroup) -> bytes:
    """Serialise a group to bytes for ``XADD``."""
    d = group.model_dump(exclude={"trajectories"})
    d["trajectories"] = [_pack_trajectory(t) for t in group.trajectories]
    return msgpack.packb(d, use_bin_type=True)


def decode_group(data: bytes) -> TrajectoryGroup:
    """Parse bytes written by :func:`encode_group`; raises :class:`CodecError` on anything else."""
    try:
        d = msgpack.unpackb(data, raw=False)
    except Exception as e:  # untrusted bytes: unhashable map keys raise TypeError, deep nesting others
        raise CodecError(f"not a msgpack trajectory group: {e}") from e
    if not isinstance(d, dict) or "trajectories" not in d:
        raise CodecError("not a trajectory group: missing 'trajectories'")
    if d.get("schema_version") != SCHEMA_VERSION:
        raise CodecError(f"schema_version {d.get('schema_version')!r} != {SCHEMA_VERSION}")
    if not isinstance(d["trajectories"], list):
        raise CodecError(f"not a trajectory group: 'trajectories' is a {type(d['trajectories']).__name__}")
    trajs = []
    for i, t in enumerate(d["trajectories"]):
        # Any shape msgpack can carry may arrive here: every failure is this codec's error.
        try:
            if not isinstance(t, dict):
                raise TypeError(f"a {type(t).__name__}, not a map")
            for name, dtype in _ARRAYS.items():
                if not isinstance(t.get(name), bytes):
                    raise TypeError(f"{name!r} is not raw bytes")
                t[name] = np.frombuffer(t[name], dtype=dtype).tolist()
            t["action_spans"] = [tuple(s) for s in t.get("action_spans") or []]
            t["answer_span"] = tuple(t["answer_span"]) if t.get("answer_span") else None
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise CodecError(f"invalid trajectory {i}: {e}") from e
        trajs.append(t)
    d["trajectories"] = trajs
    try:
        return TrajectoryGroup.model_validate(d)
    except ValueError as e:
        raise CodecError(f"invalid trajectory group: {e}") from e
