"""SIGTERM on every service (its own process, started with default flags): in-flight work drains,
the process exits in bounded time, and it listened on loopback only. Then ``llds up`` under SIGTERM:
nothing it started survives it (``tests/e2e/test_up.py`` checks the same for SIGINT).

uvicorn re-raises the SIGTERM it caught once its graceful shutdown is complete, so a service that
shut down cleanly exits with -15 (``Application shutdown complete`` in its log); the trainer, which
handles SIGTERM itself, exits with 0.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import redis
from reliability_kit import PY_CLI, Service, retriever_service, wait_for

from llds_proto import streams
from llds_proto.codec import encode_group
from llds_server.http import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CLEAN = (0, -signal.SIGTERM)


def _listens_on_loopback_only(pid: int) -> None:
    listening = [
        c.laddr for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN
    ]
    assert listening, "not listening"
    assert all(a.ip in ("127.0.0.1", "::1") for a in listening), listening


def _sigterm_and_time(svc: Service, limit_s: float) -> tuple[int, float]:
    t0 = time.monotonic()
    svc.signal(signal.SIGTERM)
    assert svc.proc is not None
    try:
        rc = svc.proc.wait(limit_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{svc.name} still running {limit_s} s after SIGTERM:\n{svc.log()}") from None
    return rc, time.monotonic() - t0


def test_retriever_sigterm_answers_what_it_accepted_and_exits(tmp_path: Path) -> None:
    svc, url = retriever_service(tmp_path)
    svc.start()
    try:
        svc.wait_healthy(url)
        _listens_on_loopback_only(svc.pid)
        results: list[Any] = []

        def client(i: int) -> None:
            try:
                r = shared.post(f"{url}/retrieve", json={"queries": [f"academy founder {i}"] * 8, "topk": 5})
                results.append(r.status_code)
            except httpx.HTTPError as e:
                results.append(type(e).__name__)

        shared = httpx.Client(timeout=30)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        time.sleep(0.1)
        rc, took = _sigterm_and_time(svc, 15)
        for t in threads:
            t.join(30)
        shared.close()
        assert rc in CLEAN and "Application shutdown complete" in svc.log(), svc.log()
        # requests were answered, or refused at the connection level once the server stopped
        # listening (a connection still in the listen backlog is reset); never a 5xx, never a hang
        refused = ("ConnectError", "RemoteProtocolError", "ReadError")
        assert len(results) == 32 and all(s == 200 or s in refused for s in results), [
            s for s in results if s != 200
        ]
        assert 200 in results
        assert took < 15
    finally:
        svc.stop()


def test_rollout_sigterm_drains_an_inflight_answer(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    svc = Service(
        "rollout",
        [*PY_CLI, "rollout", "serve", "--engine", "transformers", "--config", str(ROOT / "configs" / "rollout_tiny.toml"), "--model",
         str(tiny_model_dir), "--retriever-url", f"http://127.0.0.1:{free_port()}", "--no-train", "--port", str(port)],
        tmp_path,
        {"LLDS_ROLLOUT_MAX_TOKENS_PER_TURN": "300", "LLDS_ROLLOUT_RETRIEVER_RETRIES": "0"},
    )  # fmt: skip
    svc.start()
    try:
        svc.wait_healthy(url)
        _listens_on_loopback_only(svc.pid)
        out: dict[str, Any] = {}

        def ask() -> None:
            t = time.monotonic()
            try:
                out["resp"] = httpx.post(
                    f"{url}/answer", json={"question": "who?", "max_turns": 1}, timeout=120
                )
            except httpx.HTTPError as e:
                out["resp"] = e
            out["s"] = time.monotonic() - t

        th = threading.Thread(target=ask)
        th.start()
        time.sleep(0.7)
        assert th.is_alive(), f"the answer finished before SIGTERM ({out}); make it longer"
        rc, took = _sigterm_and_time(svc, 60)
        th.join(60)
        resp = out["resp"]
        assert isinstance(resp, httpx.Response), resp
        # drained: the in-flight answer completed (200, or 503 if this random model searched the absent retriever)
        assert resp.status_code in (200, 503), resp.text
        if resp.status_code == 503:
            assert "retriever unavailable" in resp.json()["detail"]
        assert rc in CLEAN and "Application shutdown complete" in svc.log(), svc.log()
        print(f"rollout: answer took {out['s']:.1f} s, exit {took:.1f} s after SIGTERM")
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        svc.stop()


def test_trainer_sigterm_finishes_the_step_and_loses_nothing(
    tiny_model_dir: Path, tokenizer: Any, redis_url: str, tmp_path: Path
) -> None:
    from llds_trainer.synthetic import synthetic_groups

    r = redis.Redis.from_url(redis_url)
    groups = synthetic_groups(tokenizer, 6, 3, seed=5, think_words=3, doc_words=8)
    # Entry ids as Redis gave them: the trainer trims what it acknowledges, so XRANGE later shows less.
    by_entry = {
        r.xadd(streams.DEFAULT_KEYS.stream, {streams.GROUP_FIELD: encode_group(g)}): g.group_id
        for g in groups
    }
    port = free_port()
    svc = Service(
        "trainer",
        [*PY_CLI, "trainer", "run", "--config", str(ROOT / "configs" / "trainer_tiny.toml"), "--model", str(tiny_model_dir),
         "--redis-url", redis_url, "--run-dir", str(tmp_path / "run"), "--weights-root", str(tmp_path / "weights"),
         "--steps", "0", "--port", str(port), "--set", "num_threads=1", "--set", "read_block_ms=200"],
        tmp_path,
    )  # fmt: skip
    svc.start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: httpx.get(f"{url}/status").json()["step"] >= 1, 120, "a trained step")
        _listens_on_loopback_only(svc.pid)
        wait_for(
            lambda: httpx.get(f"{url}/status").json()["state"] == "training", 30, "mid-step", interval_s=0.02
        )
        rc, took = _sigterm_and_time(svc, 60)
        assert rc == 0, svc.log()
        assert "stopping after the current step" in svc.log()
    finally:
        svc.stop()
    cps = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
    state = json.loads((cps[-1] / "state.json").read_text())
    consumed = set(state["consumed"])
    pending = r.xpending_range(streams.DEFAULT_KEYS.stream, streams.TRAINER_GROUP, "-", "+", 100)
    pending_ids = {p["message_id"] for p in pending}
    left = {eid for eid, _ in r.xrange(streams.DEFAULT_KEYS.stream)}
    # what the checkpoint holds was acknowledged; what it does not hold is still pending or never read
    assert not {by_entry[e] for e in pending_ids} & consumed
    # and only acknowledged entries were trimmed: every group not in the checkpoint is still there
    assert {e for e, gid in by_entry.items() if gid not in consumed} <= left
    records = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in records] == list(range(1, state["step"] + 1))
    print(f"trainer: exit {took:.1f} s after SIGTERM at step {state['step']}")


def test_dashboard_sigterm_exits(tmp_path: Path) -> None:
    port = free_port()
    svc = Service("dashboard", [*PY_CLI, "dashboard", "serve", "--port", str(port)], tmp_path)
    svc.start()
    try:
        svc.wait_healthy(f"http://127.0.0.1:{port}", 60)
        _listens_on_loopback_only(svc.pid)
        rc, _ = _sigterm_and_time(svc, 15)
        assert rc in CLEAN, svc.log()
    finally:
        svc.stop()


@pytest.mark.slow
def test_llds_up_sigterm_leaves_no_process_behind(tmp_path: Path) -> None:
    cmd = [*PY_CLI, "up", "--preset", "tiny", "--steps", "0", "--run-dir", str(tmp_path / "run"),
           "--retriever-port", "0", "--rollout-port", "0", "--trainer-port", "0", "--dashboard-port", "0",
           "--redis-port", "0"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # its own Redis must go too
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**env, "PYTHONUNBUFFERED": "1"},
                            text=True, start_new_session=True)  # fmt: skip
    lines: list[str] = []
    children: list[psutil.Process] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 300
        for line in proc.stdout:
            lines.append(line)
            if re.match(r"trainer\s+http://\S+/status", line):
                break
            assert time.monotonic() < deadline, "".join(lines[-40:])
        children = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        for part in ("valkey", "retriever serve", "rollout serve", "trainer run", "dashboard serve"):
            assert part in names, (part, names)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=90)
        lines.append(rest)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = "".join(lines[-60:])
    assert proc.returncode == 0 and "all processes stopped" in log, log
    time.sleep(0.5)
    alive = [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running after llds up exited: {alive}"
    print(f"llds up: {len(children)} processes, all gone {took:.1f} s after SIGTERM")
