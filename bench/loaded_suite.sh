#!/bin/bash
# The suite beside `make load`, the way issue 33 asks for it: RUNS times, each on a clean
# checkout of this repository's main branch (its own clone and venv in $CLONE, reset and
# `git clean -fdx` before each run), with bench/load_machine.py started 30 s before
# `CI=true GATEWAY_REQUIRE_SERVICES=1 make test`. One line a run goes to $REPORT (commit,
# exit code, wall seconds, load before and after, pytest's summary); a red run's
# test-output/ is copied next to its log. Not part of `make test`: a run takes 20-35 minutes.
#
#   RUNS="1 2 3" bench/loaded_suite.sh
set -u
SOURCE=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-"1 2 3"}
CLONE=${CLONE:-/tmp/gateway-loaded}
REPORT=${REPORT:-$SOURCE/test-output/loaded_runs.txt}
mkdir -p "$(dirname "$REPORT")"
[ -d "$CLONE" ] || git clone -q "$SOURCE" "$CLONE"
cd "$CLONE" || exit 1
for run in $RUNS; do
  git fetch -q origin && git reset -q --hard origin/main && git clean -q -fdx -e .venv
  commit=$(git rev-parse --short HEAD)
  log=$CLONE.run$run.log
  python3 bench/load_machine.py --seconds 2400 > "$log.load" 2>&1 &
  load=$!
  sleep 30  # the load is up before the suite starts
  before=$(cut -d' ' -f1 /proc/loadavg)
  start=$(date +%s)
  CI=true GATEWAY_REQUIRE_SERVICES=1 make test > "$log" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - start ))
  after=$(cut -d' ' -f1 /proc/loadavg)
  kill "$load" 2>/dev/null
  wait "$load" 2>/dev/null
  summary=$(grep -E "passed|failed" "$log" | tail -1)
  echo "$(date -u +%FT%H:%MZ) run $run $commit rc=$rc wall ${seconds}s load $before -> $after: $summary" >> "$REPORT"
  [ "$rc" -eq 0 ] || cp -r test-output "$log.test-output" 2>/dev/null
done
