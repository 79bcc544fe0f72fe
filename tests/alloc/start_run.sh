#!/usr/bin/env bash
# The daemon's start-up allocation sweep: rank 1 of a 2-daemon cluster is
# started under failalloc.so (tests/alloc/failalloc.c) with its k-th
# allocation failing, counted from the process's start, for each k up to
# what a start and a stop take. daemon_run.sh sweeps the allocations made
# while serving; this one those made while starting (configuration, the
# store, the peer tables and connections, gRPC and HTTP set-up) and
# stopping.
#
#     tests/alloc/start_run.sh BUILD_DIR [SANITIZE]
#
# For each k, rank 1 either
#   - stops at start-up: it must exit with a status of its own (not a
#     signal) and say why on stderr; or
#   - comes up (it logs "serving gRPC"): then SIGTERM must stop it, with
#     status 0, within the bound.
# Rank 0 runs unshimmed throughout, so rank 1's peer set-up dials a live
# daemon, as it does in a cluster.
#
# ALLOC_RUNS (60 by default: a start and stop take about 0.3 s), ALLOC_STRIDE
# and ALLOC_OFFSET as in run.sh; ALLOC_STRIDE=1 tries every k.
set -uo pipefail
sweep_name=daemon_start_alloc_sweep
. "$(dirname "$0")/sweep.sh"
sweep_setup "$@"
distd=$(dirname "$distctl")/../../daemon/distd
cluster=$dir/cluster
conf=$cluster/cluster.conf
rank1=""
bad=0

down() {
  [ -n "$rank1" ] && kill -KILL "$rank1" 2>/dev/null
  timeout 60 "$distctl" cluster down --dir "$cluster" >/dev/null 2>&1
}
trap down EXIT
timeout 60 "$distctl" cluster up -n 2 --dir "$cluster" -- --cluster-id "salloc-$$" \
  >"$dir/up.log" 2>&1 ||
  { cat "$dir/up.log" >&2; echo "$sweep_name: cluster up failed; logs in $dir" >&2; exit 1; }
# Rank 1 is started here, by this script, from now on.
kill -TERM "$(cat "$cluster/distd.1.pid")"
for ((i = 0; i < 100; i++)); do
  kill -0 "$(cat "$cluster/distd.1.pid")" 2>/dev/null || break
  sleep 0.1
done

# Starts rank 1 with FAIL_ALLOC_AT=$1 (0: none) and stops it once it
# serves; its log in $dir/rank1.log. Sets $status (its exit status, or
# "hung") and $served (1 when it came up). A subshell waits for it and
# writes its status, so that this shell never waits by pid.
start_and_stop() {
  rm -f "$dir/rank1.pid" "$dir/rank1.status"
  (
    env LD_PRELOAD="$shim" FAIL_ALLOC_AT="$1" FAIL_ALLOC_COUNT=1 "$distd" \
      --cluster-file "$conf" --rank 1 --http-listen 127.0.0.1:0 --cluster-id "salloc-$$" \
      >"$dir/rank1.log" 2>&1 &
    echo $! >"$dir/rank1.pid"
    wait $!
    echo $? >"$dir/rank1.status.tmp" && mv "$dir/rank1.status.tmp" "$dir/rank1.status"
  ) &
  local i
  for ((i = 0; i < 100; i++)); do
    [ -s "$dir/rank1.pid" ] && break
    sleep 0.01
  done
  rank1=$(cat "$dir/rank1.pid")
  served=0 status=""
  for ((i = 0; i < 600; i++)); do # 30 s: a loaded machine starts slowly
    grep -q 'serving gRPC' "$dir/rank1.log" && { served=1; break; }
    [ -e "$dir/rank1.status" ] && break
    sleep 0.05
  done
  [ "$served" -eq 1 ] && kill -TERM "$rank1"
  for ((i = 0; i < 100; i++)); do
    [ -e "$dir/rank1.status" ] && { status=$(cat "$dir/rank1.status"); break; }
    sleep 0.1
  done
  if [ -z "$status" ]; then
    kill -KILL "$rank1"
    status=hung
  fi
  wait # the subshell
  rank1=""
}

start_and_stop 0
[ "$served" -eq 1 ] && [ "$status" = 0 ] ||
  { cat "$dir/rank1.log" >&2; echo "$sweep_name: the clean start failed; logs in $dir" >&2; exit 1; }
n=$(allocations_in "$dir/rank1.log")
if [ -z "$n" ] || [ "$n" -lt 1 ]; then
  echo "$sweep_name: the shim counted no allocation" >&2
  exit 1
fi
sweep_plan "$n" "${ALLOC_RUNS:-60}"

# What is wrong with the run of k=$1, if anything (empty: nothing).
judge() {
  if [ "$status" = hung ]; then echo "did not stop within 10 s"
  elif [ "$status" -gt 128 ]; then echo "killed by signal $((status - 128))"
  elif [ "$served" -eq 1 ] && [ "$status" -ne 0 ]; then echo "came up, then stopped with $status"
  elif [ "$served" -eq 0 ] && [ "$status" -eq 0 ]; then echo "never came up, yet exited 0"
  elif [ "$served" -eq 0 ] && ! grep -v '^failalloc:' "$dir/rank1.log" | grep -q .; then
    echo "stopped at start-up without a word"
  fi
}

stopped=0 came_up=0
for ((k = offset + 1; k <= n; k += stride)); do
  start_and_stop "$k"
  [ "$served" -eq 1 ] && came_up=$((came_up + 1)) || stopped=$((stopped + 1))
  why=$(judge)
  [ -z "$why" ] && continue
  bad=$((bad + 1))
  echo "$sweep_name: k=$k: rank 1 $why" >&2
  grep -v '^failalloc: [0-9]' "$dir/rank1.log" | tail -5 >&2
  cp "$dir/rank1.log" "$dir/rank1.k$k.log"
done
echo "$sweep_name: $((came_up + stopped)) starts: $came_up came up and stopped, $stopped" \
  "stopped at start-up saying why; $bad wrong"
[ "$bad" -eq 0 ] || { echo "$sweep_name: logs in $dir" >&2; exit 1; }
down
trap - EXIT
rm -rf "$dir"
exit 0
