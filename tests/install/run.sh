#!/usr/bin/env bash
# The install test (`make install-test`, part of `make test`): installs a build
# into a temporary prefix and checks what a user of the installed kvpage gets.
#   tests/install/run.sh [BUILD_DIR]      (default: build, the release build)
# One "ok" line per step; a failed step prints FAIL and what failed, exit 1.
# Needs no network; the prefix is removed at the end.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpage-install-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
P=$tmp/prefix

fail() {
    echo "FAIL $*" >&2
    exit 1
}
ok() { echo "ok $*"; }

# 1. Install, and what is installed.
cmake --install "$build" --prefix "$P" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log" >&2; fail "cmake --install $build --prefix $P"; }
so=$(find "$P" -name 'libkvpage.so.0' -print -quit)
[ -n "$so" ] || fail "install: no libkvpage.so.0 under the prefix"
lib=$(dirname "$so")
version=$(sed -n 's/^project(kvpage VERSION \([0-9.]*\).*/\1/p' "$top/CMakeLists.txt")
for f in "$P/include/kvpage.h" "$lib/libkvpage.so.$version" "$lib/pkgconfig/kvpage.pc" \
         "$lib/cmake/kvpage/kvpageConfig.cmake" "$lib/cmake/kvpage/kvpageConfigVersion.cmake" \
         "$lib/cmake/kvpage/kvpageTargets.cmake"; do
    [ -f "$f" ] || fail "install: $f is missing"
done
[ -x "$P/bin/kvpage" ] || fail "install: $P/bin/kvpage is missing or not executable"
[ -s "$P/share/man/man1/kvpage.1" ] || fail "install: the man page share/man/man1/kvpage.1 is missing"
MANWIDTH=80 man -l "$P/share/man/man1/kvpage.1" | grep -q "kvpage serve" ||
    fail "install: man -l share/man/man1/kvpage.1 does not render"
[ -s "$P/share/bash-completion/completions/kvpage" ] ||
    fail "install: bash completion share/bash-completion/completions/kvpage is missing"
# bash-completion's loader finds it there, as it finds /usr/local/share/... by
# default ($XDG_DATA_DIRS); scripts/install-deps installs bash-completion for make test.
bc=/usr/share/bash-completion/bash_completion
[ -f "$bc" ] || fail "install: $bc is missing (bash-completion: scripts/install-deps --test)"
loaded=$(XDG_DATA_DIRS=$P/share bash --norc --noprofile \
    -c ". $bc; __load_completion kvpage && complete -p kvpage" 2>&1 || true)
[[ $loaded == *"-F _kvpage kvpage"* ]] ||
    fail "install: bash-completion does not load $P/share/bash-completion/completions/kvpage: $loaded"
ok "bash completion: bash-completion loads share/bash-completion/completions/kvpage"
for l in libkvpage.so libkvpage.so.0; do
    [ -L "$lib/$l" ] || fail "install: $lib/$l is not a symbolic link (the SONAME links)"
done
[ "$(readlink -f "$lib/libkvpage.so")" = "$(readlink -f "$lib/libkvpage.so.$version")" ] ||
    fail "install: $lib/libkvpage.so does not lead to libkvpage.so.$version"
(cd "$top/include" && find . -type f | sort) >"$tmp/headers.want"
(cd "$P/include" && find . -type f | sort) >"$tmp/headers.got"
diff -u "$tmp/headers.want" "$tmp/headers.got" >"$tmp/headers.diff" ||
    { cat "$tmp/headers.diff" >&2; fail "install: installed headers differ from include/ (-want +got)"; }
static=$(find "$P" -name '*.a')
[ -z "$static" ] || fail "install: static libraries installed: $static"
ok "install: $(find "$P" -type f | wc -l) files in $P ($(wc -l <"$tmp/headers.got") public headers, libkvpage.so.$version, kvpage.pc, CMake package, bin/kvpage)"
env -u LD_LIBRARY_PATH "$P/bin/kvpage" --help >"$tmp/help.out" 2>&1 ||
    { cat "$tmp/help.out" >&2; fail "$P/bin/kvpage --help does not run"; }
readelf -d "$P/bin/kvpage" | grep -q 'NEEDED.*\[libkvpage\.so\.0\]' ||
    fail "bin/kvpage does not link libkvpage.so.0 (the server must use only the library's public API)"
where=$(env -u LD_LIBRARY_PATH ldd "$P/bin/kvpage" | awk '$1 == "libkvpage.so.0" { print $3 }')
[ "$(readlink -f "$where")" = "$(readlink -f "$so")" ] ||
    fail "bin/kvpage loads libkvpage.so.0 from '$where', not from the prefix ($lib)"
ok "bin/kvpage runs from the prefix and loads $lib/libkvpage.so.0 (RUNPATH)"

# 2. The SONAME, and no server dependency in the library.
dyn=$(readelf -d "$so")
soname=$(sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p' <<<"$dyn")
[ "$soname" = "libkvpage.so.0" ] || fail "readelf -d $so: SONAME is '$soname', not libkvpage.so.0"
needed=$(sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' <<<"$dyn" | paste -sd ' ')
for dep in libmicrohttpd libjansson libgnutls; do
    case " $needed" in
    *" $dep"*) fail "readelf -d $so: the library needs $dep (NEEDED: $needed); the server's dependencies belong to the kvpage binary" ;;
    esac
done
ok "libkvpage.so: SONAME libkvpage.so.0, NEEDED: $needed"

# 3. Exported symbols: the public kvp_* API only (kvp__ is internal), in KVPAGE_0.
nm -D --defined-only "$so" | awk '{ print $NF }' >"$tmp/syms"
grep -v -x -e 'KVPAGE_0' -e 'kvp_[a-z0-9][a-z0-9_]*@@KVPAGE_0' "$tmp/syms" >"$tmp/syms.bad" &&
    fail "nm -D --defined-only $so: exports besides the public kvp_* functions in version KVPAGE_0 (kvp__ is internal): $(paste -sd ' ' "$tmp/syms.bad")"
ok "libkvpage.so exports $(grep -c '^kvp_' "$tmp/syms") kvp_* symbols (version KVPAGE_0) and nothing else"

# 4. Every installed header compiles on its own, as C11 and as C++17.
bad=0
n=0
while read -r h; do
    h=${h#./}
    n=$((n + 1))
    printf '#include <%s>\n' "$h" >"$tmp/one.c"
    cp "$tmp/one.c" "$tmp/one.cpp"
    if ! gcc -std=c11 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$P/include" "$tmp/one.c" \
        >"$tmp/cc.out" 2>&1; then
        echo "FAIL header $h does not compile alone as C11:" >&2
        cat "$tmp/cc.out" >&2
        bad=1
    fi
    if ! g++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only -I"$P/include" "$tmp/one.cpp" \
        >"$tmp/cxx.out" 2>&1; then
        echo "FAIL header $h does not compile alone as C++17:" >&2
        cat "$tmp/cxx.out" >&2
        bad=1
    fi
done <"$tmp/headers.got"
[ $bad = 0 ] || exit 1
ok "$n installed headers compile alone (gcc -std=c11 -pedantic, g++ -std=c++17, -Wall -Wextra -Werror)"

# 5. A C program through pkg-config.
export PKG_CONFIG_PATH=$lib/pkgconfig
pcversion=$(pkg-config --modversion kvpage) || fail "pkg-config does not find kvpage in $lib/pkgconfig"
[ "$pcversion" = "$version" ] || fail "pkg-config --modversion kvpage: $pcversion, want $version"
flags=$(pkg-config --cflags --libs kvpage | sed 's/ *$//')
# shellcheck disable=SC2086 # the flags are words
${CC:-cc} -std=c11 -Wall -Wextra -Werror -o "$tmp/hello" "$here/hello.c" $flags \
    >"$tmp/hello.cc" 2>&1 ||
    { cat "$tmp/hello.cc" >&2; fail "cc hello.c \$(pkg-config --cflags --libs kvpage) ($flags)"; }
where=$(LD_LIBRARY_PATH=$lib ldd "$tmp/hello" | awk '$1 == "libkvpage.so.0" { print $3 }')
[ "$(readlink -f "$where")" = "$(readlink -f "$so")" ] ||
    fail "hello loads libkvpage.so.0 from '$where', not from the prefix"
ok "hello.c built with: cc $flags"
TMPDIR=$tmp LD_LIBRARY_PATH=$lib "$tmp/hello" || fail "hello (the C program) exited $?"

# 6. A C++ program through find_package(kvpage) and kvpage::kvpage.
cmake -S "$here/cxx" -B "$tmp/cxx" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_TYPE=Release \
    >"$tmp/cxx.log" 2>&1 || { cat "$tmp/cxx.log" >&2; fail "cmake -S tests/install/cxx (find_package(kvpage))"; }
pkgdir=$(sed -n 's/^kvpage_DIR:[A-Z]*=//p' "$tmp/cxx/CMakeCache.txt")
[ "$(readlink -f "$pkgdir")" = "$(readlink -f "$lib/cmake/kvpage")" ] ||
    fail "find_package(kvpage) found '$pkgdir', not the prefix's $lib/cmake/kvpage"
cmake --build "$tmp/cxx" >>"$tmp/cxx.log" 2>&1 ||
    { cat "$tmp/cxx.log" >&2; fail "building hello_cxx against kvpage::kvpage"; }
ok "hello_cxx built through find_package(kvpage) from $pkgdir"
env -u LD_LIBRARY_PATH "$tmp/cxx/hello_cxx" || fail "hello_cxx (the C++ program) exited $?"

echo "install test passed"
