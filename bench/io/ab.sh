#!/bin/sh
# bench/io/ab.sh OLD_BENCH_IO NEW_BENCH_IO [REPS] — two builds of bench_io
# (bench/io/build.sh OUT, from two checkouts) on the same cases, A B B A
# interleaved, to show that a change to src/pagefile does not move the
# figures. Prints each case's GB/s per rep and the new/old ratio of the
# medians. File: KVP_BENCH_FILE (default /var/tmp/kvp_ab/pages.bin, 2 GiB of
# random data, made once; it must be on a disk file system, not tmpfs).
set -eu
old=$1 new=$2 reps=${3:-3}
file=${KVP_BENCH_FILE:-/var/tmp/kvp_ab/pages.bin}
if [ ! -s "$file" ]; then
    mkdir -p "$(dirname "$file")"
    head -c 2147483648 /dev/urandom >"$file"
fi
cat "$file" >/dev/null
run() { # bench args... -> GB/s
    "$@" --file "$file" --size 2G --seconds 1.2 --warmup 0.3 | sed -n 's/.*gbps=\([0-9.]*\).*/\1/p'
}
while read -r name args; do
    a="" b=""
    for rep in $(seq "$reps"); do
        if [ $((rep % 2)) = 1 ]; then
            a="$a $(run "$old" $args)"; b="$b $(run "$new" $args)"
        else
            b="$b $(run "$new" $args)"; a="$a $(run "$old" $args)"
        fi
    done
    python3 -c '
import statistics, sys
a = [float(x) for x in sys.argv[2].split()]; b = [float(x) for x in sys.argv[3].split()]
print("%-28s old %-22s new %-22s new/old %.2f" % (sys.argv[1], " ".join("%.2f" % x for x in a),
      " ".join("%.2f" % x for x in b), statistics.median(b) / statistics.median(a)))' "$name" "$a" "$b"
done <<'CASES'
read-256k-buffered-auto --bpp 262144 --rw read --backend auto --pool 1G
read-2m-buffered-mmap --bpp 2097152 --rw read --backend auto --mmap-reads --pool 1G
write-2m-buffered-auto --bpp 2097152 --rw write --backend auto --pool 1G
read-2m-direct-uring-reg --bpp 2097152 --rw read --direct --backend uring --register --pool 1G
write-2m-direct-psync --bpp 2097152 --rw write --direct --backend psync --pool 1G
read-256k-direct-auto --bpp 262144 --rw read --direct --backend auto --pool 1G
CASES
