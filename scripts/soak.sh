#!/usr/bin/env bash
# Tier 2 of the chaos suite (make soak): 10,000 deliveries under faults, including restarts of a
# private PostgreSQL cluster this script creates on its own port and always removes again.
set -euo pipefail
cd "$(dirname "$0")/.."

# A free port unless CHAOS_PG_PORT fixes it: two soaks on one machine each get their own.
port=${CHAOS_PG_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
root=$(mktemp -d /tmp/idem-soak-pg.XXXXXX)
data=$root/data

as_postgres() {
  if [ "$(id -un)" = postgres ]; then bash -c "$1"; else su postgres -c "$1"; fi
}
cleanup() {
  as_postgres "$bin/pg_ctl -D $data -m immediate -w stop" >/dev/null 2>&1 || true
  rm -rf "$root"
}
trap cleanup EXIT INT TERM

chown postgres "$root" 2>/dev/null || true
as_postgres "$bin/initdb -D $data -A trust -U postgres --no-sync" >/dev/null
as_postgres "$bin/pg_ctl -D $data -w -l $data/server.log -o '-p $port -k $root -c listen_addresses=127.0.0.1 -c fsync=off' start" >/dev/null

DATABASE_URL=postgres://postgres@127.0.0.1:$port/idem_soak \
CHAOS_PG_DATA=$data CHAOS_PG_BIN=$bin \
  .venv/bin/python -m pytest tests/chaos/soak.py "$@"
