"""Access logs leave out the polling routes: a real uvicorn server with the shared log config."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx

from llds_server.http import free_port

SERVER = """
import sys, uvicorn
from fastapi import FastAPI
from llds_server.logs import uvicorn_log_config
app = FastAPI()
for path in ("/health", "/metrics", "/answer"):
    app.add_api_route(path, lambda: {"ok": True}, methods=["GET", "POST"])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="info", log_config=uvicorn_log_config())
"""


def test_polling_routes_leave_no_access_line_and_the_rest_do() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url + "/health?probe=1", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None, "server did not start"
                time.sleep(0.1)
        httpx.get(url + "/metrics")
        httpx.post(url + "/health")  # only GETs are polling
        httpx.post(url + "/answer")
        httpx.get(url + "/answer")
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    access = [ln for ln in out.splitlines() if "HTTP/1.1" in ln]
    assert not any('"GET /health' in ln or '"GET /metrics' in ln for ln in access), out
    assert any('"POST /health' in ln for ln in access), out
    assert any('"POST /answer' in ln for ln in access) and any('"GET /answer' in ln for ln in access), out
