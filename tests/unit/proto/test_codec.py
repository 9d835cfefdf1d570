"""Trajectory groups round-trip through the binary codec, compactly, and garbage is rejected."""

import json

import msgpack
import numpy as np
import pytest

from llds_proto.codec import CodecError, decode_group, encode_group
from llds_proto.messages import Trajectory, TrajectoryGroup


def _group(n_tokens: int = 300, g: int = 3) -> TrajectoryGroup:
    rng = np.random.default_rng(0)
    trajs = []
    for i in range(g):
        mask = [1] * 100 + [0] * 50 + [1] * (n_tokens - 150)
        trajs.append(
            Trajectory(
                trajectory_id=f"g:{i}",
                sample_index=i,
                prompt_ids=rng.integers(0, 49152, 40).tolist(),
                response_ids=rng.integers(0, 49152, n_tokens).tolist(),
                logprobs=[
                    float(np.float32(x)) if m else 0.0
                    for x, m in zip(-rng.random(n_tokens), mask, strict=False)
                ],
                loss_mask=mask,
                versions=[3 if m else -1 for m in mask],
                action_spans=[(0, 100), (150, n_tokens)],
                answer_span=(n_tokens - 10, n_tokens),
                reward=float(i == 0),
                exact_match=float(i == 0),
                num_valid_searches=1,
                num_turns=2,
                answer="Paris",
                timings={"total": 1.5},
            )
        )
    return TrajectoryGroup(
        group_id="synthworld:7:0", prompt_id="synthworld:7", question="q?", gold_answers=["Paris"],
        trajectories=trajs, created_at=1.0, producer="r0",
    )  # fmt: skip


def test_round_trip_is_exact() -> None:
    g = _group()
    assert decode_group(encode_group(g)) == g


def test_binary_is_much_smaller_than_json() -> None:
    g = _group()
    assert len(encode_group(g)) * 2 < len(json.dumps(g.model_dump()))


def test_min_version_ignores_observation_tokens() -> None:
    assert _group().min_version == 3


@pytest.mark.parametrize("data", [b"", b"\x00\x01garbage", msgpack.packb({"a": 1}), msgpack.packb([1, 2])])
def test_garbage_is_rejected_with_codec_error(data: bytes) -> None:
    with pytest.raises(CodecError):
        decode_group(data)


def test_wrong_schema_version_is_rejected() -> None:
    d = msgpack.unpackb(encode_group(_group()), raw=False)
    d["schema_version"] = 99
    with pytest.raises(CodecError, match="schema_version"):
        decode_group(msgpack.packb(d, use_bin_type=True))


def test_misaligned_arrays_are_rejected() -> None:
    d = msgpack.unpackb(encode_group(_group()), raw=False)
    d["trajectories"][0]["loss_mask"] = d["trajectories"][0]["loss_mask"][:-1]
    with pytest.raises(CodecError, match="loss_mask"):
        decode_group(msgpack.packb(d, use_bin_type=True))


def _with(path: tuple[object, ...], value: object) -> bytes:
    """The test group's payload with the item at ``path`` (keys and list indexes) replaced."""
    d = msgpack.unpackb(encode_group(_group()), raw=False)
    node = d
    for k in path[:-1]:
        node = node[k]  # type: ignore[index]
    node[path[-1]] = value  # type: ignore[index]
    return msgpack.packb(d, use_bin_type=True)


@pytest.mark.parametrize(
    "data",
    [
        msgpack.packb({"trajectories": 1, "schema_version": 1}),
        _with(("trajectories",), {"a": 1}),
        _with(("trajectories",), [1, "x"]),
        _with(("trajectories", 0, "prompt_ids"), [1, 2, 3]),  # a list, not raw bytes
        _with(("trajectories", 0, "response_ids"), b"\x01\x02\x03"),  # not a whole number of int32s
        _with(("trajectories", 0, "action_spans"), 5),
        _with(("trajectories", 0, "answer_span"), 7),
        _with(("trajectories", 0, "reward"), "high"),
        _with(("group_id",), ["x"]),
        b"\x81\x91\x01\x01",  # a map whose key is a list: unhashable in Python
    ],
)
def test_every_wrongly_shaped_payload_is_the_codecs_error(data: bytes) -> None:
    """msgpack that decodes to the wrong shape (what a buggy or hostile producer can XADD) raises
    CodecError, never a TypeError or KeyError that would stop the trainer."""
    d = msgpack.unpackb(data, raw=False, strict_map_key=False) if data[:1] != b"\x81" else None
    assert d is None or d != msgpack.unpackb(encode_group(_group()), raw=False)
    with pytest.raises(CodecError):
        decode_group(data)
