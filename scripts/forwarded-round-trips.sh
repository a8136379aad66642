#!/usr/bin/env bash
# Counts the database statements a node makes to answer requests for a session another node
# owns. Starts a throwaway PostgreSQL cluster that logs every statement (`log_statement=all`,
# each line marked with the connection's application name), and two dormant-server nodes of
# BINARY on it (each connects as its own application, `a` and `b`). SESSIONS demo sessions
# start on A and wait on `ask_user`; each is then answered through B: the answer
# (`POST /submit-tool-result`), the resume (`POST /resume`), its stream (`GET /sse` of the
# session at rest), and the approval with its resume (`POST /submit-tool-result?resume=true`).
# For each request, the statements B's connections ran while it was answered are counted
# (B's background work left out: its liveness renewal, its look at the deadline index, the
# tombstone reaper's reads and lease).
# Prints one line per request kind: the count for each session, and the statements of the
# last one. PAUSE=SECONDS waits that long before each request (a node may remember what it
# looked up a moment ago: with PAUSE=2, each request is counted as if it came alone).
#
# usage: [SESSIONS=N] [PAUSE=S] scripts/forwarded-round-trips.sh BINARY
#   scripts/forwarded-round-trips.sh target/debug/dormant-server
set -euo pipefail

if [[ $# -ne 1 ]]; then
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
binary=$(realpath "$1")
sessions=${SESSIONS:-5}
pause=${PAUSE:-0}
pg_bin=${PG_BIN:-$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)")}
dir=$(mktemp -d)
as_postgres=()
if [[ $(id -u) -eq 0 ]]; then
    chown postgres "$dir"
    as_postgres=(runuser -u postgres --)
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    "${as_postgres[@]}" "$pg_bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT

"${as_postgres[@]}" "$pg_bin/initdb" -A trust -U postgres -E UTF8 --no-sync -D "$dir/data" >/dev/null
"${as_postgres[@]}" "$pg_bin/pg_ctl" -w -D "$dir/data" -l "$dir/pg.log" \
    -o "-p $port -c listen_addresses=127.0.0.1 -k $dir -c log_statement=all -c log_line_prefix='%a|'" \
    start >/dev/null
log=$dir/pg.log

node() {
    local name=$1 listen=$2
    RUST_LOG=error "$binary" --listen "$listen" --demo --allow-unauthenticated \
        --store "postgres://postgres@127.0.0.1:$port/postgres?application_name=$name" \
        --token-key-file "$dir/token.key" --node-name "$name" --lease-ttl-ms 600000 \
        >"$dir/$name.out" 2>&1 &
    pids+=($!)
}
a=127.0.0.1:$(free_port)
node a "$a"
for _ in $(seq 100); do curl -sf "http://$a/healthz" >/dev/null && break; sleep 0.1; done
b=127.0.0.1:$(free_port)
node b "$b"
for _ in $(seq 100); do curl -sf "http://$b/healthz" >/dev/null && break; sleep 0.1; done

# Waits until the session waits on the tool named $3 (asked of A), and prints that call.
waiting() {
    local id=$1 token=$2 tool=$3
    for _ in $(seq 200); do
        local call
        call=$(curl -sf "http://$a/status?session_id=$id" -H "authorization: Bearer $token" |
            jq -c --arg tool "$tool" '.pending[]? | select(.tool_name == $tool and .waiting)')
        if [[ -n $call ]]; then
            echo "$call"
            return
        fi
        sleep 0.05
    done
    echo "the session never waited on $tool" >&2
    exit 1
}

# Runs a request (its arguments are curl's) and prints how many statements B's connections
# ran meanwhile, then those statements (one a line).
counted() {
    local before after
    sleep "$pause"
    before=$(wc -l <"$log")
    curl -sf -o /dev/null "$@"
    sleep 0.05
    after=$(wc -l <"$log")
    sed -n "$((before + 1)),${after}p" "$log" | python3 -c '
import sys
lines, keep = sys.stdin.read().splitlines(), []
for i, line in enumerate(lines):
    if not line.startswith("b|") or ("statement:" not in line and "execute" not in line):
        continue
    detail = lines[i + 1] if i + 1 < len(lines) else ""
    text = line.split("LOG:", 1)[-1].strip()
    # B on its own: renewing its liveness, looking at the deadline index (tree 3), reaping
    # tombstones (trees 5 and 6) and trying the lease of the reaper (named by a control
    # character). No request reads a range of those trees.
    if "UPDATE dormant_nodes" in text:
        continue
    if "ORDER BY key LIMIT" in text and any(
        "$1 = '"'"'%d'"'"'" % tree in detail for tree in (3, 5, 6)
    ):
        continue
    if "dormant_leases" in text and "reaper" in detail:
        continue
    keep.append(text)
print(len(keep))
for text in keep:
    print("    " + text[:150])
'
}

declare -A counts last
record() {
    local kind=$1 out
    shift
    out=$(counted "$@")
    counts[$kind]+="$(head -n 1 <<<"$out") "
    last[$kind]=$(tail -n +2 <<<"$out")
}

for _ in $(seq "$sessions"); do
    started=$(curl -sf "http://$a/start" -H 'content-type: application/json' \
        -d '{"agent":"demo","message":"weather in Porto"}')
    id=$(jq -r .session_id <<<"$started")
    token=$(jq -r .token <<<"$started")
    auth=(-H "authorization: Bearer $token" -H 'content-type: application/json')
    ask=$(waiting "$id" "$token" ask_user)
    answer=$(jq -c --arg id "$id" '{session_id: $id, tool_call_id: .tool_call_id, result: {answer: "Porto"}}' <<<"$ask")
    record submit "${auth[@]}" -X POST "http://$b/submit-tool-result" -d "$answer"
    record resume "${auth[@]}" -X POST "http://$b/resume" -d "{\"session_id\":\"$id\"}"
    publish=$(waiting "$id" "$token" publish)
    record sse "${auth[@]}" "http://$b/sse?session_id=$id"
    approval=$(jq -c --arg id "$id" '{kind: "approval-response", session_id: $id, tool_call_id: .tool_call_id, approval_id: .approval_id, approved: true}' <<<"$publish")
    record submit_resume "${auth[@]}" -X POST "http://$b/submit-tool-result?resume=true" -d "$approval"
done
owner=$("${as_postgres[@]}" "$pg_bin/psql" -h "$dir" -p "$port" -U postgres -Atc \
    "SELECT string_agg(DISTINCT owner, ',') FROM dormant_leases WHERE ascii(session) > 31")
echo "lease owners at the end: $owner (A kept its sessions)"
for kind in submit resume sse submit_resume; do
    echo "$kind: ${counts[$kind]}statements on B, each session; the last:"
    echo "${last[$kind]}"
done
