#!/usr/bin/env bash
# bench/io/tags.sh — issue 36 §1: what integrity tags cost. `kvpage bench io`
# with --tags on and --tags off, interleaved (on, off, on, off, ...) REPS
# times per configuration, medians per side, ratio on / off (1.00 = free,
# 0.90 = 10% slower with tags). Configurations: 256 KiB and 2 MiB pages, 1
# and 4 callers, buffered and O_DIRECT (a 512 MiB file on a disk file
# system), and USRBIO over the emulation (tests/usrbio_emu) buffered.
#
#   bench/io/tags.sh [REPS] [OUT]   (env: KVPAGE, default build/kvpage; DIR, default
#                                    /var/tmp/kvp_tags; SECONDS_EACH, default 1)
# Raw lines go to OUT (default bench/io/results-tags.txt), the table to stdout.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KVPAGE=${KVPAGE:-$REPO/build/kvpage}
DIR=${DIR:-/var/tmp/kvp_tags}
REPS=${1:-3}
OUT=${2:-$REPO/bench/io/results-tags.txt}
SEC=${SECONDS_EACH:-1}
mkdir -p "$DIR" "$DIR/emu3fs"
: >"$OUT.err"
{
    echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) nproc=$(nproc) git=$(git -C "$REPO" rev-parse --short HEAD)" \
        "load=$(cut -d' ' -f1-3 /proc/loadavg) cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
} | tee "$OUT"
run() { # mode page threads tags [env...]
    local mode=$1 page=$2 thr=$3 tags=$4 file=$DIR/tags.pages extra=()
    shift 4
    case $mode in
    direct) extra=(--direct) ;;
    usrbio) extra=(--backend usrbio) file=$DIR/emu3fs/tags.pages ;;
    esac
    env "$@" "$KVPAGE" bench io --file "$file" --file-size 512M --pool 256M --page-size "$page" \
        --threads "$thr" --rw both --seconds "$SEC" --warmup 0.3 --tags "$tags" "${extra[@]}" \
        --json 2>>"$OUT.err" |
        /usr/bin/python3 -c "
import json, sys
d = json.load(sys.stdin)
print('mode=$mode page=$page threads=$thr tags=$tags read_gbs=%.3f write_gbs=%.3f backend=%s/%s'
      % (d['read']['kvpage']['gbs'], d['write']['kvpage']['gbs'],
         d['read']['kvpage']['backend'], d['write']['kvpage']['backend']))"
}
EMU=(KVPAGE_USRBIO_LIB="$(dirname "$KVPAGE")/libhf3fs_emu.so" KVPAGE_USRBIO_EMU_MOUNT="$DIR/emu3fs"
     KVPAGE_USRBIO_EMU_REG_RESULT=dup)
for mode in buffered direct usrbio; do
    for page in 256K 2M; do
        for thr in 1 4; do
            for rep in $(seq "$REPS"); do
                for tags in on off; do
                    if [ "$mode" = usrbio ]; then
                        run "$mode" "$page" "$thr" "$tags" "${EMU[@]}"
                    else
                        run "$mode" "$page" "$thr" "$tags" KVP_X=1
                    fi | tee -a "$OUT"
                done
            done
        done
    done
done
rm -f "$DIR/tags.pages" "$DIR/tags.pages.tags" "$DIR/emu3fs/tags.pages" "$DIR/emu3fs/tags.pages.tags"
/usr/bin/python3 - "$OUT" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if line.startswith("#") or "=" not in line:
        continue
    kv = dict(x.split("=", 1) for x in line.split())
    key = (kv["mode"], kv["page"], int(kv["threads"]))
    side = rows.setdefault(key, {}).setdefault(kv["tags"], {"read": [], "write": []})
    side["read"].append(float(kv["read_gbs"]))
    side["write"].append(float(kv["write_gbs"]))
print("| mode | page | callers | read on / off GB/s | read on÷off | write on / off GB/s | write on÷off |")
print("|---|---|---:|---:|---:|---:|---:|")
for (mode, page, thr), s in rows.items():
    if "on" not in s or "off" not in s:
        continue
    cells = []
    for d in ("read", "write"):
        on, off = statistics.median(s["on"][d]), statistics.median(s["off"][d])
        cells += ["%.2f / %.2f" % (on, off), "**%.2f**" % (on / off if off else 0)]
    print("| %s | %s | %d | %s |" % (mode, page, thr, " | ".join(cells)))
PY
