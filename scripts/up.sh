#!/usr/bin/env bash
# The main job: set up, then `loopwatch up --demo`: the collector on the embedded DuckDB
# default (./loopwatch.duckdb) and the dashboard, fed with recorded agent runs replayed
# through the real instrumentation. Prints the URLs (the dashboard's last) and serves
# until Ctrl-C. Extra arguments go to `loopwatch up` (e.g. --corpus PATH, --policy FILE).
# Usage: bash scripts/up.sh [OPTIONS]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/loopwatch up --demo "$@"
