"""The resume audit's judgement (llds.resume_audit.audit), on a run folder and a real Redis made to
look like the end of a killed-and-resumed run: a clean one passes, and each way of losing or
repeating a prompt is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
import torch

from llds import resume_audit
from llds_proto.codec import encode_group
from llds_proto.messages import Trajectory, TrajectoryGroup
from llds_proto.streams import GROUP_FIELD, RunKeys

STEPS = 3


def _group(gid: str) -> TrajectoryGroup:
    t = Trajectory(trajectory_id=f"{gid}/0", sample_index=0, prompt_ids=[1, 2], response_ids=[3], logprobs=[-0.1],
                   loss_mask=[1], versions=[0], action_spans=[(0, 1)], reward=1.0)  # fmt: skip
    return TrajectoryGroup(group_id=gid, prompt_id=gid.split(":")[0] + ":" + gid.split(":")[1], question="q",
                           gold_answers=["a"], trajectories=[t], created_at=0.0, run_id="audit-run")  # fmt: skip


def _run(tmp_path: Path, url: str, *, consumed: list[str], adam: int, observed: list[str], cursor: int,
         claims: dict[int, str], drops: list[int], in_stream: list[str]) -> dict[str, object]:  # fmt: skip
    work, run = tmp_path / "work", tmp_path / "work" / "run"
    (run / "trainer" / "checkpoints" / f"step_{STEPS:08d}").mkdir(parents=True)
    (run / "logs").mkdir()
    (run / "run_id").write_text("audit-run\n")
    keys = RunKeys("audit-run")
    ck = run / "trainer" / "checkpoints" / f"step_{STEPS:08d}"
    (ck / "state.json").write_text(
        json.dumps({"step": STEPS, "consumed": consumed, "consumed_total": len(consumed)})
    )
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p])
    for _ in range(adam):
        p.grad = torch.ones(2)
        opt.step()
    torch.save(opt.state_dict(), ck / "optimizer.pt")
    (run / "trainer" / "train_log.jsonl").write_text(
        "".join(json.dumps({"step": s, "actor/updates": 2}) + "\n" for s in range(1, STEPS + 1))
    )
    (run / "logs" / "trainer.log").write_text("WARNING dropping entry 1-1 (world:9:0:p5): stale\n")
    rows = [{"stream": f"{i}-0", "group_id": g} for i, g in enumerate(observed)]
    rows += [{"dropped": f"{i}-1", "position": str(p), "why": "stale"} for i, p in enumerate(drops)]
    (work / "observed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = redis.Redis.from_url(url)
    r.set(keys.data_cursor, cursor)
    for pos, v in claims.items():
        r.hset(keys.data_claims, pos, v)
    for g in in_stream:
        r.xadd(keys.stream, {GROUP_FIELD: encode_group(_group(g))})
    return resume_audit.audit(work, run, url, STEPS)


CLEAN = dict(
    consumed=["world:0:0:p0", "world:1:0:p1", "world:2:0:p2", "world:3:0:p3"],
    adam=6,
    observed=["world:0:0:p0", "world:1:0:p1", "world:2:0:p2", "world:3:0:p3", "world:9:0:p5", "world:4:0:p6"],
    cursor=8,
    claims={7: "r-1\t1.0\t0"},
    drops=[4],
    in_stream=["world:4:0:p6"],
)


def test_a_clean_run_passes_with_every_position_accounted_for(tmp_path: Path, redis_url: str) -> None:
    rep = _run(tmp_path, redis_url, **CLEAN)  # type: ignore[arg-type]
    assert rep["failures"] == []
    assert (rep["cursor"], rep["positions_pushed"], rep["trained"], rep["left_in_stream"]) == (8, 6, 4, 1)
    assert rep["dropped_by_trainer"] == 1 and rep["dropped_by_trainer_reasons"] == {"stale": 1}
    assert rep["positions_dropped_by_rollout"] == {"stale": 1} and rep["positions_claimed_at_end"] == 1
    assert rep["adam_steps"] == [6] and rep["updates_logged"] == 6


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"cursor": 9}, "positions below the cursor (9) nowhere"),
        ({"observed": [*CLEAN["observed"], "world:0:0:p0"]}, "positions in the stream more than once: [0]"),  # type: ignore[list-item]
        ({"consumed": [*CLEAN["consumed"], "world:0:0:p0"]}, "group ids trained twice"),  # type: ignore[list-item]
        ({"adam": 7}, "AdamW step counts [7], not the 6 updates"),
        ({"consumed": [*CLEAN["consumed"], "world:8:0:p8"]}, "trained groups the observer never saw"),  # type: ignore[list-item]
        ({"drops": [4, 6]}, "positions both pushed and dropped: [6]"),
    ],
)
def test_each_way_of_losing_or_repeating_a_prompt_is_named(
    tmp_path: Path, redis_url: str, change: dict[str, object], named: str
) -> None:
    rep = _run(tmp_path, redis_url, **(CLEAN | change))  # type: ignore[arg-type]
    assert any(named in f for f in rep["failures"]), rep["failures"]  # type: ignore[attr-defined]


def test_bad_flags_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        resume_audit.main(["--kills", "0"])
    assert "--kills >= 1 (got 0)" in capsys.readouterr().err
