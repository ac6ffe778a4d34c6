#!/usr/bin/env bash
# bench/python/run.sh — issue 14's benchmark: kvpage from Python against C.
#
# Page I/O: random batches of 8 pages between random slots of a 1 GiB host
# pool per caller and random pages of a 2 GiB file in the page cache
# (buffered), reads and writes, 2 MiB and 256 KiB pages, for each of
#   turns-1, turns-4    kvpage.compat.Hf3fsClient from Python, 1 thread and 4
#                       threads sharing one client, taking turns (10 rounds)
#                       in the same process, on the same handle and pools,
#                       with bench_io's caller loop in C (cloop.c): the
#                       ratio of the two sides (bench/python/compat_bench.py)
#   c-1, c-4            kvp_pagefile from C, 1 and 4 callers (bench/io/bench_io)
#   py16                a plain Python pool of 16 threads doing os.preadv /
#                       os.pwritev per page (bench/io/py_baseline.py); the
#                       same pool also takes turns inside compat_bench.py
# interleaved, REPS times. Then kvpage.Store put/get from Python
# (store_bench.py) against the C store, taking turns in one process with the
# rounds of `kvpage bench store` in C (cloop.c), same batches.
# Prints a markdown table of medians with the targets.
#
# Env: KVPAGE (build dir, default build), REPS (3), SECONDS_EACH (4),
#      DIR (scratch directory, default a new one under /var/tmp), OUT (results
#      directory, default bench/python/results/DATE), SKIP_IO (keep OUT's io.txt
#      and run only the store part), SIZES (page sizes in bytes, default
#      "2097152 262144"), MMAP_READS (1: kvpage's reads copy out of a mapping,
#      KVP_PAGEFILE_MMAP_READS, through KVPAGE_MMAP_READS and bench_io
#      --mmap-reads; default 0), TENSORS (numpy, the default, or torch: what
#      the Python client is handed, KVPB_TENSORS of compat_bench.py).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=${KVPAGE:-$REPO/build}
REPS=${REPS:-3}
SECS=${SECONDS_EACH:-4}
OUT=${OUT:-$HERE/results/$(date -u +%Y-%m-%d-%H%M)}
DIR=${DIR:-$(mktemp -d /var/tmp/kvpage-bench-python.XXXXXX)}
PY=/usr/bin/python3
mkdir -p "$OUT" "$DIR"
trap '[ -n "${KEEP:-}" ] || rm -rf "$DIR"' EXIT
export KVPAGE_LIB=$BUILD/libkvpage.so PYTHONPATH=$REPO/python KVPB_TENSORS=${TENSORS:-numpy}
MMAP_FLAG=
if [ "${MMAP_READS:-0}" = 1 ]; then
  export KVPAGE_MMAP_READS=1
  MMAP_FLAG=--mmap-reads
else
  unset KVPAGE_MMAP_READS
fi

"$REPO/bench/io/build.sh" "$DIR/bench_io" >/dev/null
cc -O2 -shared -fPIC -I"$REPO/include" "$HERE/cloop.c" -L"$BUILD" -lkvpage -Wl,-rpath,"$BUILD" -o "$DIR/cloop.so"
F=$DIR/pages
head -c $((2 << 30)) /dev/zero >"$F"   # 2 GiB, written once: in the page cache

echo "bench/python: $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), $BUILD, mmap_reads=${MMAP_READS:-0}, tensors=$KVPB_TENSORS" >&2
echo "nproc=$(nproc) date=$(date -u '+%Y-%m-%dT%H:%MZ') git=$(git -C "$REPO" rev-parse --short HEAD) mmap_reads=${MMAP_READS:-0} tensors=$KVPB_TENSORS" >"$OUT/machine.txt"
[ -n "${SKIP_IO:-}" ] || : >"$OUT/io.txt"
for rep in $(seq "$REPS"); do
  [ -n "${SKIP_IO:-}" ] && break
  for bpp in ${SIZES:-$((2 << 20)) $((256 << 10))}; do
    for rw in read write; do
      for tool in turns-1 c-1 py16 turns-4 c-4; do
        case $tool in
          turns-*) line=$(KVPB_CLOOP=$DIR/cloop.so $PY "$HERE/compat_bench.py" "$F" $bpp $rw \
                            $((2 * SECS)) "${tool#turns-}") ;;
          c-*) line=$("$DIR/bench_io" --file "$F" --size $((2 << 30)) --bpp $bpp --rw $rw \
                       --batch 8 --callers "${tool#c-}" --seconds "$SECS" $MMAP_FLAG) ;;
          py16) line=$($PY "$REPO/bench/io/py_baseline.py" "$F" $bpp $rw 0 "$SECS") ;;
        esac
        echo "case=$tool rep=$rep $line" | tee -a "$OUT/io.txt" >&2
      done
    done
  done
done

: >"$OUT/store.txt"
for rep in $(seq "$REPS"); do
  for bpp in ${SIZES:-$((2 << 20)) $((256 << 10))}; do
    # The C side is kvpb_store_round (cloop.c), the rounds of `kvpage bench
    # store` taking turns with Python's on the same store and buffers.
    line=$(KVPB_CLOOP=$DIR/cloop.so $PY "$HERE/store_bench.py" "$DIR" $bpp 128 16)
    echo "case=py-store rep=$rep $line" | tee -a "$OUT/store.txt" >&2
  done
done
$PY "$HERE/report.py" "$OUT" | tee "$OUT/summary.md"
