"""kill -9 of the trainer at random times, 12 times over one run, audited from Redis and the disk.

The test produces every group into the stream itself and remembers their group and entry ids. It
starts the real trainer CLI (publish every step, checkpoint every second step, so restarts orphan
versions) and SIGKILLs it from outside: a third of the kills at a random time after the start
(imports, resume, republish or training), a third the moment a checkpoint temp folder
(``.step_*``) appears and a third the moment a weights temp folder (``.v*``) appears, so some land
inside checkpoint writes and weight publishing. After each kill it restarts the trainer (raising the
target step and producing more groups whenever fewer than MARGIN steps are left, so no incarnation
can finish before its kill); after the last, the trainer runs to the end. Then, not trusting the trainer's logs:

- the stream: every entry was delivered, none is pending, all are trimmed away;
- the final checkpoint's bytes: its consumed ids are exactly the produced ids, each once; AdamW's
  step count in ``optimizer.pt`` is steps x updates per step (no step trained twice or lost);
- the versions: every number ever handed out is a real update, an orphan or a restart alias, the
  newest is the one in Redis, and only ``keep_versions`` folders and no temp folders are left.

The second test is a run as the presets configure it (a checkpoint at every publish, staleness bound
1) with groups produced live, each sampled by the version Redis names at that moment, through 9
kills: no version is orphaned and no group dropped (with a checkpoint every third step instead,
groups of orphaned versions are dropped and it fails).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import torch
from test_trainer_service import push, start_trainer

from llds_proto import streams
from llds_server.http import free_port
from llds_trainer.publish import MARKER
from llds_trainer.synthetic import synthetic_groups

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 24
"""Initial target of the run (2 groups per step); raised as the run progresses, see MARGIN."""
MARGIN = 16
"""Steps each incarnation has left at least (the target and the produced groups grow to keep it), so
every kill lands in a running trainer however fast this machine trains."""
KILLS = 12
UPDATES = 2
"""Optimizer updates per step (``minibatches_per_step``)."""
KEEP_VERSIONS = 3


def _watch_and_kill(
    proc: Any, kind: str, nth: int, delay_s: float, run: Path, weights: Path
) -> tuple[str, bool]:
    """SIGKILL ``proc`` as ``kind`` says; returns what triggered it and whether it hit a temp folder."""
    folder, prefix = (run / "checkpoints", ".step_") if kind == "checkpoint" else (weights, ".v")
    seen: set[str] = set()
    t0 = time.monotonic()
    while proc.poll() is None:
        hit = None
        if kind == "random":
            if time.monotonic() - t0 >= delay_s:
                hit = ""
        else:
            try:
                names = os.listdir(folder)
            except FileNotFoundError:
                names = []
            for n in names:
                if n.startswith(prefix) and n not in seen:
                    seen.add(n)
                    if len(seen) >= nth:
                        hit = n
        if hit is None and time.monotonic() - t0 > 40:
            kind, hit = "timeout", ""
        if hit is not None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            # The temp folder still there means the kill landed inside that write (it is renamed at the end).
            return kind, bool(hit) and (folder / hit).exists()
        time.sleep(0.002)
    return "exited", False


def _kill_one_incarnation(
    i: int, target: int, extra: list[str], rng: random.Random, model: Path, redis_url: str, tmp: Path
) -> tuple[str, bool]:
    """Start the trainer for ``target`` steps and SIGKILL it as kill ``i``'s kind says (random time,
    inside a checkpoint write, inside a publish); it must die of that kill."""
    kind = ("random", "checkpoint", "publish")[i % 3]
    proc = start_trainer(model, redis_url, tmp, steps=target, port=free_port(), extra=extra)
    try:
        outcome = _watch_and_kill(
            proc, kind, rng.randint(1, 2), rng.uniform(2.0, 11.0), tmp / "run", tmp / "weights"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -9, (
        f"kill {i} ({kind}): exit {proc.returncode}\n" + (tmp / "trainer.log").read_text()[-3000:]
    )
    return outcome


def test_random_kill9_loses_nothing_and_trains_nothing_twice(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path, tokenizer: Any
) -> None:
    r = redis.Redis.from_url(redis_url)
    keys = streams.DEFAULT_KEYS
    target = STEPS
    groups = synthetic_groups(tokenizer, 2 * target, 2, seed=9, think_words=2, doc_words=4)
    entry_ids = push(r, groups)
    run, weights = tmp_path / "run", tmp_path / "weights"
    extra = ["--set", "publish_every=1", "--set", "checkpoint_every=2", "--set", "staleness_k=1000",
             "--set", f"minibatches_per_step={UPDATES}", "--set", "consumed_window_steps=100",
             "--set", f"keep_versions={KEEP_VERSIONS}", "--set", "lld.probe=false"]  # fmt: skip
    rng = random.Random(20261201)
    outcomes: list[tuple[str, bool]] = []
    for i in range(KILLS):
        done = max((int(p.name[5:]) for p in run.glob("checkpoints/step_*")), default=0)
        if target - done < MARGIN:
            more = synthetic_groups(tokenizer, 2 * MARGIN, 2, seed=9 + i, think_words=2, doc_words=4,
                                    start_index=len(groups))  # fmt: skip
            groups += more
            entry_ids += push(r, more)
            target += MARGIN
        outcomes.append(_kill_one_incarnation(i, target, extra, rng, tiny_model_dir, redis_url, tmp_path))
    proc = start_trainer(tiny_model_dir, redis_url, tmp_path, steps=target, port=free_port(), extra=extra)
    assert proc.wait(240) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    print("kills:", outcomes, "steps:", target)
    assert sum(1 for k, inside in outcomes if k == "checkpoint" and inside) >= 3, outcomes
    assert sum(1 for k, inside in outcomes if k == "publish" and inside) >= 3, outcomes

    # The stream: everything delivered, nothing pending, everything trimmed.
    (group_info,) = r.xinfo_groups(keys.stream)
    assert group_info["last-delivered-id"].decode() == entry_ids[-1]
    assert r.xpending(keys.stream, streams.TRAINER_GROUP)["pending"] == 0
    assert r.xlen(keys.stream) == 0

    # The final checkpoint's bytes.
    cps = sorted(p for p in (run / "checkpoints").iterdir())
    assert [p.name for p in cps][-1] == f"step_{target:08d}" and not any(p.name.startswith(".") for p in cps)
    state = json.loads((cps[-1] / "state.json").read_text())
    consumed = state["consumed"]
    assert len(consumed) == len(set(consumed)) == len(groups) == state["consumed_total"]  # nothing twice
    assert sorted(consumed) == sorted(g.group_id for g in groups)  # nothing lost
    opt = torch.load(cps[-1] / "optimizer.pt", weights_only=True)
    assert {int(s["step"]) for s in opt["state"].values()} == {target * UPDATES}
    records = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in records] == list(range(1, target + 1))

    # Versions: real updates (one per step) + orphans + aliases account for every number handed out.
    lineage = state["lineage"]
    orphaned = sum(hi - lo + 1 for lo, hi in lineage["orphaned"])
    assert state["version"] == target + orphaned + len(lineage["aliases"]), lineage
    assert int(r.get(keys.trainer_version)) == state["version"]
    kept = sorted(p.name for p in weights.iterdir())
    assert kept == [f"v{v:06d}" for v in range(state["version"] - KEEP_VERSIONS + 1, state["version"] + 1)]
    assert all(json.loads((weights / k / MARKER).read_text())["version"] == int(k[1:]) for k in kept)


LIVE_KILLS = 9


class _Producer:
    """A rollout's part, from outside: whenever the trainer has been delivered every entry, two more
    groups sampled by the version Redis names now (as a replica tags what it samples); remembers
    each group's id, entry id and version."""

    def __init__(self, r: redis.Redis, tokenizer: Any) -> None:
        self.r, self.tokenizer = r, tokenizer
        self.keys = streams.DEFAULT_KEYS
        self.made: list[tuple[str, str, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _delivered_all(self) -> bool:
        if not self.made:
            return True
        (info,) = self.r.xinfo_groups(self.keys.stream)
        last = info["last-delivered-id"].decode()
        return tuple(map(int, last.split("-"))) >= tuple(map(int, self.made[-1][1].split("-")))

    def _run(self) -> None:
        while not self.stop.is_set():
            if self._delivered_all():
                v = int(self.r.get(self.keys.trainer_version) or 0)
                more = synthetic_groups(self.tokenizer, 2, 2, seed=len(self.made), version=v, think_words=2,
                                        doc_words=4, start_index=len(self.made))  # fmt: skip
                for g, eid in zip(more, push(self.r, more), strict=True):
                    self.made.append((g.group_id, eid, v))
            time.sleep(0.01)


def test_random_kill9_with_a_live_producer_drops_no_group(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path, tokenizer: Any
) -> None:
    """Issue 30: groups sampled by versions > 0 as the run goes, a realistic staleness bound (1) and
    a checkpoint at every publish (every preset's setting): no version is orphaned by the kills, so
    no group is dropped; every group produced is trained exactly once, audited from the stream's
    entry ids, the produced groups and the final checkpoint's bytes."""
    r = redis.Redis.from_url(redis_url)
    keys = streams.DEFAULT_KEYS
    r.xgroup_create(keys.stream, streams.TRAINER_GROUP, id="0", mkstream=True)
    producer = _Producer(r, tokenizer)
    producer.thread.start()
    run = tmp_path / "run"
    extra = ["--set", "publish_every=1", "--set", "checkpoint_every=1", "--set", "staleness_k=1",
             "--set", f"minibatches_per_step={UPDATES}", "--set", "lld.probe=false"]  # fmt: skip
    rng = random.Random(20261204)
    target, outcomes = STEPS, []
    try:
        for i in range(LIVE_KILLS):
            done = max((int(p.name[5:]) for p in run.glob("checkpoints/step_*")), default=0)
            if target - done < MARGIN:
                target += MARGIN
            outcomes.append(_kill_one_incarnation(i, target, extra, rng, tiny_model_dir, redis_url, tmp_path))
        proc = start_trainer(tiny_model_dir, redis_url, tmp_path, steps=target, port=free_port(), extra=extra)
        assert proc.wait(240) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    finally:
        producer.stop.set()
        producer.thread.join(10)
    print("kills:", outcomes, "steps:", target)

    state = json.loads(sorted((run / "checkpoints").iterdir())[-1].joinpath("state.json").read_text())
    consumed = state["consumed"]
    assert len(consumed) == len(set(consumed)) == 2 * target  # nothing twice
    versions = {gid: v for gid, _, v in producer.made}
    # What the producer made after the trainer's last read is still in the stream, undelivered.
    (info,) = r.xinfo_groups(keys.stream)
    last = tuple(map(int, info["last-delivered-id"].decode().split("-")))
    delivered = [gid for gid, eid, _ in producer.made if tuple(map(int, eid.split("-"))) <= last]
    dropped = sorted(set(delivered) - set(consumed))
    assert not dropped, f"dropped: {[(g, versions[g]) for g in dropped]}"
    assert sorted(consumed) == sorted(delivered)
    assert r.xpending(keys.stream, streams.TRAINER_GROUP)["pending"] == 0
    # Sampled by versions > 0, up to the end; no version orphaned, none aliased: one per step.
    assert max(versions[g] for g in consumed) >= target - 2
    assert len({versions[g] for g in consumed}) >= target - 2
    assert state["lineage"] == {"orphaned": [], "aliases": []} and state["version"] == target
    assert int(r.get(keys.trainer_version)) == target
