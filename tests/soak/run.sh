#!/usr/bin/env bash
# The soak test in one command:
#
#     tests/soak/run.sh [--seconds N] [--build-dir DIR] [soak options...]
#
# Builds distd, distctl and the soak driver if needed (DIR, default
# build-soak at the top of the tree), starts a 3-daemon cluster with
# `distctl cluster up` (peer timeout 5 s), runs tests/soak/soak.c for N
# seconds (default 300) with one daemon restarted half-way, stops the
# cluster. Exit status 0 when the soak passed (see soak.c for the verdict);
# on failure the cluster directory (logs) is kept and named.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$root/build-soak
seconds=300
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    *) extra+=("$1"); shift ;;
  esac
done
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$root" >"$build.setup.log" 2>&1 ||
    { cat "$build.setup.log" >&2; exit 1; }
fi
ninja -C "$build" daemon/distd client/distctl/distctl tests/soak/soak >/dev/null ||
  { echo "soak: build failed in $build" >&2; exit 1; }
distctl=$build/client/distctl/distctl
dir=$(mktemp -d /tmp/distd-soak-XXXXXX)
down() { "$distctl" cluster down --dir "$dir" >/dev/null 2>&1; }
trap down EXIT
"$distctl" cluster up -n 3 --dir "$dir" -- --cluster-id "soak-$$" \
  --peer-timeout 5s --connect-backoff-max 500ms ||
  { echo "soak: cluster up failed; logs in $dir" >&2; exit 1; }
"$build/tests/soak/soak" --cluster-dir "$dir" --seconds "$seconds" "${extra[@]}"
rc=$?
down
trap - EXIT
if [ $rc -eq 0 ]; then rm -rf "$dir"; else echo "soak: logs kept in $dir" >&2; fi
exit $rc
