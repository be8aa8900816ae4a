#!/usr/bin/env bash
# Install the Debian packages the make targets need when they are missing: venv support for the
# system Python, the Redis server and client and the PostgreSQL client (the tests' own Redis,
# service checks), Chromium (browser tests), libfaketime (skewed worker clocks), the MariaDB
# client library and pkg-config (mysqlclient), PgBouncer and Redis Sentinel (make test-topologies).
# As root it runs apt-get; otherwise it prints the exact command and fails.
set -euo pipefail
missing=()
python3 -c "import ensurepip, venv" 2>/dev/null || missing+=(python3-venv)
command -v redis-cli >/dev/null || missing+=(redis-tools)
# The tests start redis-servers of their own (tests/isolation.py, the chaos suite's lock Redis).
command -v redis-server >/dev/null || missing+=(redis-server)
command -v pg_isready >/dev/null || missing+=(postgresql-client)
[ -x /usr/bin/chromium ] || missing+=(chromium)
compgen -G "/usr/lib/*/faketime/libfaketimeMT.so.1" >/dev/null || missing+=(faketime)
pkg-config --exists libmariadb 2>/dev/null || pkg-config --exists mariadb 2>/dev/null || missing+=(libmariadb-dev)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v cc >/dev/null || missing+=(gcc)
command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
command -v redis-sentinel >/dev/null || missing+=(redis-sentinel)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "make needs these Debian packages: ${missing[*]}" >&2
  echo "  Install them: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "Installing ${missing[*]} from Debian's packages..."
# Wait for another apt or dpkg run (unattended-upgrades on a fresh machine) instead of failing.
lock=(-o DPkg::Lock::Timeout=600)
apt-get "${lock[@]}" update -qq
DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" install -y -qq "${missing[@]}" >/dev/null
