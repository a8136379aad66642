#!/usr/bin/env bash
# Compares the simulator's main job on PostgreSQL for several simulator binaries, beside the
# same job on sled in every round, on a machine too noisy for one run of each to mean
# anything (see scripts/ab-cycles.sh for why the order rotates).
#
# Each round runs every binary once on PostgreSQL (`--postgres`, 2,000 sessions, about 5 s),
# in an order rotated by one every round, each on a database made afresh (a grown table is
# slower to write: the runs would not be alike), then the last binary once on sled. Prints one
# line per run (sessions/s, the database's transactions a session, the end check), then each
# binary's mean and median sessions/s and its mean and median ratio to the same round's sled.
#
# usage: scripts/ab-postgres.sh ROUNDS ADMIN_URL BINARY...
#   ADMIN_URL: a PostgreSQL server where database `dormant_ab` may be dropped and created
#   (through `psql`), e.g. postgres://postgres@127.0.0.1:5432/postgres
#   scripts/ab-postgres.sh 6 postgres://postgres@127.0.0.1:5432/postgres /tmp/sim-before /tmp/sim-after
#   (build one with `cargo build --release --features postgres --example simulate`; the
#   binary is target/release/examples/simulate.)
set -euo pipefail

if [[ $# -lt 3 ]]; then
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
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
binaries=("$@")
count=${#binaries[@]}
# The benchmark's database, on the admin URL's server.
url="${admin%/*}/dormant_ab"

results=$(mktemp)
trap 'rm -f "$results"' EXIT

afresh() {
    PGOPTIONS="-c client_min_messages=warning" psql -q "$admin" -c "DROP DATABASE IF EXISTS dormant_ab" -c "CREATE DATABASE dormant_ab" \
        -c "CHECKPOINT" >/dev/null
}

for ((round = 0; round < rounds; round++)); do
    for ((slot = 0; slot < count; slot++)); do
        binary=$(((round + slot) % count))
        afresh
        if ! report=$("${binaries[$binary]}" --postgres "$url" --sessions 2000 2>&1); then
            echo "binary $binary (${binaries[$binary]}) failed:" >&2
            tail -5 <<<"$report" >&2
            exit 1
        fi
        rate=$(awk '/^sessions\/s:/ { print $2 }' <<<"$report")
        per=$(sed -n 's/^database: .*: \([0-9.]*\) a session$/\1/p' <<<"$report")
        check=$(awk '/^verified:/ { print $2 }' <<<"$report")
        printf 'round %d  binary %d  postgres %5s sessions/s  %s transactions a session  check %s\n' \
            "$round" "$binary" "$rate" "$per" "$check"
        printf 'pg %d %d %s\n' "$round" "$binary" "$rate" >>"$results"
    done
    sled=$("${binaries[$((count - 1))]}" --sessions 2000 2>&1 | awk '/^sessions\/s:/ { print $2 }')
    printf 'round %d  sled (binary %d) %5s sessions/s\n' "$round" "$((count - 1))" "$sled"
    printf 'sled %d %s\n' "$round" "$sled" >>"$results"
done

# mean and median of the numbers on stdin
summary() {
    sort -n | awk '{ value[NR] = $1; sum += $1 }
        END {
            median = NR % 2 ? value[(NR + 1) / 2] : (value[NR / 2] + value[NR / 2 + 1]) / 2
            printf "mean %.2f median %.2f", sum / NR, median
        }'
}

echo
for ((binary = 0; binary < count; binary++)); do
    echo "binary $binary: ${binaries[$binary]}"
    echo "  sessions/s on PostgreSQL: $(awk -v b="$binary" '$1 == "pg" && $3 == b { print $4 }' "$results" | summary)"
    echo "  PostgreSQL / sled:        $(awk -v b="$binary" '
        $1 == "sled" { sled[$2] = $3 }
        $1 == "pg" && $3 == b { pg[$2] = $4 }
        END { for (r in pg) if (sled[r] > 0) print pg[r] / sled[r] }' "$results" | summary)"
done
