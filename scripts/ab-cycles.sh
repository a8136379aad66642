#!/usr/bin/env bash
# Compares the suspension cycles/s of several `hitl` bench binaries or settings at 10,000
# concurrent sessions, on a machine too noisy for one run of each to mean anything.
#
# Each round runs every configuration once (`HITL_ONLY=cycles`, about 10 s each), in an order
# rotated by one every round, so that no configuration always runs first: with a fixed order,
# the configuration run first came out slowest in seven rounds of eight, and an identical one
# run third was 1.5x faster on average. Even rotated, two identical configurations differed
# by 17 % in their means over six rounds (BENCHMARKS.md, session 7), so a difference smaller
# than that needs more rounds. Prints one line per run, then each configuration's mean,
# median, lowest and highest for the burst row (10,000 cycles) and the steady row (30,000).
#
# usage: scripts/ab-cycles.sh ROUNDS CONFIG...
#   CONFIG is a command that runs a hitl bench binary, with any environment in front:
#   scripts/ab-cycles.sh 8 /tmp/hitl-before /tmp/hitl-after
#   scripts/ab-cycles.sh 8 "env A=1 /tmp/hitl" "env MIMALLOC_PURGE_DELAY=-1 /tmp/hitl"
#   (build one with `cargo bench --bench hitl --no-run` and copy the binary it names.)
set -euo pipefail

if [[ $# -lt 2 ]]; then
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
rounds=$1
shift
if [[ ! $rounds =~ ^[1-9][0-9]*$ ]]; then
    echo "ROUNDS must be a positive whole number, not '$rounds'" >&2
    exit 2
fi
configs=("$@")
count=${#configs[@]}

results=$(mktemp)
trap 'rm -f "$results"' EXIT

for ((round = 0; round < rounds; round++)); do
    for ((slot = 0; slot < count; slot++)); do
        config=$(((round + slot) % count))
        # Word splitting is wanted: a config is a command line.
        # shellcheck disable=SC2086
        if ! rows=$(HITL_ONLY=cycles ${configs[$config]} --bench 2>/dev/null | grep '^| 10000 |'); then
            echo "config $config (${configs[$config]}) failed or printed no 10,000-session rows" >&2
            exit 1
        fi
        burst=$(awk -F'|' 'NR == 1 { print $4 + 0 }' <<<"$rows")
        steady=$(awk -F'|' 'NR == 2 { print $4 + 0 }' <<<"$rows")
        printf 'round %d  slot %d  config %d  burst %6s/s  steady %6s/s\n' \
            "$round" "$slot" "$config" "$burst" "$steady"
        printf '%d %s %s\n' "$config" "$burst" "$steady" >>"$results"
    done
done

# mean, median, lowest and highest of column $2 of config $1's runs
stats() {
    awk -v config="$1" -v column="$2" '$1 == config { print $column }' "$results" | sort -n |
        awk '{ value[NR] = $1; sum += $1 }
            END {
                median = NR % 2 ? value[(NR + 1) / 2] : (value[NR / 2] + value[NR / 2 + 1]) / 2
                printf "%6d %6d %6d %6d", sum / NR, median, value[1], value[NR]
            }'
}

echo
echo "cycles/s at 10,000 sessions: mean median lowest highest"
for ((config = 0; config < count; config++)); do
    echo "config $config: ${configs[$config]}"
    echo "  burst  $(stats "$config" 2)"
    echo "  steady $(stats "$config" 3)"
done
