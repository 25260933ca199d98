#!/usr/bin/env bash
# A fleet on this machine (docs/lake.md): PostgreSQL (installed with apt when missing, run
# in the foreground on a free loopback port, temporary data folder), N collectors shipping
# to one lake, the dashboard, and `loopwatch demo` spread over the collectors. Prints the
# URLs; Ctrl-C stops everything. Extra arguments go to `loopwatch up`.
# Usage: bash scripts/fleet.sh [N] [OPTIONS]   (N defaults to 3)
set -euo pipefail
cd "$(dirname "$0")/.."
members=3
if [[ ${1:-} =~ ^[0-9]+$ ]]; then
  members=$1
  shift
fi
bash scripts/postgres.sh install
[[ -x .venv/bin/loopwatch ]] || bash scripts/bootstrap.sh
exec .venv/bin/loopwatch up --fleet "$members" --demo "$@"
