#!/usr/bin/env bash
# Compares simulator binaries on `--http` (suspension cycles over HTTP and SSE against the
# in-process API, SESSIONS sessions a pass (default 20,000), 1,000 at a time, two rounds of
# both passes, about 45 s a run), on a machine too noisy for one run of each to mean
# anything: the in-process rate alone moves by a fifth from run to run, and more in short
# passes. Runs every binary once per round, in an order rotated by one every round, and
# prints one line per run (the run's HTTP / in-process ratio of mean cycles/s, both rates,
# the HTTP submit p99 and stream lag p99), then each binary's mean and range of ratios.
#
# usage: [SESSIONS=N] scripts/ab-http.sh ROUNDS BINARY...
#   scripts/ab-http.sh 5 /tmp/simulate-before /tmp/simulate-after
#   (build one with `cargo build --release --example simulate` and copy
#   target/release/examples/simulate.)
set -euo pipefail

if [[ $# -lt 2 ]]; then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
rounds=$1
shift
sessions=${SESSIONS:-20000}
if [[ ! $sessions =~ ^[1-9][0-9]*$ ]]; then
    echo "SESSIONS must be a positive whole number, not '$sessions'" >&2
    exit 2
fi
if [[ ! $rounds =~ ^[1-9][0-9]*$ ]]; then
    echo "ROUNDS must be a positive whole number, not '$rounds'" >&2
    exit 2
fi
binaries=("$@")
results=$(mktemp)
trap 'rm -f "$results"' EXIT

for ((round = 0; round < rounds; round++)); do
    for ((i = 0; i < ${#binaries[@]}; i++)); do
        binary=${binaries[$(((i + round) % ${#binaries[@]}))]}
        report=$("$binary" --http --sessions "$sessions" --concurrency 1000 --http-rounds 2 --json | tail -n 1)
        line=$(python3 - "$binary" "$report" <<'EOF'
import json, sys
name, report = sys.argv[1], json.loads(sys.argv[2])
mean = lambda passes: sum(p["cycles_per_second"] for p in passes) / len(passes)
http = report["http"]
print(f"{name}\t{report['http_over_in_process']:.3f}\t{mean(http):.0f}\t{mean(report['in_process']):.0f}"
      f"\t{max(p['submit_p99_us'] for p in http) / 1000:.0f}\t{max(p['lag_p99_ms'] for p in http)}")
EOF
)
        echo "$line" | tee -a "$results" | awk -F'\t' '{ printf "%-40s ratio %s  http %s/s  in process %s/s  submit p99 %s ms  lag p99 %s ms\n", $1, $2, $3, $4, $5, $6 }' >&2
    done
done

echo "binary: mean ratio (lowest-highest) over $rounds rounds of $sessions sessions a pass"
for binary in "${binaries[@]}"; do
    awk -F'\t' -v b="$binary" '$1 == b { n++; s += $2; if (n == 1 || $2 < lo) lo = $2; if (n == 1 || $2 > hi) hi = $2 }
        END { printf "%-40s %.3f (%.3f-%.3f)\n", b, s / n, lo, hi }' "$results"
done
