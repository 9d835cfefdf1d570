"""The version lineage (orphaned versions, restart aliases, lineage distance) on hand-computed cases."""

from __future__ import annotations

import json

import pytest

from llds_trainer.core import TrainState
from llds_trainer.lineage import Lineage, LineageError


def test_without_restarts_distance_is_the_version_difference() -> None:
    lin = Lineage()
    assert lin.distance(2, 5) == 3  # 3, 4, 5
    assert lin.distance(5, 5) == 0
    assert lin.distance(0, 3) == 3
    assert lin.distance(-1, 3) == 3  # version 0 is the initial model, not an update
    assert lin.distance(6, 5) == 0  # ahead of the trainer: no updates in between
    assert all(lin.is_real(v) for v in (1, 2, 3)) and not lin.is_real(0)


def test_nothing_lost_means_no_new_version() -> None:
    lin = Lineage()
    assert lin.restart(3, 3) == (3, None)  # published what the checkpoint holds: republish 3
    assert lin.restart(3, 2) == (3, None)  # crash between checkpoint and publish: publish 3 now
    assert lin.restart(0, 0) == (0, None)
    assert lin.orphaned == [] and lin.aliases == []


def test_restart_behind_published_orphans_and_aliases() -> None:
    lin = Lineage()
    # Checkpoint at version 3; versions 4 and 5 were published after it and are lost.
    assert lin.restart(3, 5) == (6, (4, 5))
    assert lin.orphaned == [(4, 5)] and lin.aliases == [6]
    assert [lin.is_orphaned(v) for v in (3, 4, 5, 6)] == [False, True, True, False]
    assert [lin.is_real(v) for v in (3, 4, 5, 6)] == [True, False, False, False]
    assert lin.distance(3, 6) == 0  # 4, 5 orphaned, 6 = version 3's lineage republished
    assert lin.distance(2, 6) == 1  # 3
    # Two more published steps: 7 and 8 are real.
    assert lin.distance(3, 8) == 2  # 7, 8
    assert lin.distance(6, 8) == 2
    assert lin.distance(2, 8) == 3  # 3, 7, 8
    assert lin.any_orphaned([3, 5]) and not lin.any_orphaned([3, 6, 7])


def test_second_restart_and_pruning() -> None:
    lin = Lineage()
    lin.restart(3, 5)  # orphans 4..5, alias 6
    # Later: checkpoint at version 8 (7, 8 real), 9 and 10 published and lost.
    assert lin.restart(8, 10) == (11, (9, 10))
    assert lin.orphaned == [(4, 5), (9, 10)] and lin.aliases == [6, 11]
    assert lin.distance(2, 11) == 3  # 3, 7, 8
    assert lin.distance(8, 11) == 0
    before = {mv: lin.distance(mv, 11) for mv in range(0, 12)}
    # k = 1: the 2nd newest real update is 7; a group sampled before 7 is stale either way.
    lin.prune(11, staleness_k=1)
    assert lin.orphaned == [(9, 10)] and lin.aliases == [11]
    after = {mv: lin.distance(mv, 11) for mv in range(0, 12)}
    assert {mv: d for mv, d in after.items() if mv >= 7} == {mv: d for mv, d in before.items() if mv >= 7}
    assert all(after[mv] > 1 and before[mv] > 1 for mv in range(0, 7))
    # Too few real updates to prune anything.
    short = Lineage()
    short.restart(0, 2)
    short.prune(3, staleness_k=5)
    assert short.orphaned == [(1, 2)] and short.aliases == [3]


def test_state_round_trips_and_rejects_nonsense() -> None:
    lin = Lineage()
    lin.restart(3, 5)
    back = Lineage.from_state(json.loads(json.dumps(lin.state_dict())))
    assert back == lin
    assert Lineage.from_state(None) == Lineage()
    with pytest.raises(LineageError):
        Lineage.from_state({"orphaned": [[4, 6], [5, 7]], "aliases": []})
    with pytest.raises(LineageError):
        Lineage.from_state({"orphaned": [], "aliases": [7, 7]})


def test_consumed_window_forgets_old_steps_only() -> None:
    st = TrainState(window=2)
    st.add_consumed(1, ["a", "b"])
    st.add_consumed(2, ["c"])
    st.add_consumed(3, ["d", "e"])
    assert st.consumed == ["c", "d", "e"] and st.consumed_set == {"c", "d", "e"}
    assert st.consumed_total == 5
    d = json.loads(json.dumps(st.state_dict()))
    assert d["consumed"] == ["c", "d", "e"] and d["consumed_steps"] == [[2, 1], [3, 2]]
    back = TrainState.from_state(d, window=2)
    assert back.consumed == st.consumed and back.consumed_set == st.consumed_set
    assert back.consumed_total == 5
    # A smaller window on resume keeps the newest steps.
    assert TrainState.from_state(d, window=1).consumed == ["d", "e"]
    # Checkpoints written before the window layout: all their ids form one step.
    old = TrainState.from_state({"step": 4, "version": 4, "consumed": ["x", "y"]}, window=3)
    assert old.consumed == ["x", "y"] and old.consumed_total == 2 and old.lineage == Lineage()
