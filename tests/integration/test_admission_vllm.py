"""Staleness at admission, audited end to end on the default engine (vLLM): the real rollout service
on vLLM and the real trainer, each its own process, a real Valkey, K = 1, the derived backpressure
on, several steps with weight swaps; every acknowledged group within K of the trainer's version then,
no stale drop at either side (the audit is :func:`test_admission_services.run_admission_audit`).

Needs vLLM: ``make test-vllm`` runs this file in ``.venv-vllm``; the main environment skips it.
The rollout's engine start (~1 min on 2 cores) dominates its run time.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from test_admission_services import run_admission_audit

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not importable in this environment; `make test` runs these in .venv-vllm (make test-vllm)",
    ),
]


def test_admission_keeps_every_trained_group_within_k_vllm(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    run_admission_audit(tiny_model_dir, redis_url, tmp_path, engine="vllm", steps=5)
