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
# Harmless noise, dropped: pip on some machines warns about an ignored local index
# location, and setuptools warns on every editable install of a package-dir mapping
# ("Editable installation ... folders with the same name as your package", a "!!" block).
quiet() {
  grep -vE "Location 'file:///opt/pypi|^\s*$" | awk '
    /BuildBackendWarning: Editable installation/ { skip = 1; next }
    skip && /^ *!! *$/ { bangs++; if (bangs == 2) { skip = 0; bangs = 0; drop_next = 1 } ; next }
    skip { next }
    drop_next && /with strategy, WheelFile/ { drop_next = 0; next }
    { drop_next = 0; print }
  ' || true
}
stamp=.venv/.loopwatch-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
  # pip runs quietly: say why nothing is printed for a minute or two.
  echo "loopwatch: installing loopwatch and its dependencies into .venv (one to two minutes)"
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | quiet
  .venv/bin/python -m pip install -q -e '.[all,dev]' 2>&1 | quiet
  touch "$stamp"
fi
