#!/usr/bin/env bash
# Issue 12, deliverable 6: the pause a snapshot causes the other threads of
# the process holding the metadata, per snapshot mode (pause.c).
#   bench/persist/pause.sh [pause options]   (default: 1,000,000 keys, 4 GiB, all modes)
# Needs the release build (make build). Writes under /var/tmp; ~3 minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
out=$(mktemp -d /var/tmp/kvp-bench-pause.XXXXXX)
trap 'rm -rf "$out"' EXIT
cc -O2 -std=c11 -D_GNU_SOURCE -I"$top/include" -I"$top/src" -o "$out/pause" "$here/pause.c" \
   "$top/build/libkvpage_static.a" $(pkg-config --libs liburing libmicrohttpd jansson libcurl libxxhash) -lpthread -lm
echo "machine: nproc=$(nproc), $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ) (git $(git -C "$top" rev-parse --short HEAD)), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
"$out/pause" "$out/data" "$@"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
