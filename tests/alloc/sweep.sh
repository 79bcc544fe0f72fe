# What the allocation sweeps share (sourced, not run): run.sh fails a
# client's allocations in turn, daemon_run.sh a daemon's. The sourcing
# script names itself in sweep_name, then calls sweep_setup.

# sweep_setup BUILD_DIR SANITIZE: exits 77 (skipped) under a sanitizer, as
# the shim fronts the plain allocator; sets the programs' paths and $dir,
# a fresh directory for logs.
sweep_setup() {
  local build=$1 sanitize=${2:-none}
  if [ "$sanitize" != none ]; then
    echo "$sweep_name: skipped under -Db_sanitize=$sanitize (the shim fronts the plain allocator)"
    exit 77
  fi
  client=$build/tests/alloc/alloc_client
  shim=$build/tests/alloc/failalloc.so
  distctl=$build/client/distctl/distctl
  client_mode=()
  # Debian's Python (.ci/install-deps installs it), by path: a python3
  # found first on PATH may be a version manager's shim, which cost 0.33 s
  # a call here against 0.025 s, once or twice per run of a sweep.
  python=/usr/bin/python3
  run_timeout=20 # a run takes 0.2-0.5 s: a few hangs stay inside meson's timeout
  dir=$(mktemp -d "${TMPDIR:-/tmp}/distd-alloc-XXXXXX")
}

# run_client CLUSTER_FILE PREFIX [NAME=VALUE...]: one run of alloc_client
# (in the mode the array client_mode names, if any),
# with the environment given set for it alone (timeout's own mallocs stay
# whole); its exit status (124: timed out), its stderr in $dir/err.
run_client() {
  local conf=$1 prefix=$2
  shift 2
  rm -rf "$dir/ckpt"
  timeout -s KILL "$run_timeout" env "$@" "$client" "$conf" "$prefix" "$dir/ckpt" \
    "${client_mode[@]}" 2>"$dir/err"
  local rc=$?
  [ "$rc" -eq 137 ] && rc=124 # killed by timeout
  return "$rc"
}

# ALLOC_SHARE=P runs each sweep at P percent of its runs (default 100):
# .ci/run sets 50 to keep CI's time down, the random offsets moving the
# sites tried from run to run.
share_of() { # share_of RUNS: RUNS scaled by ALLOC_SHARE, at least 1
  local scaled=$(($1 * ${ALLOC_SHARE:-100} / 100))
  echo $((scaled < 1 ? 1 : scaled))
}

# sweep_plan N RUNS: sets stride and offset for a sweep of N allocations in
# about RUNS runs (scaled by ALLOC_SHARE; ALLOC_STRIDE and ALLOC_OFFSET
# override them; the offset is drawn at random in 0..stride-1, so that
# successive sweeps cover other sites) and says which k it will fail.
sweep_plan() {
  local n=$1 runs
  runs=$(share_of "$2")
  stride=${ALLOC_STRIDE:-$(((n + runs - 1) / runs))}
  offset=${ALLOC_OFFSET:-$((RANDOM % stride))}
  echo "$sweep_name: $n allocations; failing k = $((offset + 1)), $((offset + 1 + stride)), ... (stride $stride)"
}

# Why a run with exit status $1 failed, in words.
run_failure() {
  local rc=$1
  if [ "$rc" -eq 124 ]; then echo "hung (killed after ${run_timeout}s)"
  elif [ "$rc" -gt 128 ]; then echo "killed by signal $((rc - 128))"
  else echo "exit $rc"
  fi
}

# The client's last lines of stderr, without the shim's.
client_said() { grep -v '^failalloc:' "$dir/err" | tail -5; }

# The allocations the shim counted, from its line in file $1 (empty if none).
allocations_in() { sed -n 's/^failalloc: \([0-9]*\) allocations$/\1/p' "$1" | tail -1; }

# The daemon sweeps' cluster, in the directory $cluster the sourcing
# script names; it keeps its daemons' pids, by rank, in the array pids.

# armed_cluster_up WORLD RANK K [DISTD_ARG...]: a fresh cluster of WORLD
# daemons whose daemons all load the shim with FAIL_ALLOC_AT=K, unarmed:
# only rank RANK, armed here, counts and fails. distctl's own allocations
# stay whole too (the shim is never armed in it). Exits 1 when it cannot
# start the cluster.
armed_cluster_up() {
  local world=$1 rank=$2 k=$3 r
  shift 3
  kill_cluster
  rm -rf "$cluster"
  timeout 60 env LD_PRELOAD="$shim" FAIL_ALLOC_ARMED_BY_SIGUSR2=1 FAIL_ALLOC_AT="$k" \
    FAIL_ALLOC_COUNT=1 "$distctl" cluster up -n "$world" --dir "$cluster" -- \
    --cluster-id "$sweep_name-$$" "$@" >"$dir/up.log" 2>&1 ||
    { cat "$dir/up.log" >&2; echo "$sweep_name: cluster up failed; logs in $dir" >&2; exit 1; }
  for ((r = 0; r < world; r++)); do pids[r]=$(cat "$cluster/distd.$r.pid"); done
  kill -USR2 "${pids[$rank]}"
}

# Stops the daemons of the current cluster, by the pids cluster up
# recorded, each only while it is still a distd (daemon_alive).
kill_cluster() {
  local r
  for r in "${!pids[@]}"; do
    daemon_alive "$r" && kill -KILL "${pids[$r]}" 2>/dev/null
  done
  pids=()
}

# 0 when daemon rank $1 still runs (its pid not reused by another program).
daemon_alive() {
  local pid=${pids[$1]}
  kill -0 "$pid" 2>/dev/null && grep -q distd "/proc/$pid/cmdline" 2>/dev/null
}

# sweep_end REACHED BAD: the verdict of a sweep that counts the runs that
# reached their failure. One that reached none (the shim not armed, its
# log line changed) tested nothing, and fails too; with nothing wrong its
# logs go, and it exits 0.
sweep_end() {
  local reached=$1 wrong=$2
  [ "$reached" -gt 0 ] || { wrong=$((wrong + 1)); echo "$sweep_name: no run reached its failure" >&2; }
  [ "$wrong" -eq 0 ] || { echo "$sweep_name: logs in $dir" >&2; exit 1; }
  trap - EXIT
  rm -rf "$dir"
  exit 0
}
