#!/usr/bin/env bash
# bench/trace/run.sh — issue 38 §4: a real workload.
#
# Starts `kvpage serve --read-grace-ms 0` on a free loopback port, replays the
# Mooncake conversation trace through it with `kvpage bench trace` at each
# capacity (one namespace each, as fast as it goes), runs the LRU simulation
# (lru_sim.py) at the same capacities, and prints the two hit rates side by
# side (exit 1 when one differs by more than TOLERANCE points). Then finds
# the fastest speed-up whose schedule holds: replays at each of SPEEDUPS and
# prints the lag and whether it held. Last, when this kvpage serve has
# --kv-events, a server of its own publishes its KV events during one more
# replay and events_check.py checks that they rebuild exactly the inventory
# the server ends with (exit 1 when not).
#
#   bench/trace/run.sh [TRACE]          # ~2 minutes on 2 cores
#   SPEEDUPS="" bench/trace/run.sh      # the hit rates only
#
# Why --read-grace-ms 0: the server keeps a page it just answered a lookup for
# from eviction for that long in WALL time (default 5000 ms), so that an
# engine can read it; at a speed-up of 100 that is 500 s of the trace, a
# protection an LRU does not have. With 0 the server is the LRU.
#
# Env: KVPAGE (binary, default build/kvpage), CAPACITIES ("10000 30000 60000
#      inf"), CONNS (connections of the hit-rate replays, 4), SPEEDUPS
#      ("100 250 500 1000 2000 4000"), SPEED_CAPACITY (30000), SPEED_CONNS
#      (16), MAX_LAG_MS (100: the schedule holds while the p99 lag stays
#      within), DATA_DIR (the server's --data-dir, default a temp dir: the
#      log and snapshots as in production; "none": in memory), TOLERANCE
#      (0.5), OUT (also write the JSON of every run to this directory),
#      EVENTS (1: the events check, 0: none; default 1 when serve has
#      --kv-events), EVENTS_CAPACITY (30000), EVENTS_SPEEDUP (0).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
KVPAGE=${KVPAGE:-$REPO/build/kvpage}
TRACE=${1:-$REPO/../shared/data/mooncake_conversation_trace.jsonl}
CAPACITIES=${CAPACITIES:-"10000 30000 60000 inf"}
CONNS=${CONNS:-4}
SPEEDUPS=${SPEEDUPS-"100 250 500 1000 2000 4000"}
SPEED_CAPACITY=${SPEED_CAPACITY:-30000}
SPEED_CONNS=${SPEED_CONNS:-16}
MAX_LAG_MS=${MAX_LAG_MS:-100}
TOLERANCE=${TOLERANCE:-0.5}
EVENTS_CAPACITY=${EVENTS_CAPACITY:-30000}
EVENTS_SPEEDUP=${EVENTS_SPEEDUP:-0}
if [ -z "${EVENTS:-}" ]; then  # on when this kvpage serve has --kv-events
    EVENTS=0
    "$KVPAGE" serve --help | grep -q -- --kv-events && EVENTS=1
fi
PY=/usr/bin/python3

[ -x "$KVPAGE" ] || { echo "run.sh: $KVPAGE not found (make build)" >&2; exit 2; }
[ -f "$TRACE" ] || { echo "run.sh: trace $TRACE not found" >&2; exit 2; }
command -v curl >/dev/null || { echo "run.sh: curl not found" >&2; exit 2; }

TMP=$(mktemp -d /tmp/kvpage-bench-trace.XXXXXX)
SRV=
cleanup() {
    [ -n "$SRV" ] && kill "$SRV" 2>/dev/null && wait "$SRV" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
DATA=${DATA_DIR:-$TMP/data}

free_port() {
    "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_up() {  # port pid log
    for _ in $(seq 100); do
        curl -s -o /dev/null "http://127.0.0.1:$1/healthz" && return 0
        kill -0 "$2" 2>/dev/null || { cat "$3" >&2; exit 1; }
        sleep 0.1
    done
    echo "run.sh: the server on port $1 did not answer" >&2; cat "$3" >&2; exit 1
}
PORT=$(free_port)
"$KVPAGE" serve --listen "127.0.0.1:$PORT" --data-dir "$DATA" --read-grace-ms 0 \
    --log-level warn >"$TMP/serve.log" 2>&1 &
SRV=$!
wait_up "$PORT" "$SRV" "$TMP/serve.log"
BASE=http://127.0.0.1:$PORT
echo "server: $KVPAGE serve --read-grace-ms 0 --data-dir $DATA on $BASE ($(nproc) cores," \
     "load $(cut -d' ' -f1-3 /proc/loadavg))"

caps=()
for c in $CAPACITIES; do caps+=(--capacity "$c"); done
"$PY" "$HERE/lru_sim.py" "$TRACE" "${caps[@]}" --json >"$TMP/sim.json"

for c in $CAPACITIES; do
    pages=$c
    [ "$c" = inf ] && pages=1048576
    "$KVPAGE" bench trace "$TRACE" --url "$BASE/ns/hit-$c" --capacity "$pages" --speedup 0 \
        --connections "$CONNS" --json >"$TMP/replay-$c.json"
done
for s in $SPEEDUPS; do
    "$KVPAGE" bench trace "$TRACE" --url "$BASE/ns/speed-$s" --capacity "$SPEED_CAPACITY" \
        --speedup "$s" --connections "$SPEED_CONNS" --max-lag-ms "$MAX_LAG_MS" \
        --json >"$TMP/speed-$s.json"
done
# The events: a server of its own with --kv-events, a subscriber during one
# replay at EVENTS_CAPACITY (evicting), its rebuilt inventory against the
# server's (events_check.py; python3-zmq, python3-msgpack).
EVENTS_OK=0
if [ "$EVENTS" = 1 ]; then
    EP=$(free_port) RP=$(free_port) EPORT=$(free_port)
    "$KVPAGE" serve --listen "127.0.0.1:$EPORT" --data-dir "${DATA_DIR:-$TMP/events-data}" \
        --read-grace-ms 0 --log-level warn \
        --kv-events "endpoint=tcp://127.0.0.1:$EP,replay_endpoint=tcp://127.0.0.1:$RP" \
        >"$TMP/events-serve.log" 2>&1 &
    ESRV=$!
    wait_up "$EPORT" "$ESRV" "$TMP/events-serve.log"
    if "$PY" "$HERE/events_check.py" --events "tcp://127.0.0.1:$EP" --replay "tcp://127.0.0.1:$RP" \
        --url "http://127.0.0.1:$EPORT/ns/events" --kvpage "$KVPAGE" "$TRACE" -- \
        --capacity "$EVENTS_CAPACITY" --speedup "$EVENTS_SPEEDUP" --connections "$SPEED_CONNS" \
        >"$TMP/events.txt"; then EVENTS_OK=1; fi
    kill "$ESRV"; wait "$ESRV" || true
fi
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT" && cp "$TMP"/*.json "$OUT/"
    [ -f "$TMP/events.txt" ] && cp "$TMP/events.txt" "$OUT/"
fi

set +e
"$PY" - "$TMP" "$TOLERANCE" "$CAPACITIES" "$SPEEDUPS" <<'PYEOF'
import json, sys
tmp, tol, caps, speeds = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
sim = json.load(open(f"{tmp}/sim.json"))
print(f"trace: {sim['blocks']} blocks, {sim['unique_blocks']} unique, "
      f"reuse ceiling {sim['reuse_ceiling']:.2f}%")
print()
print("| capacity (pages) | replay hit rate | simulation | difference | replay requests/s | errors |")
print("|---|---|---|---|---|---|")
bad = 0
for c, s in zip(caps, sim["runs"]):
    r = json.load(open(f"{tmp}/replay-{c}.json"))
    d = r["hit_rate"] - s["hit_rate"]
    ok = abs(d) <= tol and r["errors"] == 0
    bad += not ok
    print(f"| {c} | {r['hit_rate']:.2f}% | {s['hit_rate']:.2f}% | {d:+.2f}{'' if ok else ' MISS'} "
          f"| {r['requests_s']:.0f} | {r['errors']} |")
if speeds:
    print()
    print("| speed-up | trace span (s) | took (s) | requests/s | lag p50 / p99 / max (ms) "
          "| hit rate | held |")
    print("|---|---|---|---|---|---|---|")
    fastest = None
    for sp in speeds:
        r = json.load(open(f"{tmp}/speed-{sp}.json"))
        held = r["schedule_held"] and r["errors"] == 0
        if held:
            fastest = sp
        print(f"| {sp}x | {r['trace_seconds']:.1f} | {r['seconds']:.1f} | {r['requests_s']:.0f} "
              f"| {r['lag_p50_ms']:.1f} / {r['lag_p99_ms']:.1f} / {r['lag_max_ms']:.1f} "
              f"| {r['hit_rate']:.2f}% | {'yes' if held else 'NO'} |")
    print()
    print(f"fastest speed-up that held: {fastest + 'x' if fastest else 'none'}")
sys.exit(1 if bad else 0)
PYEOF
STATUS=$?
if [ "$EVENTS" = 1 ]; then
    echo
    echo "KV events (capacity $EVENTS_CAPACITY, speed-up $EVENTS_SPEEDUP):"
    cat "$TMP/events.txt"
    [ "$EVENTS_OK" = 1 ] || STATUS=1
fi
exit $STATUS
