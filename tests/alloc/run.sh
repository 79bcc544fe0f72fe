#!/usr/bin/env bash
# The allocation sweep: alloc_client (libdist linked in) against a
# 2-daemon cluster, once counting its allocations, then once per k with
# the k-th failing (tests/alloc/failalloc.c), then once clean again.
#
#     tests/alloc/run.sh BUILD_DIR [SANITIZE [held]]
#
# With "held" the cluster has 3 daemons and alloc_client runs only its
# put of a name held outside the put's mesh (alloc_client.c).
#
# (daemon_run.sh fails a daemon's allocations instead; sweep.sh holds what
# the two share.)
#
# A run with a failure must exit 0 or 3 (a call said DIST_ENOMEM); a
# signal (a crash), a timeout (a hang) or any other exit fails the sweep,
# naming k so that `FAIL_ALLOC_AT=k LD_PRELOAD=.../failalloc.so
# alloc_client ...` repeats it; so does a run, failed or not, that leaves
# a tensor in the daemons (listed after each). The last clean run shows
# that the failures left nothing in the daemons that breaks the next
# caller.
#
# ALLOC_STRIDE=s tries every s-th k from ALLOC_OFFSET (default: a stride
# that keeps the sweep near ALLOC_RUNS runs, 250 by default, 60 in the
# "held" mode: a run and the listing after it take about 0.25 s on two
# busy cores, so ~60 s for about 5,200 allocations counted (a stride of
# 21), and ~15 s for the held mode's 150; the offset is drawn at random
# in 0..s-1 and printed, so that successive runs cover other sites;
# ALLOC_SHARE scales the runs, sweep.sh). ALLOC_STRIDE=1 sweeps every
# allocation.
set -uo pipefail
sweep_name=alloc_sweep
. "$(dirname "$0")/sweep.sh"
sweep_setup "$1" "${2:-none}"
world=2
if [ "${3:-}" = held ]; then
  world=3 client_mode=(held)
fi
down() { timeout 60 "$distctl" cluster down --dir "$dir/cluster" >/dev/null 2>&1; }
trap down EXIT
timeout 60 "$distctl" cluster up -n "$world" --dir "$dir/cluster" -- --cluster-id "alloc-$$" \
  >"$dir/up.log" 2>&1 || { cat "$dir/up.log" >&2; echo "alloc_sweep: cluster up failed; logs in $dir" >&2; exit 1; }
conf=$dir/cluster/cluster.conf

# One run of the client under the shim, with FAIL_ALLOC_AT=$1 (0: none)
# and name prefix $2.
run_shimmed() {
  run_client "$conf" "$2" FAIL_ALLOC_AT="$1" FAIL_ALLOC_COUNT=1 LD_PRELOAD="$shim"
}

# A run with no failure, which must succeed ($1 says which).
clean_run() {
  run_shimmed 0 "a$$.$1"
  local rc=$?
  [ "$rc" -eq 0 ] && return 0
  cat "$dir/err" >&2
  echo "alloc_sweep: the clean run $1 failed ($rc); logs in $dir" >&2
  exit 1
}

# A tensor of a caller's that no run names, 1..8 as float32 [4, 2] on
# [0,1]: an undo deletes only names its call stored, so it stays, with its
# value, through every run (listed after each, its value read at the end).
sentinel=alloc_sentinel.$$
npy_data() { # the data bytes of .npy file $1, as hex
  "$python" -c 'import sys; b = open(sys.argv[1], "rb").read(); print(b[10 + int.from_bytes(b[8:10], "little"):].hex())' "$1"
}
"$python" -c 'import struct, sys
h = "{\x27descr\x27: \x27<f4\x27, \x27fortran_order\x27: False, \x27shape\x27: (4, 2), }"
h += " " * (117 - len(h)) + "\n"
open(sys.argv[1], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + struct.pack("<8f", *range(1, 9)))' \
  "$dir/sentinel.npy" &&
  timeout 60 "$distctl" --cluster "$conf" tensor put "$sentinel" "$dir/sentinel.npy" --mesh "[0,1]" \
    --placements "Shard(0)" >"$dir/sentinel.log" 2>&1 ||
  { cat "$dir/sentinel.log" >&2; echo "alloc_sweep: cannot put the sentinel; logs in $dir" >&2; exit 1; }
sentinel_intact() {
  timeout 60 "$distctl" --cluster "$conf" tensor get "$sentinel" -o "$dir/sentinel_back.npy" \
    >"$dir/sentinel.log" 2>&1 &&
    [ "$(npy_data "$dir/sentinel_back.npy")" = "$(npy_data "$dir/sentinel.npy")" ] && return 0
  cat "$dir/sentinel.log" >&2
  echo "alloc_sweep: the sentinel $sentinel lost its value" >&2
  return 1
}

# The tensors the daemons hold. alloc_client deletes every name it made
# on success, and libdist undoes what a failed call stored (also where
# its reply was lost), so a run must leave none: any name a run added
# fails the sweep, named with the run's k, as does a run after which the
# sentinel is gone.
held=$sentinel
check_left() {
  local now new
  now=$("$distctl" --cluster "$conf" tensors --json |
    "$python" -c 'import json, sys; print("\n".join(t["name"] for t in json.load(sys.stdin)))' |
    sort -u) ||
    { echo "alloc_sweep: cannot list the daemons' tensors" >&2; exit 1; }
  new=$(comm -13 <(printf '%s\n' "$held" | grep .) <(printf '%s\n' "$now" | grep .))
  held=$now
  if ! grep -qxF "$sentinel" <<<"$now"; then
    echo "alloc_sweep: $1 deleted the sentinel $sentinel" >&2
    return 1
  fi
  [ -z "$new" ] && return 0
  echo "alloc_sweep: $1 left these tensors in the daemons:" $new >&2
  return 1
}

clean_run before
check_left "the clean run before" || exit 1
n=$(allocations_in "$dir/err")
if [ -z "$n" ] || [ "$n" -lt 1 ]; then
  echo "alloc_sweep: the shim counted no allocation" >&2
  exit 1
fi
runs=250
[ "${3:-}" = held ] && runs=60
sweep_plan "$n" "${ALLOC_RUNS:-$runs}"

bad=0 tried=0 enomem=0 leaving=0
for ((k = offset + 1; k <= n; k += stride)); do
  run_shimmed "$k" "a$$.k$k"
  rc=$?
  tried=$((tried + 1))
  case $rc in
    0) ;;
    3) enomem=$((enomem + 1)) ;;
    *)
      bad=$((bad + 1))
      echo "alloc_sweep: k=$k: $(run_failure "$rc")" >&2
      client_said >&2
      ;;
  esac
  check_left "k=$k" || leaving=$((leaving + 1))
done
echo "alloc_sweep: $tried runs, $enomem failed with DIST_ENOMEM, $((tried - enomem - bad)) succeeded, $bad wrong, $leaving left tensors behind"

clean_run after
check_left "the clean run after" || leaving=$((leaving + 1))
sentinel_intact || leaving=$((leaving + 1))
[ "$bad" -eq 0 ] && [ "$leaving" -eq 0 ] || { echo "alloc_sweep: logs in $dir" >&2; exit 1; }
down
trap - EXIT
rm -rf "$dir"
exit 0
