#!/usr/bin/env bash
# The trainer's one-command GPU check: Qwen2.5-3B's architecture with random weights, bf16 with
# gradient checkpointing, on one GPU at Search-R1's sequence length (4096 tokens), GRPO and
# GRPO + LLDS; reports trainer tokens/s, MFU, the LLDS/GRPO step-time ratio, peak GPU memory and the
# checkpoint's write time and size, and fails when the whole run takes more than 8 minutes.
# Needs PyTorch with CUDA, transformers and this repository's pure-Python dependencies (pydantic,
# pydantic-settings, tomli-w); no vLLM, no network, no model download. Runs from a checkout (no install).
#
#   scripts/gpu-check.sh                                  # writes docs/trainer_gpu_bench.md and .json
#   scripts/gpu-check.sh --shape qwen2.5-7b --out /tmp/7b.md   # extra flags go to `llds bench trainer`
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
need = ("torch", "transformers", "safetensors", "pydantic", "pydantic_settings", "tomli_w", "tqdm")
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))')
if [ -n "$missing" ]; then
    echo "gpu-check: $PYTHON cannot import: $missing" >&2
    exit 2
fi
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu-check: torch ($PYTHON) sees no CUDA device" >&2
    exit 2
fi

exec "$PYTHON" -m llds.cli bench trainer --device cuda --shape qwen2.5-3b --random-weights \
    --budget-s 480 --out docs/trainer_gpu_bench.md "$@"
