"""The trainer service end to end: real Redis, the trainer as a subprocess, a fake rollout replica.

Groups come from :func:`llds_trainer.synthetic.synthetic_groups` (TrajectoryBuilder layout, encoded
with llds_proto.codec) and are XADDed to the stream exactly as the rollout does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import msgpack
import pytest
import redis

from llds_proto import steplog, streams
from llds_proto.admin_auth import SIGNATURE_HEADER, SignatureError, Verifier
from llds_proto.codec import encode_group
from llds_proto.messages import TrainerInfo
from llds_server.http import free_port
from llds_trainer.publish import MARKER, sha256_file
from llds_trainer.synthetic import synthetic_groups

pytestmark = pytest.mark.integration
TOKEN = "s3cret-token"


class _Rollout(BaseHTTPRequestHandler):
    notices: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).notices.append({
            "path": self.path, "auth": self.headers.get("Authorization"), "body": json.loads(body),
            "raw": body, "headers": dict(self.headers), "signature": self.headers.get(SIGNATURE_HEADER),
        })  # fmt: skip
        out = json.dumps({"version": json.loads(body)["version"], "load_s": 0.01}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def fake_rollout_server(host: str = "127.0.0.1") -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An HTTP server that records every weight-update notice it receives: (base URL, notices)."""
    handler = type("Handler", (_Rollout,), {"notices": []})
    srv = ThreadingHTTPServer((host, 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://{host}:{srv.server_address[1]}", handler.notices
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture()
def fake_rollout() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    with fake_rollout_server() as r:
        yield r


def push(r: redis.Redis, groups: list[Any], keys: streams.RunKeys = streams.DEFAULT_KEYS) -> list[str]:
    """XADD each group as the rollout does; returns the entry ids."""
    return [r.xadd(keys.stream, {streams.GROUP_FIELD: encode_group(g)}).decode() for g in groups]


def start_trainer(
    model: Path,
    redis_url: str,
    tmp: Path,
    steps: int,
    port: int,
    extra: list[str] = (),
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    args = [
        sys.executable, "-m", "llds_trainer",
        "--model", str(model), "--redis-url", redis_url,
        "--run-dir", str(tmp / "run"), "--weights-root", str(tmp / "weights"),
        "--steps", str(steps), "--port", str(port),
        "--set", "groups_per_step=2", "--set", "micro_batch_size=3", "--set", "optimizer.lr=1e-3",
        "--set", "read_block_ms=200", "--set", "num_threads=1",
        *extra,
    ]  # fmt: skip
    e = {**os.environ, "LLDS_ADMIN_TOKEN": TOKEN, **(env or {})}
    log = open(tmp / "trainer.log", "ab")
    return subprocess.Popen(args, env=e, stdout=log, stderr=subprocess.STDOUT)


def wait_for(cond: Any, timeout: float, proc: subprocess.Popen[bytes] | None = None, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except (httpx.HTTPError, OSError, KeyError, json.JSONDecodeError):
            pass
        if proc is not None and proc.poll() is not None:
            return cond()
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def small_groups(tokenizer: Any) -> list[Any]:
    return synthetic_groups(tokenizer, 8, 3, seed=7, think_words=3, doc_words=8)


def test_trains_publishes_notifies_and_serves(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path, fake_rollout: Any, small_groups: list[Any]
) -> None:
    """Two steps, two versions, each notified; (issue 30) the registered replica gets notices signed
    for its own URL, never the token; a URL registered by someone else, on a host not in
    ``replica_hosts``, gets nothing."""
    url, notices = fake_rollout
    r = redis.Redis.from_url(redis_url)
    r.hset(streams.DEFAULT_KEYS.registry, "replica-0", url)
    intruder = ExitStack()
    intruder_url, intruder_notices = intruder.enter_context(fake_rollout_server("127.0.0.2"))
    r.hset(streams.DEFAULT_KEYS.registry, "someone-else", intruder_url)
    push(r, small_groups[:2])
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_trainer(tiny_model_dir, redis_url, tmp_path, steps=2, port=port)
    try:
        st = wait_for(lambda: httpx.get(f"{base}/status").json()["step"] >= 1, 180, proc, "step 1")
        assert st, (tmp_path / "trainer.log").read_text()[-3000:]
        # Step 1 done, trainer waiting for more groups: the HTTP surface is live.
        status = httpx.get(f"{base}/status").json()
        assert status["weights_version"] == 1 and status["groups_consumed"] == 2
        health = httpx.get(f"{base}/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        hist = httpx.get(f"{base}/history", params={"since": 0}).json()
        assert [h["step"] for h in hist] == [1]
        assert {"reward/mean", "loss/llds", "lld/correct_logp_token", "weights/version"} <= set(hist[0])
        assert set(hist[0]) <= steplog.KEYS, sorted(set(hist[0]) - steplog.KEYS)  # the key module names all
        assert httpx.get(f"{base}/history", params={"since": 1}).json() == []
        metrics = httpx.get(f"{base}/metrics").text
        for line in (
            "llds_trainer_step 1.0",
            "llds_trainer_weights_version 1.0",
            "llds_trainer_groups_consumed_total 2.0",
            "llds_trainer_lld_alarm_state 0.0",
            "llds_trainer_replicas_refused_total 1.0",
        ):
            assert line in metrics
        for name in ("llds_trainer_reward_mean", "llds_trainer_loss", "llds_trainer_llds_term"):
            assert f"\n{name} " in metrics
        assert r.get(streams.DEFAULT_KEYS.trainer_version) == b"1"
        # Acked once the checkpoint covered the step.
        assert r.xpending(streams.DEFAULT_KEYS.stream, streams.TRAINER_GROUP)["pending"] == 0
        push(r, small_groups[2:4])
        assert proc.wait(180) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        intruder.close()
    run = tmp_path / "run"
    records = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in records] == [1, 2]
    assert intruder_notices == []
    assert "refused registered replica someone-else" in (tmp_path / "trainer.log").read_text()
    # Each record names the start by its tensors' digest (hashed once, kept for resumes).
    from llds_proto.digest import short, tensors_digest

    assert {x["run/start_digest"] for x in records} == {short(tensors_digest(tiny_model_dir))}
    assert json.loads((run / "start.json").read_text())["digest"] == records[0]["run/start_digest"]
    assert all(x["perf/load1"] >= 0 for x in records)
    # Two mini-batch updates per step: the second one sees pi_theta != pi_old, so LLDS is non-zero.
    assert all(x["actor/updates"] == 2 for x in records)
    assert any(x["loss/llds"] > 0 for x in records)
    assert (run / "trainer_config.toml").is_file()
    assert "groups_per_step = 2" in (run / "trainer_config.toml").read_text()
    assert r.get(streams.DEFAULT_KEYS.trainer_version) == b"2"
    # Weights folders: marker last with the sha256 of every file; loadable by transformers as is.
    for v in (1, 2):
        folder = tmp_path / "weights" / f"v{v:06d}"
        marker = json.loads((folder / MARKER).read_text())
        assert marker["version"] == v and marker["step"] == v
        assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(marker["files"])
        for name, digest in marker["files"].items():
            assert sha256_file(folder / name) == digest
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(tmp_path / "weights" / "v000002"))
    assert [n["path"] for n in notices] == ["/admin/weights", "/admin/weights"]
    assert [n["body"]["version"] for n in notices] == [1, 2]
    assert [n["body"]["path"] for n in notices] == ["v000001", "v000002"]
    # Signed for this replica's URL; the token itself is nowhere in what the replica received.
    assert all(
        n["auth"] is None and TOKEN not in json.dumps(n["headers"]) + n["raw"].decode() for n in notices
    )
    for n in notices:
        Verifier(TOKEN, [url]).verify(n["signature"], "POST", "/admin/weights", n["raw"])
        with pytest.raises(SignatureError, match="does not match"):  # no good at another replica
            Verifier(TOKEN, ["http://127.0.0.1:8001"]).verify(
                n["signature"], "POST", "/admin/weights", n["raw"]
            )
    # The checkpoint is the record of what was trained (it is what acknowledgement waits for).
    state = json.loads(sorted((run / "checkpoints").iterdir())[-1].joinpath("state.json").read_text())
    assert state["consumed"] == [g.group_id for g in small_groups[:4]] and state["consumed_total"] == 4
    # Acknowledged entries are trimmed away; the rollouts' admission sees the trainer's cadence.
    assert r.xlen(streams.DEFAULT_KEYS.stream) == 0
    info = TrainerInfo.model_validate_json(r.get(streams.DEFAULT_KEYS.trainer_info))
    assert (info.run_id, info.version, info.step, info.groups_per_step, info.trained_unacked) == (
        "default",
        2,
        2,
        2,
        0,
    )


def test_bad_config_fails_before_loading_a_model(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "llds_trainer", "--model", "x", "--set", "regularizer.gate=sideways"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "regularizer" in out.stderr and "sideways" in out.stderr


@pytest.mark.slow
def test_kill9_at_every_point_loses_nothing_and_trains_nothing_twice(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path, small_groups: list[Any]
) -> None:
    """Crash the trainer with SIGKILL at each point of the step cycle, restart, and audit."""
    from llds_trainer.queue import StreamQueue

    r = redis.Redis.from_url(redis_url)
    push(r, small_groups)  # 8 groups = 4 steps of 2
    # A consumer that reads two groups and dies without acknowledging: they must be reclaimed.
    dead = StreamQueue(r, "trainer-dead")
    dead.ensure_group()
    taken = dead.fetch(2, lambda: False)
    assert len(taken) == 2
    extra = ["--set", "claim_idle_ms=300", "--set", "staleness_k=100"]
    for fp in (
        "after_fetch:1",
        "after_train:1",
        "after_checkpoint:1",
        "after_log:2",
        "after_ack:2",
        "after_publish:3",
    ):
        proc = start_trainer(tiny_model_dir, redis_url, tmp_path, steps=4, port=free_port(), extra=extra,
                             env={"LLDS_TRAINER_FAILPOINT": fp})  # fmt: skip
        rc = proc.wait(180)
        assert rc == -9, f"{fp}: exit {rc}\n" + (tmp_path / "trainer.log").read_text()[-3000:]
    proc = start_trainer(tiny_model_dir, redis_url, tmp_path, steps=4, port=free_port(), extra=extra)
    assert proc.wait(180) == 0, (tmp_path / "trainer.log").read_text()[-3000:]

    run = tmp_path / "run"
    cps = sorted((run / "checkpoints").iterdir())
    state = json.loads((cps[-1] / "state.json").read_text())
    consumed = state["consumed"]
    assert len(consumed) == len(set(consumed)) == 8, consumed  # nothing trained twice
    assert set(consumed) == {g.group_id for g in small_groups}  # nothing lost
    assert state["step"] == 4 and state["version"] == 4
    assert r.xpending(streams.DEFAULT_KEYS.stream, streams.TRAINER_GROUP)["pending"] == 0
    records = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in records] == [1, 2, 3, 4]
    assert (
        len({x["run/start_digest"] for x in records}) == 1 and records[0]["run/start_digest"]
    )  # across resumes
    assert r.get(streams.DEFAULT_KEYS.trainer_version) == b"4"
    for v in (2, 3, 4):
        assert (tmp_path / "weights" / f"v{v:06d}" / MARKER).is_file()
    assert not (tmp_path / "weights" / "v000001").exists()  # keep_versions = 3


def test_invalid_and_duplicate_groups_are_dropped_and_acked(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path, tokenizer: Any
) -> None:
    r = redis.Redis.from_url(redis_url)
    r.set(streams.DEFAULT_KEYS.trainer_version, "0")
    fresh = synthetic_groups(tokenizer, 2, 2, seed=1, think_words=2, doc_words=4)
    dup = synthetic_groups(tokenizer, 1, 2, seed=1, think_words=2, doc_words=4)  # same group id as fresh[0]
    poison_ids = [r.xadd(streams.DEFAULT_KEYS.stream, {streams.GROUP_FIELD: b"not msgpack"}).decode()]
    # msgpack of the wrong shape (a map whose trajectories are not maps): the codec's error, not a crash
    poison_ids.append(
        r.xadd(
            streams.DEFAULT_KEYS.stream,
            {streams.GROUP_FIELD: msgpack.packb({"schema_version": 1, "trajectories": [1]})},
        ).decode()
    )
    bad = synthetic_groups(tokenizer, 2, 2, seed=1, think_words=2, doc_words=4, start_index=50)
    t0 = bad[0].trajectories[0]
    vocab = t0.model_copy(update={"response_ids": [10**6, *t0.response_ids[1:]]})  # no such embedding row
    bad[0] = bad[0].model_copy(update={"trajectories": [vocab, *bad[0].trajectories[1:]]})
    t1 = bad[1].trajectories[0]
    n = 9000  # past the tiny model's 8192 positions
    long = t1.model_copy(update={"prompt_ids": [1] * n + list(t1.prompt_ids)})
    bad[1] = bad[1].model_copy(update={"trajectories": [long, *bad[1].trajectories[1:]]})
    ids = push(r, fresh[:1] + dup + bad + fresh[1:])
    port = free_port()
    proc = start_trainer(tiny_model_dir, redis_url, tmp_path, steps=1, port=port)
    assert proc.wait(180) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    log = (tmp_path / "trainer.log").read_text()
    assert "invalid" in log and "duplicate" in log and "out_of_vocab" in log and "too_long" in log
    assert r.xpending(streams.DEFAULT_KEYS.stream, streams.TRAINER_GROUP)["pending"] == 0
    state = json.loads(next((tmp_path / "run" / "checkpoints").iterdir()).joinpath("state.json").read_text())
    assert state["consumed"] == [g.group_id for g in fresh]
    # The poison (not the duplicate) is set aside in the run's dead-letter stream with its bytes.
    dead = [
        (f[b"entry"].decode(), f[b"reason"].decode(), f)
        for _, f in r.xrange(streams.DEFAULT_KEYS.dead_letter)
    ]
    assert [(e, why) for e, why, _ in dead] == [
        (poison_ids[0], "invalid"), (poison_ids[1], "invalid"), (ids[2], "out_of_vocab"), (ids[3], "too_long")
    ], dead  # fmt: skip
    assert dead[0][2][streams.GROUP_FIELD] == b"not msgpack"
    assert dead[2][2][streams.GROUP_FIELD] == encode_group(bad[0])
    record = json.loads((tmp_path / "run" / "train_log.jsonl").read_text().splitlines()[0])
    assert record[steplog.DATA_DEAD_LETTERED] == 4 and record[steplog.DATA_FAILED_ATTEMPTS] == 0


def _dead_letters(r: redis.Redis) -> list[tuple[str, str, str]]:
    return [
        (f[b"entry"].decode(), f[b"reason"].decode(), f[b"error"].decode())
        for _, f in r.xrange(streams.DEFAULT_KEYS.dead_letter)
    ]


def test_a_group_that_fails_its_step_is_set_aside_and_training_goes_on(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path, tokenizer: Any
) -> None:
    """A group the step cannot take (injected: LLDS_FAULT_POISON_GROUPS) fails two attempts; each
    time every group of the step is checked alone, only it is blamed; then it is set aside and the
    run trains every other group, each once."""
    r = redis.Redis.from_url(redis_url)
    r.set(streams.DEFAULT_KEYS.trainer_version, "0")
    gs = synthetic_groups(tokenizer, 5, 2, seed=11, think_words=2, doc_words=4)
    ids = push(r, gs)  # the poison is the second: it shares a step with the first
    poison = gs[1].group_id
    proc = start_trainer(tiny_model_dir, redis_url, tmp_path, steps=2, port=free_port(),
                         env={"LLDS_FAULT_POISON_GROUPS": poison})  # fmt: skip
    assert proc.wait(240) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    dead = _dead_letters(r)
    assert [(e, why) for e, why, _ in dead] == [(ids[1], "failed")], dead
    assert "InjectedFailure" in dead[0][2] and poison in dead[0][2]
    assert r.xpending(streams.DEFAULT_KEYS.stream, streams.TRAINER_GROUP)["pending"] == 0
    assert not r.exists(streams.DEFAULT_KEYS.entry_failures)  # counts go with their entries
    run = tmp_path / "run"
    state = json.loads(sorted((run / "checkpoints").iterdir())[-1].joinpath("state.json").read_text())
    assert sorted(state["consumed"]) == sorted(g.group_id for i, g in enumerate(gs) if i != 1)
    records = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in records] == [1, 2]
    assert records[0][steplog.DATA_FAILED_ATTEMPTS] == 2 and records[0][steplog.DATA_DEAD_LETTERED] == 1
    assert records[1][steplog.DATA_FAILED_ATTEMPTS] == 0 and records[1][steplog.DATA_DEAD_LETTERED] == 0


def test_failure_counts_outlive_a_crash_loop(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path, tokenizer: Any
) -> None:
    """With max_failed_steps_in_row = 1 a failed step stops the trainer (as one whose weights had moved
    would): each start fails on the same pending entries, counts them in Redis, and the third start
    sets the step's entries aside and trains the rest."""
    r = redis.Redis.from_url(redis_url)
    r.set(streams.DEFAULT_KEYS.trainer_version, "0")
    gs = synthetic_groups(tokenizer, 4, 2, seed=12, think_words=2, doc_words=4)
    ids = push(r, gs)
    extra = ["--set", "max_failed_steps_in_row=1"]
    env = {"LLDS_FAULT_POISON_GROUPS": gs[0].group_id}
    for attempt in (1, 2):
        proc = start_trainer(
            tiny_model_dir, redis_url, tmp_path, steps=1, port=free_port(), extra=extra, env=env
        )
        assert proc.wait(240) == 1, (tmp_path / "trainer.log").read_text()[-3000:]
        assert r.hgetall(streams.DEFAULT_KEYS.entry_failures) == {ids[0].encode(): str(attempt).encode(),
                                                                 ids[1].encode(): str(attempt).encode()}  # fmt: skip
    assert (
        "training step 1 failed (1 steps in a row failed): InjectedFailure"
        in (tmp_path / "trainer.log").read_text()
    )
    proc = start_trainer(tiny_model_dir, redis_url, tmp_path, steps=1, port=free_port(), extra=extra, env=env)
    assert proc.wait(240) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    assert [(e, why) for e, why, _ in _dead_letters(r)] == [(ids[0], "failed"), (ids[1], "failed")]
    state = json.loads(next((tmp_path / "run" / "checkpoints").iterdir()).joinpath("state.json").read_text())
    assert state["consumed"] == [gs[2].group_id, gs[3].group_id]


def test_dynamic_sampling_skips_uniform_groups_and_fills_the_step(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path, tokenizer: Any
) -> None:
    r = redis.Redis.from_url(redis_url)
    r.set(streams.DEFAULT_KEYS.trainer_version, "0")
    gs = synthetic_groups(tokenizer, 5, 3, seed=4, think_words=2, doc_words=4)

    def rewards(g: Any, values: tuple[float, ...]) -> Any:
        ts = [t.model_copy(update={"reward": v}) for t, v in zip(g.trajectories, values, strict=True)]
        return g.model_copy(update={"trajectories": ts})

    ordered = [rewards(gs[0], (1, 1, 1)), rewards(gs[1], (0, 1, 0)), rewards(gs[2], (0, 0, 0)),
               rewards(gs[3], (1, 1, 1)), rewards(gs[4], (1, 0, 0))]  # fmt: skip
    ids = push(r, ordered)
    proc = start_trainer(tiny_model_dir, redis_url, tmp_path, steps=1, port=free_port(),
                         extra=["--set", "dynamic_sampling=true"])  # fmt: skip
    assert proc.wait(180) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    (rec,) = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert (rec["data/groups"], rec["data/uniform_skipped"]) == (2, 3)
    assert rec["data/uniform_skipped_frac"] == 0.6
    assert set(rec) <= steplog.KEYS, sorted(set(rec) - steplog.KEYS)
    # the bytes on disk: the checkpoint trained exactly the two groups with a learning signal
    state = json.loads(next((tmp_path / "run" / "checkpoints").iterdir()).joinpath("state.json").read_text())
    assert state["consumed"] == [ordered[1].group_id, ordered[4].group_id]
    # every entry acknowledged (the skipped ones at once), none left pending
    assert r.xpending(streams.DEFAULT_KEYS.stream, streams.TRAINER_GROUP)["pending"] == 0
    assert (tmp_path / "trainer.log").read_text().count("): uniform") == 3 and len(ids) == 5


def test_dynamic_sampling_on_a_dead_policy_stops_the_trainer_with_its_own_exit_status(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path, tokenizer: Any
) -> None:
    """Every group scores 0 (a collapsed policy): after dynamic_sampling_max_skips of them in a row the
    trainer exits EXIT_NO_SIGNAL (not a crash's 1), with the cause in its log, every skipped entry
    acknowledged and nothing trained (no step logged)."""
    from llds_proto.exits import EXIT_NO_SIGNAL

    r = redis.Redis.from_url(redis_url)
    r.set(streams.DEFAULT_KEYS.trainer_version, "0")
    gs = synthetic_groups(tokenizer, 4, 3, seed=5, think_words=2, doc_words=4)
    ids = push(r, [g.model_copy(update={"trajectories": [t.model_copy(update={"reward": 0.0}) for t in g.trajectories]})
             for g in gs])  # fmt: skip
    proc = start_trainer(tiny_model_dir, redis_url, tmp_path, steps=2, port=free_port(),
                         extra=["--set", "dynamic_sampling=true", "--set", "dynamic_sampling_max_skips=3"])  # fmt: skip
    text = lambda: (tmp_path / "trainer.log").read_text()  # noqa: E731
    assert proc.wait(180) == EXIT_NO_SIGNAL, text()[-3000:]
    assert (
        "trainer stopped: dynamic sampling skipped 3 groups in a row" in text() and "Traceback" not in text()
    )
    assert (
        not (tmp_path / "run" / "train_log.jsonl").is_file()
        or not (tmp_path / "run" / "train_log.jsonl").read_text()
    )
    # the three skipped entries acknowledged; the fourth, read in the same fetch but not handled, is
    # left pending (a restarted trainer is handed it again: lost by no one)
    pending = r.xpending_range(streams.DEFAULT_KEYS.stream, streams.TRAINER_GROUP, "-", "+", 10)
    assert [p["message_id"].decode() for p in pending] == ids[3:]


def test_the_acting_alarm_fires_in_a_real_run_and_switches_llds_on(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path, tokenizer: Any
) -> None:
    """GRPO (no regulariser) at a learning rate that wrecks the tiny model: the correct responses'
    likelihood falls, the monitor warns, and from the next step the trainer runs LLDS. Witnesses: the
    step log (alarm, action, lambda, LLDS term), the trainer's log line and the checkpoint's state."""
    r = redis.Redis.from_url(redis_url)
    r.set(streams.DEFAULT_KEYS.trainer_version, "0")
    steps = 6
    proc = start_trainer(tiny_model_dir, redis_url, tmp_path, steps=steps, port=free_port(),
                         extra=["--regularizer.type", "none", "--lld.alarm.type", "enable_llds",
                                "--lld.window", "3", "--lld.persist-steps", "1",
                                "--lld.fell-fraction", "0", "--optimizer.lr", "3e-2",
                                "--groups-per-step", "4", "--lld.alarm.llds.coef", "0.5"])  # fmt: skip
    log_path = tmp_path / "run" / "train_log.jsonl"
    for step in range(steps):  # each step's groups sampled by the version it trains (none go stale)
        wait_for(lambda s=step: s == 0 or (log_path.is_file() and len(log_path.read_text().splitlines()) >= s),
                 120, proc, f"step {step}")  # fmt: skip
        push(r, synthetic_groups(tokenizer, 4, 3, seed=11 + step, version=step, start_index=4 * step,
                                 think_words=3, doc_words=6))  # fmt: skip
    assert proc.wait(300) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    recs = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert len(recs) == steps
    warned = next((rec["step"] for rec in recs if rec["lld/alarm"] >= 1), None)
    assert warned is not None, [(x["lld/correct_logp_token"], x["lld/fell_fraction_responses"]) for x in recs]
    # it acted at the step the state machine entered the warning, and only then
    assert [rec["step"] for rec in recs if rec["lld/action"] == 1] == [warned]
    before = [rec for rec in recs if rec["step"] <= warned]
    after = [rec for rec in recs if rec["step"] > warned]
    assert after, f"the alarm fired at the last step ({warned}): nothing after it to check"
    assert all(rec["llds/lambda"] == 0 and rec["loss/llds"] == 0 for rec in before)
    assert all(rec["llds/lambda"] == 0.5 for rec in after)
    # the regulariser is in the loss now (non-zero from a step's second update on)
    assert any(rec["loss/llds"] > 0 and rec["llds/gated_fraction"] > 0 for rec in after)
    text = (tmp_path / "trainer.log").read_text()
    assert f"LLD alarm warning at step {warned}: enable_llds, LLDS lambda now 0.5" in text
    ckpt = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    state = json.loads((ckpt / "state.json").read_text())
    assert state["alarm_action"]["fired_steps"] == [warned] and state["alarm_action"]["lam"] == 0.5
