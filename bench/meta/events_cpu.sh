#!/usr/bin/env bash
# bench/meta/events_cpu.sh — what KV events cost in CPU, thread by thread:
# less noisy than throughput on a shared machine (a thread's CPU time per
# request moves little with the load; its requests/s moves a lot).
#
#   bench/meta/events_cpu.sh BUILD_DIR [BUILD_DIR...]
#
# For each build dir in turn (ROUNDS times, interleaved): one `kvpage serve
# --data-dir none --kv-events ...` on ipc:// endpoints with one subscriber
# (events_sub.py), rank 0 filled (PAGES pages, then DUR seconds of
# allocate + confirm so that every pair evicts), then DUR seconds of wrk
# allocconfirm64 (1 thread, 16 connections); prints the requests/s and the
# CPU time per request (µs) of the server's request thread (MHD-single),
# the publisher thread, ZeroMQ's I/O thread and the subscriber process.
#
# Env: ROUNDS (3), DUR (5), PAGES (65536).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PY:-/usr/bin/python3}
ROUNDS=${ROUNDS:-3} DUR=${DUR:-5} PAGES=${PAGES:-65536}
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [BUILD_DIR...]" >&2; exit 2; }
TMP=$(mktemp -d /tmp/kvpage-evcpu.XXXXXX)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
export BENCH_DIR=$HERE BENCH_KEYS=$TMP/keys.txt
"$PY" "$HERE/prep.py" keys 16384 "$TMP/keys.txt"
echo "# date=$(date -u +%FT%TZ) nproc=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg) rounds=$ROUNDS dur=${DUR}s pages=$PAGES"

one() { # one BUILD_DIR
    local d=$TMP/run p sp sub
    rm -rf "$d"; mkdir -p "$d"
    cp "$1/kvpage" "$d/"
    [ -e "$1/libkvpage.so.0" ] && cp "$1/libkvpage.so.0" "$d/"
    p=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    LD_LIBRARY_PATH=$d "$d/kvpage" serve --listen "127.0.0.1:$p" --data-dir none --threads 1 \
        --log-level warn --kv-events "endpoint=ipc://$d/ev,replay_endpoint=ipc://$d/rep" 2>"$d/err" &
    sp=$!
    PIDS+=("$sp")
    for _ in $(seq 100); do curl -fs "http://127.0.0.1:$p/healthz" >/dev/null && break; sleep 0.1; done
    "$PY" "$HERE/events_sub.py" "ipc://$d/ev" >"$d/sub.out" 2>&1 &
    sub=$!
    PIDS+=("$sub")
    "$PY" "$HERE/prep.py" prep "$p" "$TMP/keys.txt" "$PAGES" >/dev/null
    BENCH_BATCH=64 wrk -t1 -c16 -d"${DUR}s" --timeout 30s -s "$HERE/allocconfirm.lua" \
        "http://127.0.0.1:$p/" >/dev/null
    snap() {
        for t in /proc/"$sp"/task/*; do echo "$(cat "$t/comm")-$(basename "$t") $(awk '{print $14+$15}' "$t/stat")"; done
        echo "subscriber $(awk '{print $14+$15}' /proc/$sub/stat)"
    }
    snap >"$d/a"
    local rps
    rps=$(BENCH_BATCH=64 wrk -t1 -c16 -d"${DUR}s" --timeout 30s -s "$HERE/allocconfirm.lua" \
        "http://127.0.0.1:$p/" | sed -n 's/^Requests\/sec: *//p')
    snap >"$d/b"
    kill -INT "$sub"; wait "$sub" || true
    kill "$sp"; wait "$sp" 2>/dev/null || true
    "$PY" - "$1" "$rps" "$DUR" "$d/a" "$d/b" "$(cat "$d/sub.out")" <<'PYEOF'
import sys
build, rps, dur, a, b, sub = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), *sys.argv[4:]
ticks = lambda f: dict(l.split() for l in open(f))
ta, tb = ticks(a), ticks(b)
req = rps * dur
# The publisher is the server's thread named "kvpage" that used CPU (the main thread waits).
cpu = {}
for k, v in tb.items():
    name = k.rsplit("-", 1)[0]
    d = (int(v) - int(ta.get(k, 0))) / 100
    cpu[name] = cpu.get(name, 0) + d
us = lambda name: cpu.get(name, 0) / req * 1e6
print(f"{build}: {rps:.0f} req/s; CPU us/request: request thread {us('MHD-single'):.1f}, "
      f"publisher {us('kvpage'):.2f}, zmq I/O {us('ZMQbg/IO/0'):.2f}, subscriber {us('subscriber'):.2f}, "
      f"side total {us('kvpage') + us('ZMQbg/IO/0') + us('subscriber'):.2f} ({sub})")
PYEOF
}
for r in $(seq "$ROUNDS"); do
    for b in "$@"; do one "$b"; done
done
