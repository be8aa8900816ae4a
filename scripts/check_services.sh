#!/usr/bin/env bash
# Check that PostgreSQL and Redis answer; say how to start them if not.
set -u
status=0
pg_url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
redis_url=${REDIS_URL:-redis://127.0.0.1:6379}
if [ "${NEED_POSTGRES:-1}" = 1 ] && ! pg_isready -q -d "$pg_url"; then
  echo "PostgreSQL does not answer at $pg_url." >&2
  [ -d /etc/postgresql ] || echo "  Install it: sudo apt-get install -y postgresql" >&2
  echo "  Start it: pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main start" >&2
  status=1
fi
if ! redis-cli -u "$redis_url" ping >/dev/null 2>&1; then
  echo "Redis does not answer at $redis_url." >&2
  redis_port=$(echo "$redis_url" | sed -E 's#^[a-z]+://([^@/]*@)?[^:/]*:?([0-9]*).*#\2#')
  command -v redis-server >/dev/null || echo "  Install it: sudo apt-get install -y redis-server" >&2
  echo "  Start it: redis-server --daemonize yes --bind 127.0.0.1 --port ${redis_port:-6379} --save '' --appendonly no" >&2
  status=1
fi
exit $status
