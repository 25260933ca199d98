#!/usr/bin/env bash
# PostgreSQL for fleet mode's lake catalog (docs/lake.md), on this machine only.
# Debian does not start services here, so nothing runs in the background: `run` puts a
# fresh cluster in DATA_DIR (initdb, trust auth on loopback) and execs the server in the
# foreground on 127.0.0.1:PORT, so the caller's PID is the server's and Ctrl-C stops it.
# As root, the server runs as the `postgres` user (PostgreSQL refuses root).
# Usage: bash scripts/postgres.sh install
#        bash scripts/postgres.sh bindir
#        bash scripts/postgres.sh run DATA_DIR PORT
set -euo pipefail

bindir() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  [[ -n $dir && -x $dir/postgres ]] || return 1
  echo "$dir"
}

case ${1:-} in
  install)
    if ! bindir >/dev/null; then
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    fi
    bindir >/dev/null || { echo "postgres.sh: PostgreSQL did not install" >&2; exit 1; }
    ;;
  bindir)
    bindir || { echo "postgres.sh: PostgreSQL is not installed (bash scripts/postgres.sh install)" >&2; exit 1; }
    ;;
  run)
    data=${2:?usage: postgres.sh run DATA_DIR PORT}
    port=${3:?usage: postgres.sh run DATA_DIR PORT}
    bin=$(bindir) || { echo "postgres.sh: PostgreSQL is not installed (bash scripts/postgres.sh install)" >&2; exit 1; }
    as=()
    if [[ $(id -u) == 0 ]]; then
      mkdir -p "$data"
      chown postgres: "$data"
      as=(setpriv --reuid=postgres --regid=postgres --init-groups --)
      "${as[@]}" test -w "$data" || {
        echo "postgres.sh: the postgres user cannot write $data (make its parent folders readable, e.g. chmod 755)" >&2
        exit 1
      }
    fi
    if [[ ! -s $data/PG_VERSION ]]; then
      "${as[@]}" "$bin/initdb" -D "$data" -A trust -U postgres -E UTF8 --no-sync >"$data.initdb.log" 2>&1 \
        || { cat "$data.initdb.log" >&2; exit 1; }
    fi
    exec "${as[@]}" "$bin/postgres" -D "$data" -p "$port" -k "$data" \
      -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=200
    ;;
  *)
    sed -n 2,9p "$0" >&2
    exit 2
    ;;
esac
