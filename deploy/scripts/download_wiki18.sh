#!/usr/bin/env bash
# Download the Search-R1 wiki-18 corpus and its e5 flat FAISS index from the Hugging Face hub, then
# assemble them: OUT/wiki-18.jsonl (21M passages, ~14 GB) and OUT/e5_Flat.index (~65 GB, 768-dim
# intfloat/e5-base-v2 embeddings, row i = corpus line i). Idempotent: finished files are kept.
# Peak disk ~150 GB (index parts + assembled index); ~80 GB once done.
#
#   deploy/scripts/download_wiki18.sh /data/indexes/wiki18
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=deploy/scripts/_common.sh
source "$here/_common.sh"

out=${1:?usage: download_wiki18.sh OUT_DIR}
corpus_repo=${WIKI18_CORPUS_REPO:-PeterJinGo/wiki-18-corpus}
index_repo=${WIKI18_INDEX_REPO:-PeterJinGo/wiki-18-e5-index}

if [[ -s $out/wiki-18.jsonl && -s $out/e5_Flat.index && -f $out/COMPLETE ]]; then
    log "wiki-18 corpus and e5 flat index already in $out"
    exit 0
fi
if [[ -z ${SKIP_DISK_CHECK:-} ]]; then
    require_free_gib "$out" 150
fi
mkdir -p "$out"

if [[ ! -s $out/wiki-18.jsonl ]]; then
    hf_download "$corpus_repo" dataset "$out" "wiki-18.jsonl.gz"
    log "decompressing wiki-18.jsonl.gz"
    gzip -dc "$out/wiki-18.jsonl.gz" > "$out/wiki-18.jsonl.partial"
    mv "$out/wiki-18.jsonl.partial" "$out/wiki-18.jsonl"
    rm -f "$out/wiki-18.jsonl.gz"
fi

if [[ ! -s $out/e5_Flat.index ]]; then
    hf_download "$index_repo" dataset "$out" "part_*"
    shopt -s nullglob
    parts=("$out"/part_*)
    shopt -u nullglob
    (( ${#parts[@]} > 0 )) || die "no index parts (part_*) were downloaded from $index_repo"
    log "assembling e5_Flat.index from ${#parts[@]} parts"
    cat "${parts[@]}" > "$out/e5_Flat.index.partial"
    mv "$out/e5_Flat.index.partial" "$out/e5_Flat.index"
    rm -f "${parts[@]}"
fi

printf '{"corpus": "%s", "index": "%s", "encoder": "intfloat/e5-base-v2"}\n' \
    "$corpus_repo" "$index_repo" > "$out/COMPLETE"
log "done: $out/wiki-18.jsonl $out/e5_Flat.index"
