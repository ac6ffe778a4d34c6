#!/usr/bin/env bash
# bench/io/usrbio-rings.sh — issue 28: the USRBIO backend over the emulation
# (tests/usrbio_emu, built as build/libhf3fs_emu.so) with 1 and 4 rings each
# way (--queues), 1, 2 and 4 callers on one page file, psync beside it; 2 MiB
# pages, batches of 8, buffered, a 1 GiB file on the emulated mount.
# These figures are the emulation's (one worker thread per ring doing
# pread/pwrite), not 3FS's.
#
#   bench/io/usrbio-rings.sh [REPS]     (env: KVPAGE, default build/kvpage; MOUNT)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KVPAGE=${KVPAGE:-$REPO/build/kvpage}
MOUNT=${MOUNT:-/var/tmp/kvpage-emu3fs}
mkdir -p "$MOUNT"
export KVPAGE_USRBIO_LIB=$(dirname "$KVPAGE")/libhf3fs_emu.so KVPAGE_USRBIO_EMU_MOUNT=$MOUNT \
    KVPAGE_USRBIO_EMU_REG_RESULT=dup
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) nproc=$(nproc) git=$(git -C "$REPO" rev-parse --short HEAD)"
for rep in $(seq "${1:-2}"); do
    for t in 1 2 4; do
        for cfg in "usrbio 1" "usrbio 4" "psync 4"; do
            set -- $cfg
            "$KVPAGE" bench io --file "$MOUNT/rings.pages" --file-size 1G --page-size 2M \
                --pool 256M --seconds 2 --warmup 0.5 --backend "$1" --queues "$2" \
                --threads "$t" --json 2>/dev/null |
                /usr/bin/python3 -c "
import json, sys
d = json.load(sys.stdin)
print('rep=$rep backend=$1 queues=%d callers=%d read_gbs=%.2f write_gbs=%.2f'
      ' plain_read_gbs=%.2f plain_write_gbs=%.2f' % (d['queues'], d['threads'],
      d['read']['kvpage']['gbs'], d['write']['kvpage']['gbs'],
      d['read']['baseline']['gbs'], d['write']['baseline']['gbs']))"
        done
    done
done
