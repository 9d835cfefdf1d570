"""`llds eval` is deterministic: two runs over the same local set give the same answers and scores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _eval(model: Path, out: Path) -> dict:
    # the light backend: determinism of our evaluation, not of vLLM (its greedy runs are tested apart)
    cmd = [sys.executable, "-m", "llds.cli", "eval", "--engine", "transformers", "--model", str(model),
           "--data", "synthworld-eval", "--limit", "4", "--max-turns", "2", "--concurrency", "4", "--out", str(out)]  # fmt: skip
    # the random tiny model never emits a stop string: cap its turns so each question is short
    env = {**os.environ, "LLDS_ROLLOUT_MAX_TOKENS_PER_TURN": "24"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return json.loads((out / "eval.json").read_text())


def test_eval_twice_gives_identical_results(tiny_model_dir: Path, tmp_path: Path) -> None:
    a = _eval(tiny_model_dir, tmp_path / "a")
    b = _eval(tiny_model_dir, tmp_path / "b")
    assert a["summary"] == b["summary"]
    strip = lambda ex: {k: v for k, v in ex.items() if k != "weights_version"}  # noqa: E731
    assert [strip(e) for e in a["examples"]["synthworld-eval"]] == [
        strip(e) for e in b["examples"]["synthworld-eval"]
    ]
    assert a["summary"][0]["n"] == 4
    assert (tmp_path / "a" / "eval.md").read_text().startswith("# Evaluation")
