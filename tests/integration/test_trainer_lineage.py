"""Independent publish / checkpoint cadences and the version lineage across a restart, end to end:
real Valkey, the trainer CLI as a child process, a fake rollout replica, groups of a named run.

A run publishes every step and checkpoints every third; it is killed right after publishing step 5,
so the restart comes back to the step-3 checkpoint (version 3) while versions 4 and 5 are out. It must
orphan 4 and 5, republish its restored weights as version 6, drop groups sampled by 4, and go on
with 7, 8, 9: no version number is ever handed out twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from test_trainer_service import fake_rollout_server, push, start_trainer

from llds_proto import streams
from llds_proto.messages import TrainerInfo
from llds_server.http import free_port
from llds_trainer.publish import MARKER
from llds_trainer.synthetic import synthetic_groups

pytestmark = [pytest.mark.integration, pytest.mark.slow]
RUN = "cadence-run"


@pytest.fixture()
def replica() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    with fake_rollout_server() as r:
        yield r


def _log(tmp: Path) -> str:
    return (tmp / "trainer.log").read_text()[-4000:]


def test_publish_every_step_checkpoint_every_third_and_restart_orphans_lost_versions(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path, tokenizer: Any, replica: Any
) -> None:
    url, notices = replica
    keys = streams.RunKeys(RUN)
    r = redis.Redis.from_url(redis_url)
    r.hset(keys.registry, "replica-0", url)
    groups = [
        g.model_copy(update={"run_id": RUN})
        for g in synthetic_groups(tokenizer, 12, 2, seed=3, think_words=2, doc_words=4)
    ]
    # Another run's group in this run's stream, and a group "sampled" by a version nobody published.
    foreign = synthetic_groups(tokenizer, 1, 2, seed=4, start_index=50)[0].model_copy(
        update={"run_id": "other-run"}
    )
    ahead = synthetic_groups(tokenizer, 1, 2, seed=5, start_index=60, version=50)[0]
    push(r, [foreign, ahead], keys)
    entry_ids = push(r, groups[:10], keys)
    assert len(entry_ids) == 10
    extra = ["--set", f"run_id={RUN}", "--set", "publish_every=1", "--set", "checkpoint_every=3",
             "--set", "keep_versions=20", "--set", "keep_checkpoints=20", "--set", "staleness_k=100",
             "--notify-url", url]  # fmt: skip

    proc = start_trainer(tiny_model_dir, redis_url, tmp_path, steps=6, port=free_port(), extra=extra,
                         env={"LLDS_TRAINER_FAILPOINT": "after_publish:5"})  # fmt: skip
    assert proc.wait(180) == -9, _log(tmp_path)
    run, weights = tmp_path / "run", tmp_path / "weights"
    # Published every step, checkpointed only at step 3.
    assert sorted(p.name for p in weights.iterdir()) == [f"v{v:06d}" for v in range(1, 6)]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_00000003"]
    assert r.get(keys.trainer_version) == b"5"
    assert r.get(streams.DEFAULT_KEYS.trainer_version) is None  # nothing outside the run's keys
    info = TrainerInfo.model_validate_json(r.get(keys.trainer_info))
    assert (info.run_id, info.version, info.step, info.publish_every, info.trained_unacked) == (
        RUN,
        4,
        4,
        1,
        2,
    )
    # Steps 4 and 5 are trained but not checkpointed: their 4 entries are still pending, nothing trimmed
    # beyond the acknowledged ones (the 2 dropped and the 6 of steps 1-3).
    assert r.xpending(keys.stream, streams.TRAINER_GROUP)["pending"] == 4
    assert r.xlen(keys.stream) == 4
    assert "foreign" in _log(tmp_path) and "ahead" in _log(tmp_path)

    orphan_sample = synthetic_groups(tokenizer, 1, 2, seed=6, start_index=70, version=4)[0]
    push(r, [orphan_sample, *groups[10:]], keys)
    proc = start_trainer(tiny_model_dir, redis_url, tmp_path, steps=6, port=free_port(), extra=extra)
    assert proc.wait(180) == 0, _log(tmp_path)
    log = _log(tmp_path)
    assert "versions 4..5 orphaned" in log and "(synthetic:70:0): orphaned" in log

    state = json.loads((run / "checkpoints" / "step_00000006" / "state.json").read_text())
    assert state["step"] == 6 and state["version"] == 9
    assert state["lineage"] == {"orphaned": [[4, 5]], "aliases": [6]}
    assert state["consumed"] == [g.group_id for g in groups] and state["consumed_total"] == 12
    markers = {p.name: json.loads((p / MARKER).read_text()) for p in sorted(weights.iterdir())}
    # Version 6 is the step-3 checkpoint's weights republished; 7, 8, 9 are steps 4, 5, 6 retrained.
    assert [(m["version"], m["step"]) for m in markers.values()] == [
        (1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 3), (7, 4), (8, 5), (9, 6)
    ]  # fmt: skip
    from safetensors.torch import load_file

    ckpt3 = load_file(str(run / "checkpoints" / "step_00000003" / "model.safetensors"))
    alias = load_file(str(weights / "v000006" / "model.safetensors"))
    common = set(ckpt3) & set(alias)
    assert len(common) >= len(alias) - 1 and all(ckpt3[k].equal(alias[k]) for k in common)
    # Each start republishes and notifies: 1..5, then 6 on restart, then 7..9; never a number twice.
    versions = [n["body"]["version"] for n in notices]
    assert versions == [1, 2, 3, 4, 5, 6, 7, 8, 9], versions
    assert r.get(keys.trainer_version) == b"9"
    info = TrainerInfo.model_validate_json(r.get(keys.trainer_info))
    assert (info.version, info.step, info.trained_unacked) == (9, 6, 0)
    assert r.xpending(keys.stream, streams.TRAINER_GROUP)["pending"] == 0 and r.xlen(keys.stream) == 0
    records = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    assert [(x["step"], x["weights/version"]) for x in records] == [
        (1, 1),
        (2, 2),
        (3, 3),
        (4, 7),
        (5, 8),
        (6, 9),
    ]


def test_a_fresh_start_publishes_version_zero_without_notifying(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path, replica: Any
) -> None:
    """Start, nothing to train: the version key and TrainerInfo are there at once, no notice for 0."""
    url, notices = replica
    r = redis.Redis.from_url(redis_url)
    proc = start_trainer(tiny_model_dir, redis_url, tmp_path, steps=1, port=free_port(),
                         extra=["--notify-url", url])  # fmt: skip
    try:
        import time

        deadline = time.monotonic() + 120
        while r.get(streams.DEFAULT_KEYS.trainer_info) is None and time.monotonic() < deadline:
            assert proc.poll() is None, _log(tmp_path)
            time.sleep(0.2)
        info = TrainerInfo.model_validate_json(r.get(streams.DEFAULT_KEYS.trainer_info))
        assert (info.run_id, info.version, info.step, info.trained_unacked) == ("default", 0, 0, 0)
        assert r.get(streams.DEFAULT_KEYS.trainer_version) == b"0"
        assert notices == []
    finally:
        proc.kill()
        proc.wait()
