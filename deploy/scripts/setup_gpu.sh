#!/usr/bin/env bash
# One-shot preparation of the GPU path (the `setup` service in docker-compose.yml, the llds-setup
# Job in the k8s gpu overlay): the policy checkpoint, the Search-R1 training questions (as JSONL)
# and the wiki-18 corpus with its e5 flat index, which the retriever serves as published
# (`llds retriever serve --faiss-index ... --corpus ...`). Each step is skipped if already done.
# Needs ~170 GB of free disk at the peak (~100 GB when done) and hours of download.
#
#   LLDS_MODEL=SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA deploy/scripts/setup_gpu.sh /data
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=deploy/scripts/_common.sh
source "$here/_common.sh"

data=${1:-/data}
model=${LLDS_MODEL:?set LLDS_MODEL to a Hugging Face model repository}

"$here/download_model.sh" "$model" "$data/models"
"$here/download_dataset.sh" "$data/datasets/nq_hotpotqa_train"
"$here/download_wiki18.sh" "$data/indexes/wiki18"
log "ready: model $data/models/$model, questions $data/datasets/nq_hotpotqa_train/train.jsonl," \
    "corpus + index $data/indexes/wiki18"
