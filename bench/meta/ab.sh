#!/usr/bin/env bash
# bench/meta/ab.sh — two builds of kvpage serve side by side, same machine,
# same moment: the regression check of a change on the hot routes.
#
#   bench/meta/ab.sh OLD_BUILD_DIR NEW_BUILD_DIR
#
# Starts `kvpage serve --data-dir none` from each build dir (its kvpage and,
# when there is one, the libkvpage.so.0 beside it), fills both with the same
# keys (prep.py), then for ROUNDS rounds runs each operation on A B B A
# (A = old in odd rounds, new in even ones), DUR seconds per wrk run, wrk 1
# thread, CONNS connections, and prints per operation the median requests/s
# of each build and the median of the per-round ratios new / old.
#
# Env: ROUNDS (5), DUR (3), CONNS (16), PAGES (16777216), THREADS (1: the
#      servers' --threads), OPS ("exists64 locations64 sglexists64 allocconfirm64";
#      also sglpairs64: SGLang reserve + confirm pairs, pairs.lua, wrk -t4 -c4),
#      FSYNC ("": with "batch", the servers run --data-dir in a temp dir
#      with --fsync batch, and only allocconfirm64 is run),
#      EVENTS ("": with 1, the new side runs --kv-events on ipc:// endpoints
#      with one subscriber, events_sub.py, that receives and decodes every
#      batch: `EVENTS=1 bench/meta/ab.sh build build` is events off / on;
#      SUB_DECODE=0: the subscriber receives and checks sequence numbers
#      only, as a router on another host would cost this one; NOSUB=1: no
#      subscriber at all, a control: the events are encoded and dropped),
#      REDIS ("": with 1, each side's state is in a redis-server of its own
#      (AOF everysec): `--meta redis://...` instead of --data-dir, and each
#      operation's line REDIS gives the time Redis spent in the side's
#      scripts per request (INFO commandstats, EVALSHA), which other load on
#      the machine moves less than requests/s; set THREADS=8 as kvpage
#      serve's default over Redis).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PY:-/usr/bin/python3}
ROUNDS=${ROUNDS:-5} DUR=${DUR:-3} CONNS=${CONNS:-16} PAGES=${PAGES:-16777216} THREADS=${THREADS:-1}
OPS=${OPS:-"exists64 locations64 sglexists64 allocconfirm64"}
FSYNC=${FSYNC:-}
EVENTS=${EVENTS:-}
NOSUB=${NOSUB:-}
REDIS=${REDIS:-}
[ $# = 2 ] || { echo "usage: $0 OLD_BUILD_DIR NEW_BUILD_DIR" >&2; exit 2; }
[ -n "$FSYNC" ] && OPS=allocconfirm64

TMP=$(mktemp -d /tmp/kvpage-ab.XXXXXX)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
export BENCH_DIR=$HERE BENCH_KEYS=$TMP/keys.txt

# A private copy of each build (others may rebuild it meanwhile).
for side in old new; do
    dir=$1
    [ $side = new ] && dir=$2
    mkdir -p "$TMP/$side"
    cp "$dir/kvpage" "$TMP/$side/"
    [ -e "$dir/libkvpage.so.0" ] && cp "$dir/libkvpage.so.0" "$TMP/$side/"
done

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

declare -A RP RUSEC RREQ
if [ -n "$REDIS" ]; then
    for side in old new; do
        RP[$side]=$(free_port)
        mkdir -p "$TMP/redis-$side"
        redis-server --port "${RP[$side]}" --bind 127.0.0.1 --save '' --dir "$TMP/redis-$side" \
            --appendonly yes --appendfsync everysec >"$TMP/redis-$side.log" 2>&1 &
        PIDS+=($!)
        for _ in $(seq 100); do redis-cli -p "${RP[$side]}" ping >/dev/null 2>&1 && break; sleep 0.05; done
    done
fi
# The microseconds Redis has spent in the side's scripts so far (REDIS=1).
rusec() { redis-cli -p "${RP[$1]}" info commandstats | sed -n 's/^cmdstat_evalsha:.*,usec=\([0-9]*\),.*/\1/p'; }

declare -A PORT
for side in old new; do
    p=$(free_port)
    extra=(--data-dir none)
    [ -n "$FSYNC" ] && extra=(--data-dir "$TMP/data-$side" --fsync "$FSYNC")
    [ -n "$REDIS" ] && extra=(--meta "redis://127.0.0.1:${RP[$side]}/0")
    if [ -n "$EVENTS" ] && [ $side = new ]; then
        extra+=(--kv-events "endpoint=ipc://$TMP/events,replay_endpoint=ipc://$TMP/replay")
    fi
    LD_LIBRARY_PATH=$TMP/$side "$TMP/$side/kvpage" serve --listen "127.0.0.1:$p" "${extra[@]}" \
        --threads "$THREADS" --log-level warn 2>"$TMP/$side.err" &
    PIDS+=($!)
    for _ in $(seq 100); do curl -fs "http://127.0.0.1:$p/healthz" >/dev/null && break; sleep 0.1; done
    curl -fs "http://127.0.0.1:$p/healthz" >/dev/null || { cat "$TMP/$side.err" >&2; exit 1; }
    PORT[$side]=$p
done
if [ -n "$EVENTS" ] && [ -z "$NOSUB" ]; then
    "$PY" "$HERE/events_sub.py" "ipc://$TMP/events" >"$TMP/sub.out" 2>&1 &
    PIDS+=($!)
    SUB_PID=$!
fi
"$PY" "$HERE/prep.py" keys 16384 "$TMP/keys.txt"
for side in old new; do
    if [ -n "$FSYNC" ]; then
        "$PY" "$HERE/prep.py" init "${PORT[$side]}" "$PAGES" >/dev/null
    else
        "$PY" "$HERE/prep.py" prep "${PORT[$side]}" "$TMP/keys.txt" "$PAGES" >/dev/null
    fi
done

run() { # run SIDE OP -> requests/s
    local script=lookup.lua vars=() op=$2 threads=1 conns=$CONNS
    case $op in
    exists64) vars=(BENCH_OP=exists BENCH_BATCH=64) ;;
    locations64) vars=(BENCH_OP=locations BENCH_BATCH=64) ;;
    sglexists64) vars=(BENCH_OP=sgl_exists BENCH_BATCH=64) ;;
    allocconfirm64) script=allocconfirm.lua vars=(BENCH_BATCH=64) ;;
    sglpairs64) script=pairs.lua vars=(BENCH_DIALECT=sglang BENCH_BATCH=64) threads=4 conns=4 ;;
    *) echo "unknown op $op" >&2; exit 2 ;;
    esac
    env "${vars[@]}" wrk -t"$threads" -c"$conns" -d"${DUR}s" --timeout 30s -s "$HERE/$script" \
        "http://127.0.0.1:${PORT[$1]}/" | sed -n 's/^Requests\/sec: *//p'
}

echo "# date=$(date -u +%FT%TZ) nproc=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg)"
echo "# old=$1 ($(sha256sum "$TMP/old/kvpage" | cut -c1-12)) new=$2 ($(sha256sum "$TMP/new/kvpage" | cut -c1-12))"
echo "# rounds=$ROUNDS dur=${DUR}s conns=$CONNS threads=$THREADS fsync=${FSYNC:-none} events=${EVENTS:-off} redis=${REDIS:-off}"
# Handler time per request of one side since the last call (from /v1/stats:
# every route's time inside the server, HTTP parsing and replies excluded).
declare -A SRV_BEFORE
srvtime() { # srvtime SIDE -> "µs per request" since the previous call for SIDE
    local now
    now=$("$PY" "$HERE/prep.py" srvtime "${PORT[$1]}")
    "$PY" - "${SRV_BEFORE[$1]:-{\}}" "$now" <<'EOF'
import json, sys
a, b = (json.loads(x.replace("%20", " ")) for x in sys.argv[1:3])
n = sum(v[0] - a.get(k, [0, 0])[0] for k, v in b.items() if not k.startswith("wal|"))
t = sum(v[1] - a.get(k, [0, 0])[1] for k, v in b.items() if not k.startswith("wal|"))
print(f"{t / n * 1e6:.2f}" if n else "-")
EOF
    SRV_BEFORE[$1]=$now
}
for side in old new; do srvtime $side >/dev/null; done

for op in $OPS; do
    olds=() news=() ratios=()
    for r in $(seq "$ROUNDS"); do
        if [ $((r % 2)) = 1 ]; then order="old new new old"; else order="new old old new"; fi
        o=0 n=0
        for side in $order; do
            [ -n "$REDIS" ] && u0=$(rusec "$side")
            v=$(run "$side" "$op")
            if [ -n "$REDIS" ]; then
                RUSEC[$side]=$(( ${RUSEC[$side]:-0} + $(rusec "$side") - u0 ))
                RREQ[$side]=$("$PY" -c "print(${RREQ[$side]:-0} + $v * $DUR)")
            fi
            if [ $side = old ]; then o=$("$PY" -c "print($o+$v)"); else n=$("$PY" -c "print($n+$v)"); fi
        done
        olds+=("$o") news+=("$n")
        ratios+=("$("$PY" -c "print(round($n/$o, 3))")")
        echo "$op round $r: old $("$PY" -c "print(round($o/2))") new $("$PY" -c "print(round($n/2))") req/s, new/old ${ratios[-1]}"
    done
    "$PY" - "$op" "${olds[*]}" "${news[*]}" "${ratios[*]}" <<'EOF'
import statistics, sys
op, o, n, r = sys.argv[1], *[list(map(float, a.split())) for a in sys.argv[2:]]
print(f"RESULT {op}: old {statistics.median(o)/2:.0f} req/s, new {statistics.median(n)/2:.0f} req/s, "
      f"new/old median {statistics.median(r):.3f} (rounds: {' '.join(f'{x:.3f}' for x in r)})")
EOF
    echo "HANDLER $op: old $(srvtime old) us/request, new $(srvtime new) us/request (inside the server, all rounds)"
    if [ -n "$REDIS" ]; then
        echo "REDIS $op: old $("$PY" -c "print(round(${RUSEC[old]} / ${RREQ[old]}, 1))") us in scripts/request, new $("$PY" -c "print(round(${RUSEC[new]} / ${RREQ[new]}, 1))") us in scripts/request (all rounds)"
        RUSEC=() RREQ=()
    fi
done
if [ -n "$EVENTS" ] && [ -z "$NOSUB" ]; then
    kill -INT "$SUB_PID" 2>/dev/null || true
    wait "$SUB_PID" 2>/dev/null || true
    echo "SUBSCRIBER: $(cat "$TMP/sub.out")"
fi
