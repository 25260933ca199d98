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
# Until `loopwatch up` lands (dashboard and corpus demo: issues 4-5), run the collector
# and feed it the shipped example runs, one per stop reason.
OTLP=${LOOPWATCH_SERVER_OTLP_HTTP:-127.0.0.1:4318}
HTTP=${LOOPWATCH_SERVER_HTTP:-127.0.0.1:9464}
loopwatch collector --db "${LOOPWATCH_STORE_DB:-./loopwatch.duckdb}" --otlp-http "$OTLP" --http "$HTTP" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null' INT TERM EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://$HTTP/healthz" >/dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { echo "the collector did not start" >&2; exit 1; }
  sleep 0.1
done
python -m loopwatch.instrumentation.examples --otlp "http://$OTLP/v1/traces"
echo
echo "Stopped runs:  http://$HTTP/api/v1/runs"
echo "Metrics:       http://$HTTP/metrics"
echo "Ctrl-C stops the collector."
wait $pid
