#!/usr/bin/env bash
# The allocation sweep: alloc_client (libdist linked in) against a
# 2-daemon cluster, once counting its allocations, then once per k with
# the k-th failing (tests/alloc/failalloc.c), then once clean again.
#
#     tests/alloc/run.sh BUILD_DIR [SANITIZE [held]]
#
# With "held" the cluster has 3 daemons and alloc_client runs only its
# put of a name held outside the put's mesh (alloc_client.c).
# A run with a failure must exit 0 or 3 (a call said DIST_ENOMEM); a
# signal (a crash), a timeout (a hang) or any other exit fails the sweep,
# naming k so that `FAIL_ALLOC_AT=k LD_PRELOAD=.../failalloc.so
# alloc_client ...` repeats it. The last clean run shows that the failures
# left nothing in the daemons that breaks the next caller.
#
# ALLOC_STRIDE=s tries every s-th k from ALLOC_OFFSET (default: a stride
# that keeps the sweep near ALLOC_RUNS runs, 300 by default: a run takes
# about 0.2 s on two busy cores, so ~60 s for 1,200 to 3,600 allocations
# counted; the offset is drawn at random in 0..s-1 and printed, so that
# successive runs cover other sites).
# ALLOC_STRIDE=1 sweeps every allocation.
set -uo pipefail
build=$1
sanitize=${2:-none}
mode=${3:-}
world=2
[ "$mode" = held ] && world=3
if [ "$sanitize" != none ]; then
  echo "alloc_sweep: skipped under -Db_sanitize=$sanitize (the shim fronts the plain allocator)"
  exit 77
fi
client=$build/tests/alloc/alloc_client
shim=$build/tests/alloc/failalloc.so
distctl=$build/client/distctl/distctl
run_timeout=20 # a run takes 0.2-0.5 s: a few hangs stay inside meson's 300 s
dir=$(mktemp -d /tmp/distd-alloc-XXXXXX)
down() { timeout 60 "$distctl" cluster down --dir "$dir/cluster" >/dev/null 2>&1; }
trap down EXIT
timeout 60 "$distctl" cluster up -n "$world" --dir "$dir/cluster" -- --cluster-id "alloc-$$" \
  >"$dir/up.log" 2>&1 || { cat "$dir/up.log" >&2; echo "alloc_sweep: cluster up failed; logs in $dir" >&2; exit 1; }
conf=$dir/cluster/cluster.conf

# One run of the client with FAIL_ALLOC_AT=$1 (0: none) and name prefix $2;
# its exit status (124: timed out), its stderr in $dir/err.
run_client() {
  rm -rf "$dir/ckpt"
  # env sets the shim for the client alone: timeout's own mallocs stay whole
  timeout -s KILL "$run_timeout" env FAIL_ALLOC_AT="$1" FAIL_ALLOC_COUNT=1 LD_PRELOAD="$shim" \
    "$client" "$conf" "$2" "$dir/ckpt" $mode 2>"$dir/err"
  local rc=$?
  [ "$rc" -eq 137 ] && rc=124 # killed by timeout
  return "$rc"
}

# A run with no failure, which must succeed ($1 says which).
clean_run() {
  run_client 0 "a$$.$1"
  local rc=$?
  [ "$rc" -eq 0 ] && return 0
  cat "$dir/err" >&2
  echo "alloc_sweep: the clean run $1 failed ($rc); logs in $dir" >&2
  exit 1
}

clean_run before
n=$(sed -n 's/^failalloc: \([0-9]*\) allocations$/\1/p' "$dir/err")
if [ -z "$n" ] || [ "$n" -lt 1 ]; then
  echo "alloc_sweep: the shim counted no allocation" >&2
  exit 1
fi
runs=${ALLOC_RUNS:-300}
stride=${ALLOC_STRIDE:-$(((n + runs - 1) / runs))}
offset=${ALLOC_OFFSET:-$((RANDOM % stride))}
echo "alloc_sweep: $n allocations; failing k = $((offset + 1)), $((offset + 1 + stride)), ... (stride $stride)"

bad=0 tried=0 enomem=0
for ((k = offset + 1; k <= n; k += stride)); do
  run_client "$k" "a$$.k$k"
  rc=$?
  tried=$((tried + 1))
  case $rc in
    0) ;;
    3) enomem=$((enomem + 1)) ;;
    124) bad=$((bad + 1)); echo "alloc_sweep: k=$k hung (killed after ${run_timeout}s)" >&2 ;;
    *)
      bad=$((bad + 1))
      if [ "$rc" -gt 128 ]; then why="killed by signal $((rc - 128))"; else why="exit $rc"; fi
      echo "alloc_sweep: k=$k: $why" >&2
      grep -v '^failalloc:' "$dir/err" | tail -5 >&2
      ;;
  esac
done
echo "alloc_sweep: $tried runs, $enomem failed with DIST_ENOMEM, $((tried - enomem - bad)) succeeded, $bad wrong"

clean_run after
[ "$bad" -eq 0 ] || { echo "alloc_sweep: logs in $dir" >&2; exit 1; }
down
trap - EXIT
rm -rf "$dir"
exit 0
