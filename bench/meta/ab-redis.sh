#!/usr/bin/env bash
# bench/meta/ab-redis.sh — two builds of kvpage serve over one Redis, side by
# side: the regression check of a change on the Redis path (issue 27).
#
#   bench/meta/ab-redis.sh OLD_BUILD_DIR NEW_BUILD_DIR [REPS]
#
# One redis-server (AOF everysec, as the issue's runs), one `kvpage serve
# --meta redis://` from each build dir (TR threads, distinct prefixes) and an
# in-process server of the new build (--threads 2) as the run's baseline,
# all filled with the same keys (prep.py). Then REPS rounds of wrk (1 thread,
# 16 connections, DUR seconds, lookup.lua BENCH_OP=exists, 64 keys) on the
# in-process, old and new servers in turn; each line gives requests/s, p99,
# and the CPU the server and Redis used during the run (% of one core).
#
# Env: DUR (6), TR (8), OUT (file for the lines; default stdout only).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OLD=$(cd "$1" && pwd) NEW=$(cd "$2" && pwd) REPS=${3:-3}
DUR=${DUR:-6} TR=${TR:-8}
PY=/usr/bin/python3
for tool in wrk redis-server redis-cli "$PY"; do
    command -v "$tool" >/dev/null || { echo "ab-redis.sh: $tool not found (scripts/install-deps --bench)" >&2; exit 2; }
done
TMP=$(mktemp -d /tmp/kvpage-ab-redis.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
fp() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; } # clock ticks (1/100 s)

RP=$(fp)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --dir "$TMP" --appendonly yes \
    --appendfsync everysec >"$TMP/redis.log" 2>&1 &
RPID=$!
PIDS+=("$RPID")
for _ in $(seq 100); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.05; done
"$PY" "$HERE/prep.py" keys 16384 "$TMP/keys.txt"

declare -A PORT PID
start() { # start NAME BUILD_DIR ARGS...
    local name=$1 dir=$2; shift 2
    local port; port=$(fp)
    LD_LIBRARY_PATH=$dir "$dir/kvpage" serve --listen "127.0.0.1:$port" --log-level warn "$@" \
        >"$TMP/$name.log" 2>&1 &
    PID[$name]=$!
    PIDS+=("$!")
    PORT[$name]=$port
    for _ in $(seq 200); do
        "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/healthz')" \
            2>/dev/null && return 0
        sleep 0.05
    done
    echo "ab-redis.sh: $name did not start" >&2; cat "$TMP/$name.log" >&2; exit 1
}
start local "$NEW" --threads 2 --data-dir none
start old "$OLD" --threads "$TR" --meta "redis://127.0.0.1:$RP/0?prefix=old"
start new "$NEW" --threads "$TR" --meta "redis://127.0.0.1:$RP/0?prefix=new"
for s in local old new; do
    "$PY" "$HERE/prep.py" prep "${PORT[$s]}" "$TMP/keys.txt" 16777216 >/dev/null
done
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) nproc=$(nproc) old=$OLD new=$NEW TR=$TR DUR=$DUR" | tee ${OUT:+-a "$OUT"}
for rep in $(seq "$REPS"); do
    for s in local old new; do
        c0=$(cpu "${PID[$s]}") r0=$(cpu "$RPID")
        r=$(env BENCH_DIR="$HERE" BENCH_KEYS="$TMP/keys.txt" BENCH_OP=exists BENCH_BATCH=64 \
            wrk -t1 -c16 -d"${DUR}s" --timeout 30s -s "$HERE/lookup.lua" "http://127.0.0.1:${PORT[$s]}/" |
            grep '^RESULT ' | sed -E 's/.*rps=([0-9.]+).*p99_ms=([0-9.]+).*/rps=\1 p99_ms=\2/')
        c1=$(cpu "${PID[$s]}") r1=$(cpu "$RPID")
        echo "$s rep=$rep $r server_cpu=$(( (c1 - c0) / DUR ))% redis_cpu=$(( (r1 - r0) / DUR ))%" |
            tee ${OUT:+-a "$OUT"}
    done
done
