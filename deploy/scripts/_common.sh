#!/usr/bin/env bash
# Helpers sourced by the download scripts: logging, free-disk checks, the Hugging Face CLI.

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

die() {
    log "error: $*"
    exit 1
}

# require_free_gib DIR GIB: fail early rather than fill the disk halfway through a download.
require_free_gib() {
    local dir=$1 want=$2 have
    mkdir -p "$dir"
    have=$(df -Pk "$dir" | awk 'NR == 2 { print int($4 / 1048576) }')
    if (( have < want )); then
        die "$dir has ${have} GiB free; this step needs about ${want} GiB (set SKIP_DISK_CHECK=1 to try anyway)"
    fi
    log "$dir: ${have} GiB free (needs ~${want} GiB)"
}

# hf_download REPO TYPE DEST [FILE...]: resumable download of files of a Hugging Face repository.
hf_download() {
    local repo=$1 type=$2 dest=$3
    shift 3
    local cli
    if command -v hf >/dev/null 2>&1; then
        cli=hf
    elif command -v huggingface-cli >/dev/null 2>&1; then
        cli=huggingface-cli
    else
        die "neither 'hf' nor 'huggingface-cli' is installed (pip install huggingface_hub)"
    fi
    local args=(download "$repo" --repo-type "$type" --local-dir "$dest")
    if [[ -n ${HF_REVISION:-} ]]; then
        args+=(--revision "$HF_REVISION")
    fi
    if (( $# > 0 )); then
        args+=(--include "$@")
    fi
    log "$cli ${args[*]}"
    "$cli" "${args[@]}"
}
