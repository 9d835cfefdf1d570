"""Staleness at admission, audited end to end: the real rollout service and the real trainer, each
its own process, on a real Valkey, with K = 1 and the derived backpressure on, over several steps
with weight swaps.

An auditor thread polls the stream (XRANGE) fast enough to see every entry before the trainer trims
it, and the consumer group (XPENDING, last delivered id) to see when each entry is acknowledged,
reading the trainer's published version before each poll. For every acknowledged group: its oldest
token's version >= (the trainer's version when it was acknowledged) - K, a lower bound of that
version being the one read before the previous poll. And no group dropped as stale, at either side.

This file runs the rollout on the transformers backend (main environment);
``test_admission_vllm.py`` runs the same audit on vLLM, the default engine.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from reliability_kit import Service
from test_rollout_service import retriever_app

from llds_proto.codec import decode_group
from llds_proto.messages import TrainerInfo
from llds_proto.streams import GROUP_FIELD, TRAINER_GROUP, RunKeys
from llds_server.http import BackgroundServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "admission-admin-token"
K = 1
GROUPS_PER_STEP = 2
QUESTIONS = ["who wrote hamlet", "capital of france", "where does the danube flow", "who wrote macbeth"]


@dataclass
class Audit:
    """What the auditor saw: every entry's group, and the version lower bound at its acknowledgement."""

    groups: dict[bytes, Any] = field(default_factory=dict)
    acked_at_version: dict[bytes, int] = field(default_factory=dict)
    polls: int = 0
    error: BaseException | None = None


def audit_stream(r: redis.Redis, keys: RunKeys, stop: threading.Event, audit: Audit) -> None:
    last = b"0-0"
    v_prev = 0
    try:
        while not stop.is_set():
            raw = r.get(keys.trainer_version)
            v_now = int(raw) if raw is not None else 0
            for eid, fields in r.xrange(keys.stream, min=b"(" + last):
                audit.groups[eid] = decode_group(fields[GROUP_FIELD])
                last = eid
            try:
                info = r.xinfo_groups(keys.stream)
            except redis.ResponseError:
                info = []
            delivered = next(
                (g["last-delivered-id"] for g in info if g["name"] == TRAINER_GROUP.encode()), None
            )
            if delivered is not None:
                pending = {
                    p["message_id"] for p in r.xpending_range(keys.stream, TRAINER_GROUP, "-", "+", 10_000)
                }
                for eid in audit.groups:
                    if (
                        eid not in audit.acked_at_version
                        and _id(eid) <= _id(delivered)
                        and eid not in pending
                    ):
                        # acknowledged after the previous poll read pending, so after v_prev was read
                        audit.acked_at_version[eid] = v_prev
            v_prev = v_now
            audit.polls += 1
            time.sleep(0.01)
    except BaseException as e:  # surfaces in the test, not as a dead thread
        audit.error = e


def _id(eid: bytes) -> tuple[int, int]:
    ms, seq = eid.split(b"-")
    return int(ms), int(seq)


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _main_python() -> str:
    """The trainer runs in the main environment (.venv), as ``llds up`` runs it."""
    py = ROOT / ".venv" / "bin" / "python"
    return str(py) if py.exists() else sys.executable


def run_admission_audit(model: Path, redis_url: str, tmp: Path, engine: str, steps: int) -> None:
    keys = RunKeys("admission-audit")
    r = redis.Redis.from_url(redis_url)
    dataset = tmp / "train.jsonl"
    rows = [
        {
            "id": f"q{i}",
            "data_source": "world",
            "question": q,
            "golden_answers": ["x"],
            "extra_info": {"index": i},
        }
        for i, q in enumerate(QUESTIONS)
    ]
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp / "weights").mkdir()
    # Until the trainer writes its own (it overwrites this on start), the pace it will train at.
    if r.get(keys.trainer_info) is None:
        info = TrainerInfo(run_id=keys.run_id, version=0, step=0, groups_per_step=GROUPS_PER_STEP,
                           publish_every=1, staleness_k=K)  # fmt: skip
        r.set(keys.trainer_info, info.model_dump_json())
    calls: list[dict[str, Any]] = []
    audit, stop = Audit(), threading.Event()
    auditor = threading.Thread(target=audit_stream, args=(r, keys, stop, audit), daemon=True)
    rollout_port, trainer_port = free_port(), free_port()
    rollout_url = f"http://127.0.0.1:{rollout_port}"
    env = {"LLDS_ADMIN_TOKEN": TOKEN, "LLDS_ROLLOUT_RUN_ID": keys.run_id, "LLDS_TRAINER_RUN_ID": keys.run_id}
    with BackgroundServer(retriever_app(calls)) as retriever:
        rollout = Service(
            "rollout",
            [sys.executable, "-m", "llds_rollout", "serve", "--config", str(ROOT / "configs" / "rollout_tiny.toml"),
             "--engine", engine, "--model", str(model), "--retriever-url", retriever.url, "--redis-url", redis_url,
             "--dataset", str(dataset), "--weights-root", str(tmp / "weights"), "--port", str(rollout_port),
             "--run-id", keys.run_id],
            tmp,
            {**env, "LLDS_ROLLOUT_MAX_STALENESS": str(K), "LLDS_ROLLOUT_VERSION_POLL_S": "0.1",
             "LLDS_ROLLOUT_MAX_GROUPS_IN_FLIGHT": "3", "LLDS_ROLLOUT_MAX_QUEUED_GROUPS": "0"},
        )  # fmt: skip
        trainer = Service(
            "trainer",
            [_main_python(), "-m", "llds_trainer", "--config", str(ROOT / "configs" / "trainer_tiny.toml"),
             "--model", str(model), "--redis-url", redis_url, "--run-dir", str(tmp / "run"),
             "--weights-root", str(tmp / "weights"), "--steps", str(steps), "--port", str(trainer_port),
             "--set", f"groups_per_step={GROUPS_PER_STEP}", "--set", f"staleness_k={K}",
             "--set", "num_threads=1", "--set", "read_block_ms=100"],
            tmp,
            env,
        )  # fmt: skip
        auditor.start()
        try:
            rollout.start()
            trainer.start()
            rollout.wait_healthy(rollout_url, timeout_s=240)
            assert trainer.proc is not None
            rc = trainer.proc.wait(240)
            assert rc == 0, trainer.log()
            time.sleep(0.3)  # the auditor's last polls
            rollout_metrics = httpx.get(f"{rollout_url}/metrics", timeout=10).text
            health = httpx.get(f"{rollout_url}/health", timeout=10).json()
        finally:
            stop.set()
            auditor.join(10)
            trainer.stop()
            rollout.stop(60)
    assert audit.error is None, repr(audit.error)
    trained = {eid: audit.groups[eid] for eid in audit.acked_at_version}
    lines = [
        f"{eid.decode()} {g.group_id} min_version={g.min_version} acked_at>={audit.acked_at_version[eid]}"
        for eid, g in trained.items()
    ]
    print(
        f"{audit.polls} polls, {len(audit.groups)} entries seen, {len(trained)} acknowledged",
        *lines,
        sep="\n",
    )
    # What was trained, from the bytes on disk (the final checkpoint's consumed ids), not the logs.
    (final,) = sorted((tmp / "run" / "checkpoints").glob("step_*"))[-1:]
    consumed = set(json.loads((final / "state.json").read_text())["consumed"])
    acked = trained
    trained = {eid: g for eid, g in acked.items() if g.group_id in consumed}
    assert len(trained) == steps * GROUPS_PER_STEP, "\n".join(lines) + trainer.log()
    # The guarantee: every group trained on was within K of the trainer's version when trained.
    late = [
        f"{g.group_id} min_version={g.min_version} acked_at>={audit.acked_at_version[eid]}"
        for eid, g in trained.items()
        if g.min_version < audit.acked_at_version[eid] - K
    ]
    assert not late, "\n".join(late)
    # Admission lets no group start that cannot be trained within K: nothing is dropped as stale, at
    # the trainer (every acknowledged group was trained) or at the rollout (below).
    dropped = [g.group_id for eid, g in acked.items() if eid not in trained]
    assert not dropped and trainer.log(200_000).count(": stale") == 0, (dropped, lines)
    assert all(g.run_id == keys.run_id for g in audit.groups.values())
    # the trainer really moved on: versions 1..steps were published and swapped in
    assert int(r.get(keys.trainer_version) or 0) == steps
    assert max(g.min_version for g in trained.values()) >= steps - 1 - K, lines
    assert health["detail"]["weights_version"] >= steps - 1
    # the rollout's own stale drops are counted and rare too
    rollout_drops = _metric(rollout_metrics, "llds_rollout_stale_groups_dropped_total")
    assert rollout.log(2_000_000).count("stale group dropped") == rollout_drops == 0
    assert _metric(rollout_metrics, "llds_rollout_admission_capacity_groups") > 0
    # The rollout's own INFO lines reach its log on either engine (on vLLM a dependency re-levels the
    # root logger to ERROR at engine start): one "group pushed" line per group that was trained.
    rollout_log = rollout.log(2_000_000)
    assert rollout_log.count("INFO llds_rollout.scheduler group pushed") >= len(trained), rollout_log[-4000:]
    assert "INFO llds_rollout.scheduler group admitted" in rollout_log


def test_admission_keeps_every_trained_group_within_k_transformers(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    run_admission_audit(tiny_model_dir, redis_url, tmp_path, engine="transformers", steps=4)
