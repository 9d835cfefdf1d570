#!/usr/bin/env bash
# Download a policy checkpoint (a Hugging Face model repository) into a plain local folder, the
# form `llds rollout serve --model DIR` and `llds trainer run --model DIR` take. Idempotent.
#
#   deploy/scripts/download_model.sh SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA /data/models
#   -> /data/models/SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=deploy/scripts/_common.sh
source "$here/_common.sh"

repo=${1:?usage: download_model.sh HUB_REPO MODELS_DIR}
models=${2:?usage: download_model.sh HUB_REPO MODELS_DIR}
dest="$models/$repo"

if [[ -f $dest/config.json && -f $dest/COMPLETE ]]; then
    log "$repo already in $dest"
    exit 0
fi
if [[ -z ${SKIP_DISK_CHECK:-} ]]; then
    require_free_gib "$models" 20
fi
hf_download "$repo" model "$dest" "*.json" "*.safetensors" "*.txt" "*.model" "*.tiktoken" "*.jinja"
[[ -f $dest/config.json ]] || die "$repo has no config.json: not a Hugging Face model folder"
compgen -G "$dest/*.safetensors" >/dev/null || die "$repo has no safetensors weights"
date -u +%Y-%m-%dT%H:%M:%SZ > "$dest/COMPLETE"
log "done: $dest"
