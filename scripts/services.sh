#!/usr/bin/env bash
# Install what the integration tests start themselves: Debian packages (default:
# prometheus, chromium, postgresql) and the Node OTLP exporter. Nothing is started here: each test runs its
# server in the foreground on a free loopback port with a temporary data dir.
# Usage: bash scripts/services.sh [DEBIAN_PACKAGE...]
set -euo pipefail
cd "$(dirname "$0")/.."
if (($# == 0)); then
  set -- prometheus chromium postgresql
fi
need=()
for pkg in "$@"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Node client for tests/integration/test_node_exporter.py. The machine may ship
# nodesource's node with its own npm; Debian's npm would conflict with it, so apt only
# when npm is missing.
if ! command -v npm >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
(cd tests/integration/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
