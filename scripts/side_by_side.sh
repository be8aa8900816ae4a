#!/usr/bin/env bash
# Two test runs at once on one machine, as a second checkout or a developer's own loop would start
# them: this checkout and a copy of its working tree elsewhere, each with its own run id, test
# databases and Redis server (tests/isolation.py), against the same PostgreSQL. Both must pass.
# Usage: scripts/side_by_side.sh [pytest arguments] (default: make quick's selection).
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD
python=$here/.venv/bin/python
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-m "not workers and not browser and not chaos")
second=$(mktemp -d /tmp/idem-side-by-side-XXXXXX)
trap 'rm -rf "$second"' EXIT
# The working tree as it is (uncommitted edits included), without the venv, tox envs or history.
tar --exclude=./.venv --exclude=./.tox --exclude=./.git --exclude=./dist -cf - . | tar -xf - -C "$second"

run() {  # run <name> <dir>: pytest in <dir>, its output in <second>/<name>.log, its seconds and status
  local name=$1 dir=$2 start status
  start=$(date +%s)
  # The second copy imports its own package and tests: python -m puts the current directory first.
  (cd "$dir" && "$python" -m pytest -q "${args[@]}") >"$second/$name.log" 2>&1 && status=0 || status=$?
  echo "$name $(($(date +%s) - start)) $status" >"$second/$name.result"
}

begin=$(date +%s)
run first "$here" &
first=$!
run second "$second" &
second_pid=$!
wait "$first" "$second_pid"
failed=0
for name in first second; do
  read -r _ seconds status <"$second/$name.result"
  echo "$name run ($([ "$name" = first ] && echo "$here" || echo "a copy in $second")): exit $status in ${seconds} s: $(tail -n 1 "$second/$name.log")"
  if [ "$status" != 0 ]; then
    failed=1
    tail -n 40 "$second/$name.log"
  fi
done
echo "both runs, side by side: $(($(date +%s) - begin)) s"
exit $failed
