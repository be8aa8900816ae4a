#!/usr/bin/env bash
# Check that PostgreSQL and Redis answer (or, for the tests, that redis-server is installed);
# say how to start them if not.
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
# The test suite starts a redis-server of its own (tests/isolation.py) unless IDEMPOTENT_TESTS_REDIS_URL
# hands it one; the demo and the benchmarks use REDIS_URL (NEED_REDIS=url).
if [ "${NEED_REDIS:-server}" = server ] && [ -n "${IDEMPOTENT_TESTS_REDIS_URL:-}" ]; then
  redis_url=$IDEMPOTENT_TESTS_REDIS_URL
elif [ "${NEED_REDIS:-server}" = server ]; then
  redis_url=
  if ! command -v redis-server >/dev/null; then
    echo "The tests start a redis-server of their own: install it (sudo apt-get install -y redis-server)" >&2
    echo "  or set IDEMPOTENT_TESTS_REDIS_URL to a Redis server the run may wipe." >&2
    status=1
  fi
fi
if [ -n "$redis_url" ] && ! redis-cli -u "$redis_url" ping >/dev/null 2>&1; then
  echo "Redis does not answer at $redis_url." >&2
  redis_port=$(echo "$redis_url" | sed -E 's#^[a-z]+://([^@/]*@)?[^:/]*:?([0-9]*).*#\2#')
  command -v redis-server >/dev/null || echo "  Install it: sudo apt-get install -y redis-server" >&2
  echo "  Start it: redis-server --daemonize yes --bind 127.0.0.1 --port ${redis_port:-6379} --save '' --appendonly no" >&2
  status=1
fi
exit $status
