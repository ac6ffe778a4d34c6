#!/usr/bin/env bash
# bench/meta/run.sh — the metadata-server benchmark of issue 2.
#
# Measures `kvpage serve --data-dir none` (vLLM dialect) with wrk (1 thread,
# 16 connections, Lua scripts in this directory) against limit_probe (the
# ceiling, ../shared/tools/limit_probe.c built into a temp dir), interleaved,
# REPS times, and prints a markdown table of medians with PASS/MISS.
#
#   bench/meta/run.sh                   # everything, ~6 minutes
#   DUR=10 REPS=5 bench/meta/run.sh     # longer runs
#   PROFILE=1 bench/meta/run.sh         # also perf profiles (see README)
#
# Env: KVPAGE (binary, default build/kvpage; built with cmake if missing),
#      DUR (seconds per wrk run, 8), REPS (3), THREADS_LIST ("1 2"),
#      PAGES (pages of rank 0 in the throughput servers, 16777216),
#      RSS_KEYS (1000000), ALLOC_ITERS (2000), PROFILE (0), KEEP (keep temp dir),
#      FSYNC_LIST ("batch batch-nosnap batch-nodisk": allocate+confirm with
#      --data-dir and these --fsync modes; two controls: batch-nosnap takes no
#      snapshot, batch-nodisk neither, with nodisk.c preloaded so that fsync
#      and fdatasync cost nothing),
#      CONNS (wrk connections, 16: the issue's setting),
#      SGLANG (1: issue 11's SGLang rows, each beside its vLLM row on the same
#      server in the same rep: /0/exists and /0/get_page_indices beside
#      batch_exists and get_locations, and reserve_and_allocate + confirm_write
#      pairs beside vLLM pairs, both with pairs.lua and one connection per wrk
#      thread; 0: without them), SPLIT (2: in each rep the vLLM and the SGLang
#      run are each cut into SPLIT runs of DUR/SPLIT seconds, interleaved
#      A B B A A B ..., A the vLLM one in odd reps and the SGLang one in even
#      reps; report.py adds a label's runs of one rep up. The machine's load
#      moves in bursts of seconds: this spreads them over both dialects).
# Exits non-zero if a server fails to start or a step fails.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PROBE_SRC=$REPO/../shared/tools/limit_probe.c
KVPAGE=${KVPAGE:-$REPO/build/kvpage}
DUR=${DUR:-8}
REPS=${REPS:-3}
THREADS_LIST=${THREADS_LIST:-"1 2"}
PAGES=${PAGES:-16777216}
POOL_KEYS=16384
RSS_KEYS=${RSS_KEYS:-1000000}
ALLOC_ITERS=${ALLOC_ITERS:-2000}
PROFILE=${PROFILE:-0}
FSYNC_LIST=${FSYNC_LIST-"batch batch-nosnap batch-nodisk"}  # FSYNC_LIST="": none
CONNS=${CONNS:-16}
SGLANG=${SGLANG:-1}
SPLIT=${SPLIT:-2}
WRK_THREADS=1
PY=/usr/bin/python3

for tool in wrk cc curl "$PY"; do
    command -v "$tool" >/dev/null || { echo "run.sh: $tool not found (scripts/install-deps --bench)" >&2; exit 2; }
done
[ -f "$PROBE_SRC" ] || { echo "run.sh: $PROBE_SRC not found" >&2; exit 2; }

TMP=$(mktemp -d /tmp/kvpage-bench-meta.XXXXXX)
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ "${KEEP:-0}" = 1 ]; then echo "run.sh: kept $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

if [ ! -x "$KVPAGE" ]; then
    log "building kvpage"
    (cd "$REPO" && cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
        cmake --build build -j2 >/dev/null)
fi
# Others rebuild build/ while this runs: use a private copy for the whole run
# (the binary and the libkvpage.so.0 it links, found first through LD_LIBRARY_PATH).
cp "$KVPAGE" "$TMP/kvpage"
cp "$(dirname "$KVPAGE")/libkvpage.so.0" "$TMP/"
export LD_LIBRARY_PATH=$TMP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
KV=$TMP/kvpage
cc -O2 -o "$TMP/limit_probe" "$PROBE_SRC"
cc -O2 -shared -fPIC -o "$TMP/nodisk.so" "$HERE/nodisk.c"
"$PY" "$HERE/prep.py" keys "$POOL_KEYS" "$TMP/keys.txt"

RESULTS=$TMP/results.txt
: >"$RESULTS"
{
    echo "# date=$(date -u +%Y-%m-%dT%H:%M:%SZ) nproc=$(nproc) kernel=$(uname -r)"
    echo "# kvpage=$KVPAGE sha256=$(sha256sum "$KV" | cut -c1-16) git=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo ?)"
    echo "# wrk: $(wrk -v 2>&1 | head -1 | cut -c1-40); 1 thread, $CONNS connections, ${DUR}s per run, $REPS reps"
    echo "# loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >>"$RESULTS"

free_port() {
    "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start_server NAME CMD... : sets SRV_PID and SRV_PORT; exits 1 if it does not come up
start_server() {
    local name=$1; shift
    local port; port=$(free_port)
    local cmd=("$@")
    cmd=("${cmd[@]//@PORT@/$port}")
    "${cmd[@]}" >"$TMP/$name.log" 2>&1 &
    SRV_PID=$!
    PIDS+=("$SRV_PID")
    local i
    for i in $(seq 100); do
        if ! kill -0 "$SRV_PID" 2>/dev/null; then
            echo "run.sh: server $name exited at start:" >&2; cat "$TMP/$name.log" >&2; exit 1
        fi
        if curl -s -o /dev/null "http://127.0.0.1:$port/healthz"; then SRV_PORT=$port; return 0; fi
        sleep 0.05
    done
    echo "run.sh: server $name did not answer on port $port:" >&2; cat "$TMP/$name.log" >&2; exit 1
}

stop_server() {
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

start_kvpage() { # start_kvpage NAME THREADS
    start_server "$1" "$KV" serve --listen 127.0.0.1:@PORT@ --data-dir none --threads "$2" --log-level warn
}

# wrk_run LABEL REP PORT SCRIPT [VAR=VALUE...]: one wrk run, RESULT line appended.
# wrk has WRK_THREADS threads (1; pairs.lua: one per connection).
# For kvpage runs the server's own handler time (/v1/stats) is recorded before
# and after, so the report can split the time into handler and the rest.
wrk_run() {
    local label=$1 rep=$2 port=$3 script=$4; shift 4
    local out before="" after=""
    if [[ $label != probe_* ]]; then before=$("$PY" "$HERE/prep.py" srvtime "$port") || exit 1; fi
    out=$(env BENCH_DIR="$HERE" BENCH_KEYS="$TMP/keys.txt" "$@" \
        wrk -t"$WRK_THREADS" -c"$CONNS" -d"${DUR}s" --timeout 30s -s "$HERE/$script" "http://127.0.0.1:$port/") || {
        echo "run.sh: wrk failed for $label" >&2; echo "$out" >&2; exit 1; }
    local res; res=$(grep '^RESULT ' <<<"$out" | tail -1)
    [ -n "$res" ] || { echo "run.sh: no RESULT from wrk for $label" >&2; echo "$out" >&2; exit 1; }
    if [ -n "$before" ]; then
        after=$("$PY" "$HERE/prep.py" srvtime "$port") || exit 1
        res="$res srv_before=$before srv_after=$after"
    fi
    echo "$label rep=$rep wrk_threads=$WRK_THREADS ${res#RESULT }" >>"$RESULTS"
    log "$label rep $rep: $(sed -E 's/.*(rps=[^ ]+).*(p99_ms=[^ ]+).*/\1 \2/' <<<"$res")"
}

# ab_runs REP PORT SCRIPT LABEL_A VARS_A LABEL_B VARS_B: the two runs of a
# comparison, interleaved A B B A A B ... in 2*SPLIT runs of DUR/SPLIT seconds
# (B first in even reps); VARS: space-separated VAR=VALUE for the script.
ab_runs() {
    local rep=$1 port=$2 script=$3 la=$4 va=$5 lb=$6 vb=$7 i
    if ((rep % 2 == 0)); then
        local t=$la; la=$lb; lb=$t; t=$va; va=$vb; vb=$t
    fi
    local DUR=$((DUR / SPLIT > 0 ? DUR / SPLIT : 1))
    for ((i = 0; i < 2 * SPLIT; i++)); do
        if ((i % 4 == 0 || i % 4 == 3)); then
            wrk_run "$la" "$rep" "$port" "$script" $va
        else
            wrk_run "$lb" "$rep" "$port" "$script" $vb
        fi
    done
}

prep_kvpage() { # prep_kvpage PORT
    local r
    r=$("$PY" "$HERE/prep.py" prep "$1" "$TMP/keys.txt" "$PAGES") || exit 1
    log "prep: ${r#RESULT }"
}

log "limit_probe and kvpage (threads: $THREADS_LIST), $REPS reps of ${DUR}s runs"
start_server probe "$TMP/limit_probe" @PORT@
PROBE_PID=$SRV_PID PROBE_PORT=$SRV_PORT

for rep in $(seq "$REPS"); do
    declare -A KPID KPORT
    for t in $THREADS_LIST; do
        start_kvpage "kvpage-t$t-rep$rep" "$t"
        KPID[$t]=$SRV_PID KPORT[$t]=$SRV_PORT
        prep_kvpage "${KPORT[$t]}"
    done
    # issue 11: each SGLang op beside its vLLM op, on the same server, the two
    # interleaved (ab_runs; labels: sgl_exists -> sglexists)
    for spec in "exists 64 sgl_exists" "locations 64 sgl_get" "exists 1024 sgl_exists"; do
        set -- $spec
        op=$1 batch=$2 sop=$3
        wrk_run "probe_${op}${batch}" "$rep" "$PROBE_PORT" lookup.lua BENCH_OP="$op" BENCH_BATCH="$batch"
        for t in $THREADS_LIST; do
            if [ "$SGLANG" = 1 ]; then
                ab_runs "$rep" "${KPORT[$t]}" lookup.lua \
                    "kvpage_t${t}_${op}${batch}" "BENCH_OP=$op BENCH_BATCH=$batch" \
                    "kvpage_t${t}_${sop//_/}${batch}" "BENCH_OP=$sop BENCH_BATCH=$batch"
            else
                wrk_run "kvpage_t${t}_${op}${batch}" "$rep" "${KPORT[$t]}" lookup.lua BENCH_OP="$op" BENCH_BATCH="$batch"
            fi
        done
    done
    for t in $THREADS_LIST; do
        wrk_run "kvpage_t${t}_allocconfirm64" "$rep" "${KPORT[$t]}" allocconfirm.lua BENCH_BATCH=64
        if [ "$SGLANG" = 1 ]; then
            WRK_THREADS=$CONNS ab_runs "$rep" "${KPORT[$t]}" pairs.lua \
                "kvpage_t${t}_pairsvllm64" "BENCH_DIALECT=vllm BENCH_BATCH=64" \
                "kvpage_t${t}_pairssglang64" "BENCH_DIALECT=sglang BENCH_BATCH=64"
        fi
        stop_server "${KPID[$t]}"
    done
    unset KPID KPORT
    # issue 3: the same pairs with persistence on (group commit), same rep
    for mode in $FSYNC_LIST; do
        rm -rf "$TMP/data-$mode"
        # Controls: batch-nosnap takes no snapshot during the run; batch-nodisk
        # also makes fsync and fdatasync no-ops (nodisk.c). Snapshots stay off
        # there: their unsynced hundreds of MB in the page cache stalled the
        # log's writes for up to 0.6 s, which measured the page cache, not kvpage.
        pre=() fs=$mode extra=()
        case $mode in
        batch-nosnap) fs=batch extra=(--snapshot-bytes 1000000000000) ;;
        batch-nodisk) fs=batch extra=(--snapshot-bytes 1000000000000)
            pre=(env LD_PRELOAD="$TMP/nodisk.so") ;;
        esac
        start_server "kvpage-fsync-$mode-rep$rep" "${pre[@]}" "$KV" serve --listen 127.0.0.1:@PORT@ \
            --data-dir "$TMP/data-$mode" --fsync "$fs" --threads 1 --log-level warn "${extra[@]}"
        "$PY" "$HERE/prep.py" init "$SRV_PORT" "$PAGES" >/dev/null || exit 1
        wrk_run "kvpage_fsync_${mode}_allocconfirm64" "$rep" "$SRV_PORT" allocconfirm.lua BENCH_BATCH=64
        stop_server "$SRV_PID"
        log "data dir after fsync=$mode: $(du -sb "$TMP/data-$mode" | cut -f1) bytes"
        rm -rf "$TMP/data-$mode"
    done
done
stop_server "$PROBE_PID"

log "sanity: 2 keys per request, every response checked for 200"
for t in $THREADS_LIST; do
    start_kvpage "kvpage-sanity-t$t" "$t"
    prep_kvpage "$SRV_PORT"
    DUR_SAVE=$DUR DUR=3
    wrk_run "sanity_t${t}_exists2" 1 "$SRV_PORT" lookup.lua BENCH_OP=exists BENCH_BATCH=2 BENCH_CHECK=1
    DUR=$DUR_SAVE
    stop_server "$SRV_PID"
done

log "allocate 128 keys: 4,000,000 vs 4,000 free pages ($ALLOC_ITERS each, alternating)"
start_kvpage kvpage-alloc128 1
r=$("$PY" "$HERE/prep.py" alloc128 "$SRV_PORT" "$ALLOC_ITERS") || exit 1
echo "alloc128 rep=1 ${r#RESULT }" >>"$RESULTS"
log "${r#RESULT }"
stop_server "$SRV_PID"

log "memory: VmRSS growth over $RSS_KEYS confirmed keys on rank 0"
start_kvpage kvpage-rss 1
r=$("$PY" "$HERE/prep.py" rss "$SRV_PORT" "$SRV_PID" "$RSS_KEYS") || exit 1
echo "rss rep=1 ${r#RESULT }" >>"$RESULTS"
log "${r#RESULT }"
stop_server "$SRV_PID"

if [ "$PROFILE" = 1 ]; then
    command -v perf >/dev/null || { echo "run.sh: perf not found" >&2; exit 2; }
    for spec in "exists64 lookup.lua BENCH_OP=exists BENCH_BATCH=64" \
                "locations64 lookup.lua BENCH_OP=locations BENCH_BATCH=64" \
                "exists1024 lookup.lua BENCH_OP=exists BENCH_BATCH=1024" \
                "allocconfirm64 allocconfirm.lua BENCH_BATCH=64"; do
        set -- $spec
        name=$1 script=$2; shift 2
        start_kvpage "kvpage-profile-$name" 1
        prep_kvpage "$SRV_PORT"
        # DWARF unwinding: libjansson and libmicrohttpd have no frame pointers
        perf record -q --call-graph dwarf,16384 -F 999 -o "$TMP/perf-$name.data" -p "$SRV_PID" \
            -- sleep "$DUR" >/dev/null 2>&1 &
        perf_pid=$!
        wrk_run "profile_t1_$name" 1 "$SRV_PORT" "$script" "$@"
        wait "$perf_pid" || true
        stop_server "$SRV_PID"
        pdir=${PROFILE_OUT:-$TMP/profiles}
        mkdir -p "$pdir"
        # (to files first: `perf report | head` would end perf with SIGPIPE under pipefail)
        perf report --stdio --no-children -g none --sort dso -i "$TMP/perf-$name.data" \
            >"$TMP/p-dso.txt" 2>/dev/null || true
        perf report --stdio --children -g none --sort dso,sym -i "$TMP/perf-$name.data" \
            >"$TMP/p-children.txt" 2>/dev/null || true
        perf report --stdio --no-children -g none --sort dso,sym -i "$TMP/perf-$name.data" \
            >"$TMP/p-self.txt" 2>/dev/null || true
        {
            echo "## $name: samples by shared object (self)"
            grep -v -e '^#' -e '^$' "$TMP/p-dso.txt" | head -10 || true
            echo "## $name: inclusive (children) by symbol"
            grep -v -e '^#' -e '^$' "$TMP/p-children.txt" | head -60 || true
            echo "## $name: self by symbol"
            grep -v -e '^#' -e '^$' "$TMP/p-self.txt" | head -60 || true
        } >"$pdir/perf-$name.txt"
        rm -f "$TMP/perf-$name.data"
        log "profile $name -> $pdir/perf-$name.txt"
    done
fi

log "JSON floor: jansson json_loadb alone on the same bodies"
if cc -O2 -o "$TMP/json_floor" "$HERE/json_floor.c" -ljansson 2>"$TMP/json_floor.log"; then
    for spec in "64 exists" "1024 exists" "64 alloc"; do
        r=$("$TMP/json_floor" $spec) || exit 1
        set -- $spec
        echo "jsonfloor_$2$1 rep=1 ${r#RESULT }" >>"$RESULTS"
        log "${r#RESULT }"
    done
else
    log "json_floor not built (libjansson-dev missing?): $(head -1 "$TMP/json_floor.log")"
fi

echo "# loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$RESULTS"
[ -n "${RESULTS_OUT:-}" ] && cp "$RESULTS" "$RESULTS_OUT"
"$PY" "$HERE/report.py" "$RESULTS" "$THREADS_LIST"
