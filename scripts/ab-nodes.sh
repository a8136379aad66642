#!/usr/bin/env bash
# Compares the suspension cycle over HTTP on several PostgreSQL node processes for several
# simulator binaries (`simulate --postgres URL --nodes N ...`), each run beside its own sled
# node, in an order rotated by one every round (see scripts/ab-cycles.sh for why), each on a
# database made afresh. Prints each run's line "PostgreSQL / sled: RATIO (mean cycles/s PG /
# SLED)": compare the PostgreSQL cycles/s across binaries, and each ratio within its run.
#
# usage: scripts/ab-nodes.sh ROUNDS ADMIN_URL BINARY... [-- SIMULATOR FLAGS]
#   ADMIN_URL: a PostgreSQL server where database `dormant_ab` may be dropped and created
#   (through `psql`). The flags default to `--nodes 2 --cross-node` (answers sent to the node
#   that does not own the session); the run is always `--sessions 2000 --concurrency 200
#   --http-rounds 2`.
#   scripts/ab-nodes.sh 4 postgres://postgres@127.0.0.1:5432/postgres /tmp/sim-before /tmp/sim-after
set -euo pipefail

if [[ $# -lt 3 ]]; then
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
rounds=$1
admin=$2
shift 2
if [[ ! $rounds =~ ^[1-9][0-9]*$ ]]; then
    echo "ROUNDS must be a positive whole number, not '$rounds'" >&2
    exit 2
fi
command -v psql >/dev/null || {
    echo "psql is needed to make the database afresh (Debian: apt-get install postgresql-client)" >&2
    exit 2
}
binaries=()
while [[ $# -gt 0 && $1 != "--" ]]; do
    binaries+=("$1")
    shift
done
[[ $# -gt 0 ]] && shift
flags=("$@")
[[ ${#flags[@]} -eq 0 ]] && flags=(--nodes 2 --cross-node)
count=${#binaries[@]}
url="${admin%/*}/dormant_ab"

for ((round = 0; round < rounds; round++)); do
    for ((slot = 0; slot < count; slot++)); do
        binary=$(((round + slot) % count))
        PGOPTIONS="-c client_min_messages=warning" psql -q "$admin" -c "DROP DATABASE IF EXISTS dormant_ab" \
            -c "CREATE DATABASE dormant_ab" -c "CHECKPOINT" >/dev/null
        if ! report=$("${binaries[$binary]}" --postgres "$url" --sessions 2000 --concurrency 200 \
            --http-rounds 2 "${flags[@]}" 2>&1); then
            echo "binary $binary (${binaries[$binary]}) failed:" >&2
            tail -5 <<<"$report" >&2
            exit 1
        fi
        printf 'round %d  binary %d  %s\n' "$round" "$binary" "$(grep -E 'PostgreSQL / sled' <<<"$report")"
    done
done
