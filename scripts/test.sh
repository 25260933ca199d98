#!/usr/bin/env bash
# Set up everything the test suite needs and run all of it: lint, types, unit and
# integration tests, and the short benchmark smoke run.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/services.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"
ruff check .
echo "== mypy"
bash scripts/typecheck.sh
echo "== pytest"
mkdir -p test-artifacts
LOOPWATCH_BENCH=${LOOPWATCH_BENCH:-smoke} python -m pytest --durations=20 "$@"
echo "== frameworks"
bash scripts/frameworks.sh
