#!/usr/bin/env bash
# The daemon's allocation sweep: one rank (rank 1 of 2 by default;
# ALLOC_RANK and ALLOC_WORLD=3 below) of a fresh cluster runs under
# failalloc.so (tests/alloc/failalloc.c), armed by SIGUSR2 once it serves,
# and alloc_client's workload (puts, reshard, exchanges, global_scatter, a
# MoE layer, LocalLayer calls, shard_layer with an optimizer step, a tape,
# a checkpoint save and restore) runs against it, once counting the
# daemon's allocations, then once per k with the k-th failing.
#
#     tests/alloc/daemon_run.sh BUILD_DIR [SANITIZE]
#
# Each k gets a fresh cluster (started in 0.3 s, and nothing of an earlier
# k's can hide there). After the run that reaches the failure:
#   - both daemons still run (no crash, no abort);
#   - the client exited 0, 3 (DIST_ENOMEM) or 4 (another error), with a
#     message that does not call a request malformed: a daemon that cannot
#     allocate says so;
#   - every name a daemon holds is held by every rank of its mesh (each
#     daemon asked alone): the failure left no op applied by some daemons
#     only, and at one version (a put replacing a value keeps the rest);
#   - a clean run on the same cluster succeeds: the failure left nothing
#     half-done that breaks the next caller.
# First, the request unpack alone: `distctl tensors` against a daemon
# failing one of its first allocations says "out of memory for the
# request".
# A run that ends before the k-th allocation (the count varies a little:
# the daemon's threads allocate for pings too) is counted as not reached.
# A k that fails the sweep is repeated by hand with
#   FAIL_ALLOC_AT=k FAIL_ALLOC_ARMED_BY_SIGUSR2=1 LD_PRELOAD=.../failalloc.so \
#     distctl cluster up -n 2 --dir D;  kill -USR2 $(cat D/distd.1.pid)
# then alloc_client D/cluster.conf PREFIX CKPT_DIR; the daemon's log,
# D/distd.1.log, says "failalloc: allocation k fails" where it failed.
#
# ALLOC_RUNS (80 by default: a k takes about 1 s, so ~80 s),
# ALLOC_STRIDE and ALLOC_OFFSET as in run.sh; ALLOC_STRIDE=1 tries every k.
# ALLOC_WORLD=3 runs a 3-daemon cluster, and alloc_client's mode "three"
# (its workload, then puts and reshards on mesh [0,1,2]); ALLOC_RANK is
# the rank that fails (by default 1 of two daemons, any of three at
# random), and stands for rank 1 above.
set -uo pipefail
sweep_name=daemon_alloc_sweep
. "$(dirname "$0")/sweep.sh"
sweep_setup "$@"
world=${ALLOC_WORLD:-2}
[ "$world" -eq 2 ] || client_mode=(three)
alloc_rank=${ALLOC_RANK:-$([ "$world" -eq 2 ] && echo 1 || echo $((RANDOM % world)))}
echo "$sweep_name: failing rank $alloc_rank of $world daemons"
cluster=$dir/cluster
conf=$cluster/cluster.conf
pids=()
bad=0

trap kill_cluster EXIT

# A fresh cluster whose rank $alloc_rank fails allocation $1 (armed_cluster_up).
cluster_up() {
  rm -rf "$dir/ckpt"
  armed_cluster_up "$world" "$alloc_rank" "$1"
}

# The names some daemon holds but another rank of their mesh does not, or
# holds with another dtype, shape, placements or version (a change applied
# on some ranks only: a put replacing a value keeps all but the version),
# one a line ("NAME (mesh [0,1]) on rank 0, not on rank 1"), each daemon
# listed alone (--endpoint: its gRPC address, from the cluster file).
held_partly() {
  local r lists=()
  for r in "${!pids[@]}"; do
    local at
    at=$(grep -v '^[[:space:]]*#' "$conf" | awk 'NF { print $1 }' | sed -n "$((r + 1))p")
    timeout 60 "$distctl" --endpoint "$at" --json tensors >"$dir/held.$r" 2>"$dir/held.$r.err" ||
      { echo "rank $r could not list its tensors: $(tail -1 "$dir/held.$r.err")"; return; }
    lists+=("$dir/held.$r")
  done
  # Python, which CI installs (jq it does not): a failure of the check
  # itself is said, never read as "nothing held partly"
  "$python" - "${lists[@]}" <<'PY' || echo "the check of names held partly failed"
import json, sys
held = [json.load(open(f)) for f in sys.argv[1:]]
partly = set()
for r, tensors in enumerate(held):
    for t in tensors:
        ranks = t["mesh"]["ranks"]
        for q in ranks:
            if q >= len(held):
                continue
            same = [u for u in held[q] if u["name"] == t["name"] and u["mesh"]["ranks"] == ranks]
            if not same:
                partly.add("%s (mesh %s) on rank %d, not on rank %d" % (t["name"], ranks, r, q))
            elif "version" not in t:  # without it the comparison below is blind to versions
                partly.add("%s: rank %d's listing has no version" % (t["name"], r))
            elif same[0] != t:  # a change applied on some ranks: dtype, shape, placements, version
                partly.add("%s (mesh %s) differs between ranks %d and %d" % (t["name"], ranks, r, q))
print("\n".join(sorted(partly)), end="")
PY
}

# Says what is wrong with k=$1 ($2), keeping the logs in $dir/k$1.
wrong() {
  bad=$((bad + 1))
  echo "$sweep_name: k=$1: $2" >&2
  mkdir -p "$dir/k$1"
  cp "$cluster"/distd.*.log "$dir/err" "$dir/k$1/"
}

# A request the daemon cannot unpack for want of memory: one of its first
# allocations once armed (the call's context, then the unpack's blocks;
# the loop thread's may come between, so four are tried). It must say
# so, not call the request malformed.
unpack_said=0
for k in 1 2 3 4; do
  cluster_up "$k"
  timeout 60 "$distctl" --cluster "$conf" tensors >"$dir/err" 2>&1
  grep -q 'TensorList: out of memory for the request' "$dir/err" && unpack_said=1
  if grep -q malformed "$dir/err"; then
    wrong "$k" "a request the daemon could not allocate for was called malformed"
    cat "$dir/err" >&2
  fi
done
[ "$unpack_said" -eq 1 ] ||
  { bad=$((bad + 1)); echo "$sweep_name: no k of 1..4 failed a request's unpack" >&2; }

# The counting run: a clean workload against an armed daemon, whose count
# is printed when it stops (cluster down, SIGTERM).
cluster_up 0
run_client "$conf" "d$$.count"
rc=$?
[ "$rc" -eq 0 ] ||
  { client_said >&2; echo "$sweep_name: the clean run failed ($(run_failure "$rc")); logs in $dir" >&2; exit 1; }
timeout 60 "$distctl" cluster down --dir "$cluster" >/dev/null 2>&1
pids=()
n=$(allocations_in "$cluster/distd.$alloc_rank.log")
if [ -z "$n" ] || [ "$n" -lt 1 ]; then
  echo "$sweep_name: the shim counted no allocation of rank $alloc_rank" >&2
  exit 1
fi
sweep_plan "$n" "${ALLOC_RUNS:-80}"

tried=0 unreached=0 enomem=0 other=0
for ((k = offset + 1; k <= n; k += stride)); do
  cluster_up "$k"
  run_client "$conf" "d$$.k$k"
  rc=$?
  if ! grep -q "^failalloc: allocation $k fails" "$cluster/distd.$alloc_rank.log"; then
    unreached=$((unreached + 1))
    continue
  fi
  tried=$((tried + 1))
  case $rc in
    0) ;;
    3) enomem=$((enomem + 1)) ;;
    4) other=$((other + 1)) ;;
    *) wrong "$k" "the client's run: $(run_failure "$rc")"; client_said >&2 ;;
  esac
  if grep -q 'malformed' "$dir/err"; then
    wrong "$k" "a request the daemon could not allocate for was called malformed"
    client_said >&2
  fi
  for ((r = 0; r < world; r++)); do
    daemon_alive "$r" && continue
    wrong "$k" "daemon rank $r died"
    tail -5 "$cluster/distd.$r.log" >&2
  done
  daemon_alive "$alloc_rank" || continue
  partly=$(held_partly)
  [ -z "$partly" ] || { wrong "$k" "held by some ranks of the mesh only:"; echo "$partly" >&2; }
  run_client "$conf" "d$$.k$k.after"
  rc=$?
  [ "$rc" -eq 0 ] && continue
  wrong "$k" "the clean run after it: $(run_failure "$rc")"
  client_said >&2
done
kill_cluster
echo "$sweep_name: $tried runs reached the failure ($enomem failed with DIST_ENOMEM," \
  "$other with another error, $((tried - enomem - other)) succeeded), $unreached ended" \
  "before it; $bad wrong"
sweep_end "$tried" "$bad"
