#!/usr/bin/env bash
# bench/meta/redis.sh — issue 15: kvpage serve with its state in Redis,
# through 1 and 2 servers, beside the in-process backend in the same run.
#
# Ops (wrk, the scripts of this directory, 64 keys per request, 16
# connections in all): vLLM batch_exists of held keys (lookup.lua
# BENCH_OP=exists) and batch_allocate + confirm_write pairs of fresh keys
# (allocconfirm.lua). Cases, interleaved in each rep:
#   local      kvpage serve --data-dir none --threads T
#   redis-1    one kvpage serve --meta redis://... --threads TR
#   redis-2    two servers on the same Redis, 8 connections each (two wrk
#              processes at once; requests/s added up, p99 the larger)
# Redis runs without persistence (--save '' --appendonly no) unless
# REDIS_ARGS says otherwise; its CPU seconds per request (from
# /proc/PID/stat) are reported beside each Redis case, and so is the time
# Redis spent in commands, from INFO commandstats (reset with CONFIG
# RESETSTAT before each case; each case's is kept as
# cmdstats-LABEL-REP.txt), per request and, for allocconfirm, per allocate +
# confirm pair: redis_cmd_us_* sums the usec of every cmdstat_ line (but
# CONFIG's and INFO's), which counts a command a script runs twice (in the
# script's usec and in its own); redis_top_us_* counts each request's own
# commands once: the scripts' (EVAL*, FCALL*) when any ran, else the plain
# commands' (each request here runs either scripts or plain commands only).
#
# Env: KVPAGE (binary, default build/kvpage), DUR (seconds per run, 8),
#      REPS (3), T (the in-process server's threads, 2), TR (the Redis servers'
#      threads, 8: kvpage serve's default with --meta), REDIS_ARGS, OUT (results dir,
#      default bench/meta/results/redis-DATE).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
KVPAGE=${KVPAGE:-$REPO/build/kvpage}
DUR=${DUR:-8}
REPS=${REPS:-3}
T=${T:-2}
TR=${TR:-8} # threads of the servers on Redis (kvpage serve's default with --meta)
REDIS_ARGS=${REDIS_ARGS:---appendonly no}
OUT=${OUT:-$HERE/results/redis-$(date -u +%Y-%m-%d-%H%M)}
PY=/usr/bin/python3
for tool in wrk curl redis-server redis-cli "$PY"; do
    command -v "$tool" >/dev/null || { echo "redis.sh: $tool not found (scripts/install-deps --bench)" >&2; exit 2; }
done
TMP=$(mktemp -d /tmp/kvpage-bench-redis.XXXXXX)
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
mkdir -p "$OUT"
cp "$KVPAGE" "$TMP/kvpage"
cp "$(dirname "$KVPAGE")/libkvpage.so.0" "$TMP/"
export LD_LIBRARY_PATH=$TMP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
KV=$TMP/kvpage
"$PY" "$HERE/prep.py" keys 16384 "$TMP/keys.txt"
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

RPORT=$(free_port)
# shellcheck disable=SC2086
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --dir "$TMP" $REDIS_ARGS >"$TMP/redis.log" 2>&1 &
RPID=$!
PIDS+=("$RPID")
for _ in $(seq 100); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.05; done

start() { # start NAME ARGS... -> sets PORT, PID
    local name=$1; shift
    PORT=$(free_port)
    local threads=$T
    [ "$1" = --meta ] && threads=$TR
    "$KV" serve --listen "127.0.0.1:$PORT" --threads "$threads" --log-level warn "$@" >"$TMP/$name.log" 2>&1 &
    PID=$!
    PIDS+=("$PID")
    for _ in $(seq 200); do
        curl -s -o /dev/null "http://127.0.0.1:$PORT/healthz" && return 0
        sleep 0.05
    done
    echo "redis.sh: $name did not start" >&2; cat "$TMP/$name.log" >&2; exit 1
}
cpu_s() { awk '{print ($14 + $15) / 100}' "/proc/$1/stat"; }
RESULTS=$OUT/results.txt
{
    echo "# date=$(date -u +%Y-%m-%dT%H:%M:%SZ) nproc=$(nproc) git=$(git -C "$REPO" rev-parse --short HEAD)"
    echo "# redis $(redis-server --version | cut -d' ' -f3) args: $REDIS_ARGS; server threads $T (in-process), $TR (Redis); ${DUR}s runs, $REPS reps"
} >"$RESULTS"

# wrk_one PORT SCRIPT CONNS VARS... -> prints its RESULT line's fields
wrk_one() {
    local port=$1 script=$2 conns=$3; shift 3
    env BENCH_DIR="$HERE" BENCH_KEYS="$TMP/keys.txt" "$@" \
        wrk -t1 -c"$conns" -d"${DUR}s" --timeout 30s -s "$HERE/$script" "http://127.0.0.1:$port/" |
        grep '^RESULT ' | tail -1 | sed 's/^RESULT //'
}
field() { sed -E "s/.*\\b$2=([^ ]+).*/\\1/" <<<"$1"; }

# run LABEL REP SCRIPT VARS -- PORTS...: wrk on each port at once, 16/len connections each
run() {
    local label=$1 rep=$2 script=$3 vars=$4; shift 4
    local ports=("$@") n=${#ports[@]} i
    redis-cli -p "$RPORT" CONFIG RESETSTAT >/dev/null
    local c0; c0=$(cpu_s "$RPID")
    local wpids=()
    for i in "${!ports[@]}"; do
        # shellcheck disable=SC2086
        wrk_one "${ports[$i]}" "$script" $((16 / n)) $vars >"$TMP/w$i" &
        wpids+=($!)
    done
    wait "${wpids[@]}"
    local c1; c1=$(cpu_s "$RPID")
    local cs=$OUT/cmdstats-$label-$rep.txt
    redis-cli -p "$RPORT" INFO commandstats | tr -d '\r' >"$cs"
    local sums cmd_us top_us
    sums=$(sed -nE 's/^cmdstat_([^:]+):.*[:,]usec=([0-9]+),.*/\1 \2/p' "$cs" | awk '
        $1 ~ /^(config|info)/ { next }
        { all += $2 }
        $1 ~ /^(eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro)$/ { sc += $2; n++ }
        END { print all + 0, (n ? sc : all) + 0 }')
    read -r cmd_us top_us <<<"$sums"
    local rps=0 p99=0 reqs=0 pairs=0 r
    for i in "${!ports[@]}"; do
        r=$(cat "$TMP/w$i")
        rps=$("$PY" -c "print($rps + $(field "$r" rps))")
        reqs=$("$PY" -c "print($reqs + $(field "$r" requests))")
        p99=$("$PY" -c "print(max($p99, $(field "$r" p99_ms)))")
        if [[ $r == *pairs_ok=* ]]; then pairs=$((pairs + $(field "$r" pairs_ok))); fi
        rm -f "$TMP/w$i"
    done
    local us; us=$("$PY" -c "print(round(($c1 - $c0) * 1e6 / max($reqs, 1), 1))")
    local cu tu cp=""
    cu=$("$PY" -c "print(round($cmd_us / max($reqs, 1), 1))")
    tu=$("$PY" -c "print(round($top_us / max($reqs, 1), 1))")
    if [ "$pairs" -gt 0 ]; then
        cp=$("$PY" -c "print(f' redis_cmd_us_per_pair={$cmd_us / $pairs:.1f}'
                      f' redis_top_us_per_pair={$top_us / $pairs:.1f}')")
    fi
    echo "$label rep=$rep rps=$rps p99_ms=$p99 requests=$reqs pairs=$pairs" \
        "redis_cpu_us_per_req=$us redis_cmd_us_per_req=$cu redis_top_us_per_req=$tu$cp" >>"$RESULTS"
    log "$label rep $rep: rps=$rps p99_ms=$p99 redis_us/req=$us top_us/req=$tu$cp"
}

for rep in $(seq "$REPS"); do
    start local --data-dir none; LP=$PORT; LPID=$PID
    "$PY" "$HERE/prep.py" prep "$LP" "$TMP/keys.txt" 16777216 >/dev/null
    start redis-a --meta "redis://127.0.0.1:$RPORT/0?prefix=r$rep"; RA=$PORT
    start redis-b --meta "redis://127.0.0.1:$RPORT/0?prefix=r$rep"; RB=$PORT
    "$PY" "$HERE/prep.py" prep "$RA" "$TMP/keys.txt" 16777216 >/dev/null
    for op in "exists lookup.lua BENCH_OP=exists BENCH_BATCH=64" \
              "allocconfirm allocconfirm.lua BENCH_BATCH=64"; do
        set -- $op
        name=$1 script=$2; shift 2
        vars="$*"
        run "local_$name" "$rep" "$script" "$vars" "$LP"
        run "redis1_$name" "$rep" "$script" "$vars" "$RA"
        run "redis2_$name" "$rep" "$script" "$vars" "$RA" "$RB"
    done
    for p in "${PIDS[@]}"; do [ "$p" = "$RPID" ] || kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do [ "$p" = "$RPID" ] || wait "$p" 2>/dev/null || true; done
    PIDS=("$RPID")
done
"$PY" - "$RESULTS" <<'EOF' | tee "$OUT/summary.md"
import statistics, sys, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith("#"):
        continue
    f = line.split()
    kv = dict(x.split("=", 1) for x in f[1:])
    rows[f[0]].append(kv)
print("| op | backend | requests/s | p99 ms | Redis CPU µs per request "
      "| Redis command µs per request (top, all) | per pair (top, all) | ÷ in-process |")
print("|---|---|---|---|---|---|---|---|")
for op in ("exists", "allocconfirm"):
    base = statistics.median(float(r["rps"]) for r in rows[f"local_{op}"])
    for b in ("local", "redis1", "redis2"):
        rs = rows[f"{b}_{op}"]
        rps = statistics.median(float(r["rps"]) for r in rs)
        p99 = statistics.median(float(r["p99_ms"]) for r in rs)
        med = lambda f: (statistics.median(float(r[f]) for r in rs)
                         if b != "local" and all(f in r for r in rs) else None)
        show = lambda v: "" if v is None else f"{v:.1f}"
        two = lambda a, b: "" if med(a) is None else f"{show(med(a))}, {show(med(b))}"
        cpu = med("redis_cpu_us_per_req")
        cmd = two("redis_top_us_per_req", "redis_cmd_us_per_req")
        pair = two("redis_top_us_per_pair", "redis_cmd_us_per_pair")
        name = {"local": "in-process", "redis1": "Redis, 1 server", "redis2": "Redis, 2 servers"}[b]
        print(f"| {op} 64 | {name} | {rps:,.0f} | {p99:.2f} | {show(cpu)} | {cmd} "
              f"| {pair} | {rps / base:.2f} |")
EOF
