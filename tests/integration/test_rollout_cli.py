"""The rollout entrypoints as users run them: ``python -m llds_rollout serve`` and ``llds answer``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from llds_rollout.cli import answer_main, serve_main
from llds_server.http import BackgroundServer, free_port

pytestmark = pytest.mark.integration


def hamlet_retriever() -> FastAPI:
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve(body: dict[str, Any]) -> dict[str, Any]:
        doc = {"id": "d1", "contents": '"Hamlet"\nA play by William Shakespeare.'}
        return {"result": [[{"document": doc, "score": 1.0}] for _ in body["queries"]]}

    return app


@pytest.fixture(scope="module")
def retriever_url() -> Iterator[str]:
    with BackgroundServer(hamlet_retriever()) as srv:
        yield srv.url


def test_config_errors_fail_before_loading_anything(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert serve_main(["--model", "m"]) == 2  # training without a dataset
    assert "needs a dataset" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("group_size = 0\n")
    assert serve_main(["--config", str(bad), "--model", "m", "--no-train"]) == 2
    assert "group_size" in capsys.readouterr().err
    assert answer_main([" "]) == 2


@pytest.mark.slow
def test_serve_and_answer_through_the_service(
    tiny_model_dir: Path, retriever_url: str, tmp_path: Path
) -> None:
    port = free_port()
    cfg = Path(__file__).parents[2] / "configs" / "rollout_cpu.toml"
    env = {**os.environ, "LLDS_ADMIN_TOKEN": "t"}
    args = ["--config", str(cfg), "--engine", "transformers", "--model", str(tiny_model_dir), "--retriever-url", retriever_url,
            "--port", str(port), "--no-train", "--write-config", str(tmp_path / "resolved.toml")]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "llds_rollout", "serve", *args], env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "service did not come up"
            time.sleep(0.2)
        resolved = (tmp_path / "resolved.toml").read_text()
        # The secret is left out (it comes from the environment again); lookalike keys are kept.
        assert "group_size = 4" in resolved and "max_tokens_per_turn = 96" in resolved
        assert "admin_token" not in resolved
        assert answer_main(["--rollout-url", url, "--max-turns", "1", "who wrote hamlet"]) == 0
    finally:
        proc.terminate()
        proc.wait(30)
    assert answer_main(["--rollout-url", url, "who wrote hamlet"]) == 1  # gone: a clear error, not a hang


def test_answer_in_process(
    tiny_model_dir: Path, retriever_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = Path(__file__).parents[2] / "configs" / "rollout_cpu.toml"
    code = answer_main(["--config", str(cfg), "--engine", "transformers", "--model", str(tiny_model_dir), "--retriever-url", retriever_url,
                        "--max-turns", "1", "--json", "who wrote hamlet"])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert '"weights_version": 0' in out and '"turns"' in out
