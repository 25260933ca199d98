#!/usr/bin/env bash
# The main job: set up, start the collector on the embedded DuckDB default, feed it
# real-shaped agent runs, print the URLs, and keep serving until Ctrl-C.
# Usage: bash scripts/up.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
if loopwatch --help | grep -qE '^  up '; then
  exec loopwatch up --demo
fi
# Until `loopwatch up` lands (corpus demo: issue 5), run the collector and the dashboard
# and feed them the shipped example runs, one per stop reason.
OTLP=${LOOPWATCH_SERVER_OTLP_HTTP:-127.0.0.1:4318}
HTTP=${LOOPWATCH_SERVER_HTTP:-127.0.0.1:9464}
DASH_PORT=${LOOPWATCH_DASHBOARD_PORT:-8501}
loopwatch collector --db "${LOOPWATCH_STORE_DB:-./loopwatch.duckdb}" --otlp-http "$OTLP" --http "$HTTP" &
pid=$!
dash=""
trap 'kill -TERM $pid $dash 2>/dev/null; wait $pid $dash 2>/dev/null' INT TERM EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://$HTTP/healthz" >/dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { echo "the collector did not start" >&2; exit 1; }
  sleep 0.1
done
python -m loopwatch.instrumentation.examples --otlp "http://$OTLP/v1/traces"
loopwatch dashboard --collector "http://$HTTP" --port "$DASH_PORT" >/dev/null 2>&1 &
dash=$!
for _ in $(seq 1 150); do
  curl -fsS "http://127.0.0.1:$DASH_PORT/_stcore/health" >/dev/null 2>&1 && break
  sleep 0.2
done
echo
echo "Dashboard:     http://127.0.0.1:$DASH_PORT"
echo "Stopped runs:  http://$HTTP/api/v1/runs"
echo "Metrics:       http://$HTTP/metrics"
echo "Ctrl-C stops the collector and the dashboard."
wait $pid
