#!/bin/sh
# The page I/O benchmark: kvpage (bench_io) vs fio vs the Python fallback on
# one 4 GiB file, random batches of 8 pages, 256 KiB / 2 MiB / 16 MiB pages,
# reads and writes, buffered (file in the page cache) and O_DIRECT.
#
#   bench/io/run.sh [RESULTS_FILE]
#
# Environment: KVP_BENCH_FILE (default /var/tmp/kvp_bench/pages.bin; must be
# on a disk file system, not tmpfs), KVP_BENCH_SECONDS (timed seconds per run,
# default 1.2), KVP_BENCH_WARMUP (untimed seconds first, default 0.3),
# KVP_BENCH_REPS (round-robin repetitions, the best counts; default 2, ~9 min).
# Needs fio and /usr/bin/python3. Writes one line per run to RESULTS_FILE
# (default bench/io/results.txt), then prints the markdown table.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
file=${KVP_BENCH_FILE:-/var/tmp/kvp_bench/pages.bin}
secs=${KVP_BENCH_SECONDS:-1.2}
warm=${KVP_BENCH_WARMUP:-0.3}
reps=${KVP_BENCH_REPS:-2}
out=${1:-$here/results.txt}
size=$((4 * 1024 * 1024 * 1024))
pool=$((1024 * 1024 * 1024))
py=/usr/bin/python3

command -v fio >/dev/null || { echo "fio missing: scripts/install-deps --bench" >&2; exit 1; }
"$here/build.sh" "$here/bench_io" >/dev/null
bench="$here/bench_io"

mkdir -p "$(dirname "$file")"
if [ ! -f "$file" ] || [ "$(stat -c %s "$file")" -ne "$size" ]; then
    echo "writing $file (4 GiB of data, so that O_DIRECT reads hit the disk, not holes)" >&2
    fio --name=prep --filename="$file" --rw=write --bs=16M --size=4G --direct=1 \
        --ioengine=psync --output-format=terse >/dev/null
fi

{
    echo "# date=$(date -u +%Y-%m-%dT%H:%M:%SZ) nproc=$(nproc) kernel=$(uname -r) fio=$(fio --version)"
    echo "# mem=$(free -g | awk '/Mem:/{print $2}')GiB file=$file fs=$(findmnt -no FSTYPE -T "$file") secs=$secs warmup=$warm reps=$reps"
    echo "# load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out"

# fio's throughput in GB/s (10^9 B/s) from its JSON, as a bench_io-like line.
fio_run() { # label rw direct bs extra-args...
    label=$1 rw=$2 direct=$3 bs=$4
    shift 4
    gbps=$(fio --name=b --filename="$file" --size=4G --rw="rand$rw" --bs="$bs" --direct="$direct" \
        --invalidate=0 --norandommap --randrepeat=0 --time_based --runtime="$secs" \
        --ramp_time="$warm" --group_reporting --output-format=json "$@" 2>/dev/null |
        "$py" -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print("%.3f" % ((j["read"]["bw_bytes"]+j["write"]["bw_bytes"])/1e9))')
    echo "tool=$label rw=$rw direct=$direct bpp=$bs gbps=$gbps args=$*" >>"$out"
}

kv() { # label args...: one bench_io run, tagged
    label=$1
    shift
    "$bench" --file "$file" --size "$size" --seconds "$secs" --warmup "$warm" "$@" |
        sed "s/^tool=kvpage/tool=$label/" >>"$out"
}

for direct in 0 1; do
    if [ "$direct" = 0 ]; then
        cat "$file" >/dev/null # the buffered case is the page-cache case
    fi
    d=""
    [ "$direct" = 1 ] && d="--direct"
    for bs in 262144 2097152 16777216; do
        for rw in read write; do
            # Round-robin repetitions: the table keeps each column's best, so that a burst
            # of load from another process penalizes no tool more than another.
            for rep in $(seq "$reps"); do
                reg=""
                [ "$direct" = 1 ] && reg="--register"
                # The engine's workload: batches of 8 into a 1 GiB pool.
                kv kvpage-auto --bpp "$bs" --rw "$rw" $d --backend auto $reg --pool "$pool"
                kv kvpage-psync --bpp "$bs" --rw "$rw" $d --backend psync --pool "$pool"
                kv kvpage-uring --bpp "$bs" --rw "$rw" $d --backend uring $reg --pool "$pool"
                # fio's workloads through kvpage, buffers reused as fio reuses its own:
                # two callers doing one page at a time into one buffer each (= fio psync,
                # 2 jobs), and batches of 8 into 8 registered buffers (= fio io_uring QD8).
                kv kvpage-fiolike-psync --bpp "$bs" --rw "$rw" $d --backend psync --batch 1 \
                    --callers 2 --pool "$bs"
                kv kvpage-fiolike-uring --bpp "$bs" --rw "$rw" $d --backend uring --register \
                    --pool $((bs * 8))
                # The ceiling of a buffered read into the cold pool: two threads
                # memcpy from the file mapped in memory (the page cache itself).
                if [ "$direct" = 0 ] && [ "$rw" = read ]; then
                    kv memcpy-ceiling --bpp "$bs" --rw read --memcpy --callers 2 --pool "$pool"
                fi
                fio_run fio-psync-2j "$rw" "$direct" "$bs" --ioengine=psync --numjobs=2
                fio_run fio-uring-qd8 "$rw" "$direct" "$bs" --ioengine=io_uring --iodepth=8 \
                    --fixedbufs --registerfiles --numjobs=1
                fio_run fio-uring-2x4 "$rw" "$direct" "$bs" --ioengine=io_uring --iodepth=4 \
                    --fixedbufs --registerfiles --numjobs=2
            done
            "$py" "$here/py_baseline.py" "$file" "$bs" "$rw" "$direct" "$secs" "$pool" 8 "$warm" >>"$out"
        done
    done
done
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out"
"$py" "$here/table.py" "$out"
