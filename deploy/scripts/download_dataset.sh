#!/usr/bin/env bash
# Download the Search-R1 training questions (NQ + HotpotQA; parquet with Search-R1 columns) and
# convert them to the JSONL that `llds rollout serve --dataset FILE` reads. Idempotent.
#
#   deploy/scripts/download_dataset.sh /data/datasets/nq_hotpotqa_train
#   -> train.jsonl, test.jsonl
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=deploy/scripts/_common.sh
source "$here/_common.sh"

out=${1:?usage: download_dataset.sh OUT_DIR}
repo=${SEARCH_R1_DATASET_REPO:-PeterJinGo/nq_hotpotqa_train}
pyarrow_pin=${PYARROW_VERSION:-26.0.1}

if [[ -s $out/train.jsonl && -s $out/test.jsonl ]]; then
    log "$repo already in $out"
    exit 0
fi
hf_download "$repo" dataset "$out" "*.parquet"
[[ -s $out/train.parquet ]] || die "$repo has no train.parquet"

# The images do not ship pyarrow; it is only needed for this one conversion.
if ! python3 -c "import pyarrow" 2>/dev/null; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    log "installing pyarrow==$pyarrow_pin into $tmp for the conversion"
    python3 -m pip install --quiet --no-cache-dir --target "$tmp" "pyarrow==$pyarrow_pin"
    export PYTHONPATH="$tmp${PYTHONPATH:+:$PYTHONPATH}"
fi
for split in train test; do
    if [[ -s $out/$split.parquet ]]; then
        python3 "$here/parquet_to_jsonl.py" "$out/$split.parquet" "$out/$split.jsonl"
    fi
done
log "done: $out/train.jsonl"
