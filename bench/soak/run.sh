#!/usr/bin/env bash
# bench/soak/run.sh — the soak benchmark of issue 11 (not run in CI).
#
# Mixed vLLM + SGLang traffic from 16 keep-alive connections for 10 minutes
# against `kvpage serve --fsync batch --data-dir DIR`, SIGKILL and restart of
# the server every 30 s; then a clean stop and `kvpage fsck DIR`.
#
#   bench/soak/run.sh                                   # 600 s, kill every 30 s, 16 connections
#   bench/soak/run.sh --duration 60 --kill-interval 15  # a short validation run
#   bench/soak/run.sh --bin /path/to/kvpage --conns 8 --out /tmp/soak
#
# Flags (all passed to soak.py; `run.sh --help` lists every one):
#   --duration S       seconds of traffic (600)
#   --kill-interval S  seconds between SIGKILLs (30)
#   --conns N          connections, one thread and one keep-alive session each (16)
#   --bin PATH         the kvpage binary (build/kvpage of this repo; `make build`)
#   --out DIR          results directory (bench/soak/results/<UTC date-time>/)
# Writes summary.txt, samples.csv, windows.csv, errors.csv and server.log
# into the results directory (see README.md). Exit status: 0 if the run
# completed (whatever its figures), non-zero if it could not run.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=/usr/bin/python3
"$PY" -c 'import requests' 2>/dev/null || {
    echo "run.sh: $PY cannot import requests (apt-get install python3-requests)" >&2; exit 2; }
exec "$PY" "$HERE/soak.py" "$@"
