#!/usr/bin/env bash
# The GPU check: one call, a few minutes (480 s budget), one PASS/FAIL/SKIP line per part, on a machine
# with a GPU (llds_bench/gpu_check.py, docs/gpu-check.md):
#   versions   torch, CUDA, vLLM, transformers, faiss against the GPU images' pins
#   faiss      GPU search through the retriever's placement (skipped: faiss without GPU support)
#   prepare    random Qwen2.5-3B weights with the Qwen2.5 tokenizer, and a second version published
#   placement  llds up's children on 1 and 2 GPUs (CUDA_VISIBLE_DEVICES, resolved configs, probed)
#   trainer    configs/trainer_search_r1.toml at the longest trajectory the rollout preset allows:
#              tokens/s, MFU, peak memory against llds_bench.memory's estimate
#   vllm       the rollout service on vLLM: start, /v1, decode tokens/s, in-place swap (time) with a
#              /v1 request in flight, the output changing with the weights
# Needs PyTorch with CUDA, transformers, vLLM (the rollout image has all three) and this repository's
# dependencies; no network, no model download. Runs from a checkout (no install). Exit 1 when a part failed.
#
#   scripts/gpu-check.sh                                  # writes docs/gpu_check_bench.md and .json
#   scripts/gpu-check.sh --skip vllm --out /tmp/gc.md    # extra flags go to python -m llds_bench.gpu_check
#   PYTHON=/opt/venv/bin/python scripts/gpu-check.sh     # another interpreter (default: .venv, python3)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="proto:services/common:services/retriever:services/rollout:services/trainer:launcher:benchmarks${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

missing=$("$PYTHON" -c '
import importlib.util
need = ("torch", "transformers", "safetensors", "pydantic", "pydantic_settings", "tomli_w", "httpx")
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))')
if [ -n "$missing" ]; then
    echo "gpu-check: $PYTHON cannot import: $missing" >&2
    exit 2
fi
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu-check: torch ($PYTHON) sees no CUDA device" >&2
    exit 2
fi

exec "$PYTHON" -m llds_bench.gpu_check --device cuda --budget-s 480 --out docs/gpu_check_bench.md "$@"
