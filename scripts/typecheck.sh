#!/usr/bin/env bash
# mypy --strict over every package under its installed name. The folders map onto the
# loopwatch.* namespace through setuptools' package-dir, which mypy cannot follow; checked
# as plain folders, every `from loopwatch.x import y` would be typed Any. So the check runs
# on a tree of links named as installed.
# Usage: bash scripts/typecheck.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/loopwatch"
for pkg in instrumentation collector dashboard cli replay; do
  ln -s "$root/$pkg" "$tree/loopwatch/$pkg"
done
ln -s "$root/grafana" "$tree/grafana"
cd "$tree"
mypy=("$root/.venv/bin/mypy" --config-file "$root/pyproject.toml" --cache-dir "$root/.mypy_cache")
MYPYPATH=$tree "${mypy[@]}" -p loopwatch.instrumentation -p loopwatch.collector \
  -p loopwatch.dashboard -p loopwatch.cli -p loopwatch.replay
MYPYPATH=$tree/grafana "${mypy[@]}" grafana/lint.py grafana/dashboard_blocks.py grafana/generate.py
