#!/usr/bin/env bash
# Persistence figures of issue 3 (recovery time, bytes on disk per key).
#   bench/persist/run.sh [N]        (default 1000000 keys)
# Needs the release build (make build). Writes under /var/tmp.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
n=${1:-1000000}
out=$(mktemp -d /var/tmp/kvp-bench-persist.XXXXXX)
trap 'rm -rf "$out" "$out/data.copy" "$out/data" 2>/dev/null' EXIT
cc -O2 -std=c11 -D_GNU_SOURCE -I"$top/include" -I"$top/src" -o "$out/recovery" "$here/recovery.c" \
   "$top/build/libkvpage_internal.a" $(pkg-config --libs liburing libxxhash) -lpthread -lm
echo "machine: nproc=$(nproc), $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ)"
"$out/recovery" "$out/data" "$n"
rm -rf "$out/data.copy"
