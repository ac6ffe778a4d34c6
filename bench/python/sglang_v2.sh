#!/usr/bin/env bash
# bench/python/sglang_v2.sh — issue 35: kvpage.sglang's v2 path (SGLang's
# hybrid pools) against its KV (v1) path on the same bytes, REPS runs of
# sglang_v2_bench.py (ROUNDS rounds a side, BATCH pages of 2 MiB a call).
# Env: KVPAGE (build dir, default build), REPS (3), ROUNDS (30), BATCH (16),
#      DIR (scratch directory, default a new one under /var/tmp), OUT
#      (results directory, default bench/python/results/DATE-sglang-v2).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=${KVPAGE:-$REPO/build}
OUT=${OUT:-$HERE/results/$(date -u +%Y-%m-%d-%H%M)-sglang-v2}
DIR=${DIR:-$(mktemp -d /var/tmp/kvpage-bench-v2.XXXXXX)}
mkdir -p "$OUT" "$DIR"
trap '[ -n "${KEEP:-}" ] || rm -rf "$DIR"' EXIT
export KVPAGE_LIB=$BUILD/libkvpage.so PYTHONPATH=$REPO/python
echo "nproc=$(nproc) cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" \
     "date=$(date -u '+%Y-%m-%dT%H:%MZ') git=$(git -C "$REPO" rev-parse --short HEAD)" >"$OUT/machine.txt"
for rep in $(seq "${REPS:-3}"); do
    /usr/bin/python3 "$HERE/sglang_v2_bench.py" "$DIR" "${BATCH:-16}" "${ROUNDS:-30}" |
        sed "s/^/rep=$rep /" | tee -a "$OUT/v2.txt"
done
