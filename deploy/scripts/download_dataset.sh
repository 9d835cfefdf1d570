#!/usr/bin/env bash
# Download the Search-R1 training questions (NQ + HotpotQA) and its merged seven-set test file into
# OUT_DIR, as parquet and as the JSONL that `llds rollout serve --dataset FILE` reads. A thin wrapper
# over `llds data fetch search-r1 --only train`, which resumes, checks and records every file (in
# OUT_DIR/../fetch.lock.json; see docs/data.md). Idempotent: a second run downloads nothing.
#
#   deploy/scripts/download_dataset.sh /data/datasets/nq_hotpotqa_train
#   -> train.jsonl, test.jsonl (and train.parquet, test.parquet)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=deploy/scripts/_common.sh
source "$here/_common.sh"

out=${1:?usage: download_dataset.sh OUT_DIR (ending in /nq_hotpotqa_train)}
out=${out%/}
[[ $(basename "$out") == nq_hotpotqa_train ]] ||
    die "OUT_DIR must end in /nq_hotpotqa_train, the folder llds data fetch writes: $out"
root=$(dirname "$out")

adopt=()
if [[ ! -f $root/fetch.lock.json ]]; then
    # Files of this script's earlier, lock-less version (each written whole, then renamed into
    # place) are recorded as they are rather than fetched again.
    adopt=(--adopt)
fi
llds data fetch search-r1 --only train --out "$root" --no-progress "${adopt[@]}"
log "done: $out/train.jsonl"
