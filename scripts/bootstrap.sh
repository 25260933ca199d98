#!/usr/bin/env bash
# Create .venv with loopwatch and every extra installed (editable). Idempotent.
# Usage: bash scripts/bootstrap.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
# pip on some machines warns about an ignored local index location; the warning is harmless.
quiet() { grep -vE "Location 'file:///opt/pypi|^\s*$" || true; }
stamp=.venv/.loopwatch-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | quiet
  .venv/bin/python -m pip install -q -e '.[all,dev]' 2>&1 | quiet
  touch "$stamp"
fi
