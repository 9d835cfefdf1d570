"""``llds serve MODEL_DIR`` for real (issue 29, item 7): the tiny model on the transformers engine, the
synthetic world's BM25 retriever; ``/answer`` and ``/agent/v1`` answer, no trainer, Redis or dashboard
process exists, and Ctrl-C leaves nothing running."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import httpx
import pytest
from up_kit import LldsProcess, wait_gone

from llds import assets

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_llds_serve_answers_and_trains_nothing(tmp_path: Path) -> None:
    light = tmp_path / "rollout.toml"
    light.write_text(
        (REPO / "configs" / "rollout_tiny.toml")
        .read_text()
        .replace("[engine]", '[engine]\ntype = "transformers"')
    )
    model = assets.tiny_model_dir()
    proc = LldsProcess(["serve", str(model), "--preset", "tiny", "--rollout-config", str(light), "--run-dir",
                        str(tmp_path / "run"), "--retriever-port", "0", "--rollout-port", "0"])  # fmt: skip
    try:
        url = proc.wait_line(r"^rollout\s+(http://\S+)/answer", 300).group(1)
        proc.wait_line(rf"^\s+{re.escape(url)}/agent/v1 ", 30)
        proc.wait_line(r"serving \(nothing trains\)", 30)
        cmdlines = [" ".join(p.cmdline()) for p in proc.descendants()]
        assert any("retriever serve" in c for c in cmdlines) and any("rollout serve" in c for c in cmdlines)
        assert not [c for c in cmdlines if re.search(r"trainer run|dashboard serve|valkey|redis-server", c)]
        r = httpx.post(
            f"{url}/answer", json={"question": "In what year was Kouthsairk Veirkvurk born"}, timeout=120
        )
        assert r.status_code == 200, r.text
        assert isinstance(r.json()["answer"], str | None) and r.json()["turns"]
        served = httpx.get(f"{url}/agent/v1/models", timeout=30).json()["data"][0]["id"]
        chat = {"model": served, "messages": [{"role": "user", "content": "Who founded Kreixvelor Academy?"}]}
        r = httpx.post(f"{url}/agent/v1/chat/completions", json=chat, timeout=120)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant", r.text
        children = proc.descendants()
        proc.proc.send_signal(signal.SIGINT)
        assert proc.wait_exit(90) == 0, proc.output()
        assert not wait_gone(children), proc.output()
        assert "all processes stopped" in proc.output()
    finally:
        proc.stop()
