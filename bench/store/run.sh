#!/usr/bin/env bash
# bench/store/run.sh — the store benchmark of issue 13.
#
# Runs `kvpage bench store --json` (put and get through the store, and the
# same batches through kvp_pagefile alone on the same file in the same run)
# for each case below, REPS times, the cases interleaved (A B C ... then the
# reverse order), and prints a markdown table of medians with the targets.
# Each run's own figures are medians of its rounds after a warm-up round of
# both sides (issue 36; `kvpage bench store --help`).
#
#   bench/store/run.sh              # everything, ~3 minutes
#   REPS=5 bench/store/run.sh
#
# Cases: 2 MiB pages in batches of 128 keys, buffered I/O, embedded metadata
# (a data directory beside the file, fsync batch) and a kvpage serve on
# loopback (--fsync batch, --data-dir on the same disk, and "owndisk": in
# /dev/shm, standing in for a metadata server with a disk of its own); with
# durable puts (fdatasync before confirming; the page file alone then
# flushes too) and without. Then 64 KiB pages in batches of 128, where the
# metadata dominates: keys/s embedded and remote, and the metadata alone.
#
# Env: KVPAGE (binary, default build/kvpage), REPS (3), ROUNDS (16: batches of
#      each kind per run), DIR (scratch directory on the disk to measure,
#      default a new one under /var/tmp), OUT (directory for the raw JSON,
#      default bench/store/results/DATE), KEEP (keep the scratch directory).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
KVPAGE=${KVPAGE:-$REPO/build/kvpage}
REPS=${REPS:-3}
ROUNDS=${ROUNDS:-16}
OUT=${OUT:-$HERE/results/$(date -u +%Y-%m-%d-%H%M)}
DIR=${DIR:-$(mktemp -d /var/tmp/kvpage-bench-store.XXXXXX)}
mkdir -p "$OUT" "$DIR"
[ -x "$KVPAGE" ] || { echo "run.sh: $KVPAGE is not built (make build)" >&2; exit 1; }

pids=()
SHM=$(mktemp -d /dev/shm/kvpage-bench-store.XXXXXX)
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  rm -rf "$SHM"
  [ -n "${KEEP:-}" ] || rm -rf "$DIR"
}
trap cleanup EXIT

# start_server DATA_DIR: starts a kvpage serve, sets $started_port
start_server() {
  started_port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$KVPAGE" serve --listen "127.0.0.1:$started_port" --data-dir "$1" --log-level warn \
    >>"$DIR/serve.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    /usr/bin/python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$started_port/healthz', timeout=1)" \
      2>/dev/null && return
    sleep 0.1
  done
  cat "$DIR/serve.log" >&2; exit 1
}
start_server "$DIR/srv"; port=$started_port
start_server "$SHM/srv"; port_own=$started_port

# name | flags
cases=(
  "2M-embedded-durable|--page-size 2M --batch 128"
  "2M-remote-durable|--page-size 2M --batch 128 --meta http://127.0.0.1:$port"
  "2M-embedded|--page-size 2M --batch 128 --no-durable"
  "2M-remote|--page-size 2M --batch 128 --no-durable --meta http://127.0.0.1:$port"
  "2M-remote-owndisk|--page-size 2M --batch 128 --no-durable --meta http://127.0.0.1:$port_own"
  "64K-embedded|--page-size 64K --batch 128 --no-durable"
  "64K-remote|--page-size 64K --batch 128 --no-durable --meta http://127.0.0.1:$port"
  "64K-remote-owndisk|--page-size 64K --batch 128 --no-durable --meta http://127.0.0.1:$port_own"
)

run_case() { # rep index
  local name=${1%%|*} flags=${1#*|} rep=$2
  local f="$DIR/$name.pages"
  # shellcheck disable=SC2086
  (cd "$DIR" && "$KVPAGE" bench store --file "$f" --rounds "$ROUNDS" $flags --json) \
    >"$OUT/$name.rep$rep.json"
  rm -rf "$f" "$f.meta"
  echo "  $name rep $rep: $(tr -d '\n' <"$OUT/$name.rep$rep.json" | head -c 160)..." >&2
}

echo "bench/store: $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), $KVPAGE, scratch $DIR" >&2
for rep in $(seq "$REPS"); do
  if [ $((rep % 2)) = 1 ]; then order=("${cases[@]}"); else
    order=(); for ((i=${#cases[@]}-1; i>=0; i--)); do order+=("${cases[$i]}"); done; fi
  for c in "${order[@]}"; do run_case "$c" "$rep"; done
done

/usr/bin/python3 "$HERE/report.py" "$OUT" | tee "$OUT/summary.md"
