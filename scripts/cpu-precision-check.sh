#!/usr/bin/env bash
# float32 vs bfloat16 autocast of the CPU preset's model on this host's CPU, pinned to 2 cores (the
# development machines' size): for CPUs with native bfloat16 (AVX512-BF16, AMX), which the project's
# own 2-core machines do not always have. Needs only torch and transformers.
#
#   scripts/cpu-precision-check.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-.}}
export PYTHONPATH=benchmarks:services/trainer PYTHONUNBUFFERED=1
grep -m1 "model name" /proc/cpuinfo || true
echo "cores: $(nproc)"
grep -o -w -E "avx512_bf16|amx_bf16|amx_tile|avx512f" /proc/cpuinfo | sort | uniq -c || true
taskset -c 0,1 python3 -m llds_bench.precision --threads 2 --json "$out/precision_2cores.json"
