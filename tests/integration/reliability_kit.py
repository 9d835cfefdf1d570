"""Helpers of the reliability tests (faults, fuzzing, security, shutdown, load): real services as
child processes in their own session, a forced-search engine for the in-process rollout, waiting.

Not a test module; imported by ``test_faults_*``, ``test_fuzz_*``, ``test_security_*``,
``test_shutdown_*`` and ``test_load_*``.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from llds_server.http import free_port

PY_CLI = [sys.executable, "-m", "llds.cli"]
QUESTION = "Who founded the Kreixvelor Academy?"


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    """Poll ``cond`` until truthy; HTTP/OS errors count as not yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            v = cond()
            if v:
                return v
        except (httpx.HTTPError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def idle_connection_failure(
    url: str, method: str, path: str, body: bytes | None = None, idle_s: float = 6.0
) -> str | None:
    """Send one request twice on one TCP connection, idle ``idle_s`` in between: why the second was
    not answered 200, or None when it was.

    An agent keeps its connection across a generation turn, and a loaded client can take seconds
    between a response and its next request; uvicorn's own default closes an idle connection after
    5 s, and the request then written into it fails (``http.client`` does not reconnect by itself).
    """
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        for i in range(2):
            if i:
                time.sleep(idle_s)
            try:
                conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
            except (OSError, http.client.HTTPException) as e:
                return f"request {i + 1}: {e!r}"
            if r.status != 200:
                return f"request {i + 1}: HTTP {r.status}"
    finally:
        conn.close()
    return None


class Service:
    """A service started as ``python -m llds.cli ...`` in its own process group, logging to a file."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None):
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}.log"
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, preexec_fn: Callable[[], None] | None = None) -> Service:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return "(no log)"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self, url: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.running(), (
                f"{self.name} exited with {self.proc and self.proc.returncode}:\n{self.log()}"
            )
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{self.name} not healthy after {timeout_s:.0f} s:\n{self.log()}")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def kill9(self) -> None:
        """SIGKILL the whole process group (the service and anything it spawned)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL of the group after ``timeout_s``; always reaps. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.proc.wait()


def world_index() -> tuple[Path, Path]:
    """(world dir, BM25 index dir) of the synthetic world, built once into the cache."""
    from llds.up import ensure_world, ensure_world_index

    return ensure_world(0), ensure_world_index(0)


def retriever_service(log_dir: Path, port: int | None = None, name: str = "retriever") -> tuple[Service, str]:
    """The real retriever over the synthetic world's BM25 index (not started yet)."""
    _, index = world_index()
    port = port or free_port()
    argv = [*PY_CLI, "retriever", "serve", "--index", str(index), "--port", str(port)]
    return Service(
        name, argv, log_dir, {"LLDS_RETRIEVER_BACKEND__TORCH_THREADS": "1"}
    ), f"http://127.0.0.1:{port}"


class ForcedModel:
    """The real model, plus a +1000 logit bias on ``script[position]`` at those absolute positions."""

    def __init__(self, model: Any, script: dict[int, int]) -> None:
        self.model, self.script = model, script

    def __call__(self, **kw: Any) -> Any:
        out = self.model(**kw)
        for row, p in enumerate(kw["position_ids"][:, -1].tolist()):
            if (tok := self.script.get(p + 1)) is not None:
                out.logits[row, -1, tok] += 1000.0
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def searching_engine(model_dir: Path, question: str, query: str = "Kreixvelor Academy founder") -> Any:
    """The real transformers engine whose first turn on ``question`` is always a search for ``query``."""
    from transformers import AutoTokenizer

    from llds_proto.search_protocol import prompt_ids
    from llds_rollout.engine.hf import TransformersEngine

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    prompt = prompt_ids(tok, question)
    search = tok.encode(f"<search> {query} </search>", add_special_tokens=False)
    script = {len(prompt) + i: t for i, t in enumerate(search)}

    class _Engine(TransformersEngine):
        def start(self) -> None:
            super().start()
            self.model = ForcedModel(self.model, script)

    return _Engine(str(model_dir), max_batch_size=8)
