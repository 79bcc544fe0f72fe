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

# sweep_plan N RUNS: sets stride and offset for a sweep of N allocations in
# about RUNS runs (ALLOC_STRIDE and ALLOC_OFFSET override them; the offset
# is drawn at random in 0..stride-1, so that successive sweeps cover other
# sites) and says which k it will fail.
sweep_plan() {
  local n=$1 runs=$2
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
