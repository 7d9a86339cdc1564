#!/usr/bin/env bash
# Online serving and materialization beside Redis itself (not a test).
#
#   bench/serve_bench.sh QUIVER_BINARY [REPO]
#
# REPO is a Quiver repository holding the shared benchmark data (bench/pit_bench.py
# leaves one in $PITDATA/quiver_medium). The script starts a private redis-server on a
# free loopback port, materializes every view into it (rows/s), serves it with
# `quiver serve`, and loads /get-online-features with wrk (8 connections, 2 threads,
# 10 s) for 1, 10 and 100 entities x 2 views x 8 features; then redis-benchmark GETs on
# the same Redis, the limit one round trip can reach. Needs redis-server, wrk,
# redis-benchmark (apt: redis-server wrk).
set -euo pipefail
Q=$(realpath "${1:?usage: serve_bench.sh QUIVER_BINARY [REPO]}")
REPO=${2:-${PITDATA:-/tmp/pitdata}/quiver_medium}
WORK=$(mktemp -d /tmp/quiver-serve-bench.XXXXXX)
# The venv ./run makes has pyarrow (to pick real driver ids from the spine).
PY=${PYTHON:-$HOME/.cache/quiver/venv/bin/python}
[ -x "$PY" ] || PY=python3
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RPORT=$(free_port)
HPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes --pidfile "$WORK/redis.pid" >/dev/null
cleanup() {
    [ -f "$WORK/serve.pid" ] && kill "$(cat "$WORK/serve.pid")" 2>/dev/null || true
    [ -f "$WORK/redis.pid" ] && kill "$(cat "$WORK/redis.pid")" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
sleep 0.5
export QUIVER_ONLINE_STORE_TYPE=redis QUIVER_ONLINE_STORE_URL="redis://127.0.0.1:$RPORT/0"
cd "$REPO"
echo "== materialize into Redis"
"$Q" materialize 2000-01-01T00:00:00Z now
"$Q" serve --port "$HPORT" >"$WORK/serve.log" 2>&1 &
echo $! >"$WORK/serve.pid"
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$HPORT) 2>/dev/null && break; sleep 0.1; done
IDS=$("$PY" -c "
import pyarrow.parquet as pq, sys
t = pq.read_table('$REPO/../medium/spine.parquet', columns=['driver_id']).slice(0, 100)
print(','.join(str(x) for x in t.column(0).to_pylist()))" 2>/dev/null || echo "")
if [ -z "$IDS" ]; then IDS=$(seq -s, 1 100); fi
for n in 1 10 100; do
    ids=$(echo "$IDS" | cut -d, -f1-"$n")
    cat >"$WORK/post.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"entities": {"driver_id": [$ids]}, "features": ["driver_hourly:conv_rate", "driver_hourly:acc_rate", "driver_hourly:avg_speed", "driver_hourly:temp", "driver_hourly:trips", "driver_daily:rating", "driver_daily:daily_trips", "driver_daily:earnings"]}'
EOF
    echo "== wrk: $n entities x 2 views x 8 features"
    wrk -t2 -c8 -d10s --latency -s "$WORK/post.lua" "http://127.0.0.1:$HPORT/get-online-features" | grep -E "Requests/sec|50%|99%|Non-2xx|Latency "
done
echo "== redis-benchmark GET, 8 connections (the limit of one round trip)"
redis-benchmark -p "$RPORT" -t get -n 200000 -c 8 -q
