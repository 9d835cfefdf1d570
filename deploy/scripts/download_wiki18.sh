#!/usr/bin/env bash
# Download the Search-R1 wiki-18 corpus and its e5 flat FAISS index into OUT_DIR: wiki-18.jsonl
# (21M passages, ~14 GB) and e5_Flat.index (~65 GB, 768-dim intfloat/e5-base-v2 embeddings, row i =
# corpus line i), then write OUT_DIR/COMPLETE, which the retriever's init containers wait for. A thin
# wrapper over `llds data fetch search-r1 --only corpus index`, which resumes, checks and records
# every file (in OUT_DIR/../fetch.lock.json; see docs/data.md). Idempotent: a second run downloads
# nothing. Peak disk ~145 GB (index parts + joined index + corpus); ~80 GB once done.
#
#   deploy/scripts/download_wiki18.sh /data/indexes/wiki18
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=deploy/scripts/_common.sh
source "$here/_common.sh"

out=${1:?usage: download_wiki18.sh OUT_DIR (ending in /wiki18)}
out=${out%/}
[[ $(basename "$out") == wiki18 ]] || die "OUT_DIR must end in /wiki18, the folder llds data fetch writes: $out"
root=$(dirname "$out")

adopt=()
if [[ ! -f $root/fetch.lock.json ]]; then
    # Files of this script's earlier, lock-less version (each written whole, then renamed into
    # place) are recorded as they are rather than fetched again.
    adopt=(--adopt)
fi
if [[ ! -f $out/COMPLETE && -z ${SKIP_DISK_CHECK:-} ]]; then
    require_free_gib "$root" 145
fi
llds data fetch search-r1 --only corpus index --out "$root" --no-progress "${adopt[@]}"

printf '{"corpus": "%s", "index": "%s", "encoder": "intfloat/e5-base-v2"}\n' \
    PeterJinGo/wiki-18-corpus PeterJinGo/wiki-18-e5-index > "$out/COMPLETE"
log "done: $out/wiki-18.jsonl $out/e5_Flat.index"
