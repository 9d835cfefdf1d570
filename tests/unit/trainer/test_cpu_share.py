"""The trainer leaves a sampling rollout its cores: threads follow the run's in-flight groups in Redis."""

from __future__ import annotations

import json

import fakeredis
import pytest
import torch

from llds_proto.streams import RunKeys
from llds_trainer.service import CPUShare


@pytest.fixture()
def threads() -> object:
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_threads_follow_the_rollouts_in_flight_groups(threads: object) -> None:
    r = fakeredis.FakeRedis()
    key = RunKeys("run-a").in_flight
    share = CPUShare(r, key, busy=1, idle=2, every_s=0.0)
    share()
    assert not share.sampling and torch.get_num_threads() == 2  # nobody sampling
    now = float(r.time()[0])
    r.hset(key, "rollout", json.dumps({"groups": 2, "deciding": 0, "oldest_version": 0, "at": now}))
    share()
    assert share.sampling and torch.get_num_threads() == 1
    r.hset(key, "rollout", json.dumps({"groups": 0, "deciding": 0, "oldest_version": None, "at": now}))
    share()
    assert not share.sampling and torch.get_num_threads() == 2
    # A replica that died with groups in flight stops counting once its entry is stale.
    r.hset(key, "gone", json.dumps({"groups": 3, "at": now - 60}))
    share()
    assert not share.sampling
    # Another run's replicas are another key.
    r.hset(RunKeys("run-b").in_flight, "rollout", json.dumps({"groups": 1, "at": now}))
    share()
    assert not share.sampling


def test_the_hash_is_read_at_most_every_interval(threads: object) -> None:
    r = fakeredis.FakeRedis()
    key = RunKeys("run-a").in_flight
    share = CPUShare(r, key, busy=1, idle=2, every_s=3600.0)
    share()
    r.hset(key, "rollout", json.dumps({"groups": 2, "at": float(r.time()[0])}))
    share()
    assert not share.sampling  # not read again within the interval


def test_wait_mode_takes_turns_with_the_rollout_and_gives_up_after_the_limit(threads: object) -> None:
    import threading
    import time

    r = fakeredis.FakeRedis()
    key = RunKeys("run-a").in_flight
    r.hset(key, "rollout", json.dumps({"groups": 1, "at": float(r.time()[0])}))
    share = CPUShare(r, key, busy=0, idle=2, every_s=0.05, max_wait_s=30.0)
    threading.Timer(
        0.4, lambda: r.hset(key, "rollout", json.dumps({"groups": 0, "at": float(r.time()[0])}))
    ).start()
    t = time.monotonic()
    share()  # returns once the replica has nothing in flight
    assert 0.3 < time.monotonic() - t < 5.0 and 0.3 < share.waited_s and not share.sampling
    assert torch.get_num_threads() == 2
    r.hset(key, "rollout", json.dumps({"groups": 1, "at": float(r.time()[0])}))
    stuck = CPUShare(r, key, busy=0, idle=2, every_s=0.05, max_wait_s=0.3)
    t = time.monotonic()
    stuck()  # a rollout that never stops: the forward runs anyway after the limit
    assert 0.3 <= time.monotonic() - t < 3.0 and stuck.sampling
