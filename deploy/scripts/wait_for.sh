#!/usr/bin/env bash
# Block until every given path exists (an init container's job: wait for the setup Job's outputs
# instead of crash-looping the service). Gives up after WAIT_TIMEOUT_S seconds (default 6 h).
#
#   deploy/scripts/wait_for.sh /data/models/ORG/NAME/config.json /data/indexes/wiki18/e5_Flat.index
set -euo pipefail
(( $# > 0 )) || { echo "usage: wait_for.sh PATH..." >&2; exit 2; }
deadline=$(( $(date +%s) + ${WAIT_TIMEOUT_S:-21600} ))
for path in "$@"; do
    until [[ -e $path ]]; do
        if (( $(date +%s) > deadline )); then
            echo "gave up waiting for $path" >&2
            exit 1
        fi
        echo "waiting for $path" >&2
        sleep 15
    done
done
