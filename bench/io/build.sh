#!/bin/sh
# Builds bench/io/bench_io from the pagefile sources directly (no dependency on
# the rest of the tree or on a CMake build): -O2, the same flags as the library.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$here/bench_io}
${CC:-cc} -std=c11 -O2 -g -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter \
    -I"$root/include" -I"$root/src" \
    "$here/bench_io.c" "$root"/src/pagefile/*.c "$root/src/util/error.c" "$root/src/util/dirs.c" \
    -o "$out" $(pkg-config --libs liburing libxxhash) -lpthread
echo "built $out"
