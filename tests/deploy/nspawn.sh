#!/bin/bash
# Boots systemd in a container over this host's /usr (systemd-nspawn
# --volatile=yes, as deploy.md describes) with the built distd@.service and
# distd bind-mounted in, starts distd@0 and distd@1 from one
# /etc/distd/distd.conf and cluster file, and checks that both reach
# active/running and see each other (distctl status from the host: the
# container shares the host's network).
#
# Usage: nspawn.sh SOURCE_ROOT BUILD_ROOT
# Needs root and systemd-nspawn (Debian's systemd-container, installed here
# with apt-get when missing). When this machine cannot run the check it
# prints "SKIP nspawn: <reason>" and exits 77 (meson's skip); it never passes
# silently. Every wait is bounded.
set -u
src=${1:-${DIST_SOURCE_ROOT:?}}
build=${2:-${DIST_BUILD_ROOT:?}}
BOOT_TIMEOUT=60   # seconds for systemd to come up in the container
UNIT_TIMEOUT=60   # seconds for both instances to be active/running
CONNECT_TIMEOUT=30

skip() { echo "SKIP nspawn: $*"; exit 77; }
fail() {
  echo "FAIL nspawn: $*"
  show_state
  exit 1
}

[ "$(id -u)" = 0 ] || skip "not running as root (systemd-nspawn needs root)"
if ! command -v systemd-nspawn >/dev/null 2>&1; then
  echo "NOTE systemd-nspawn missing: apt-get install -y systemd-container"
  timeout 300 apt-get install -y systemd-container >/tmp/nspawn-apt.$$.log 2>&1 ||
    skip "systemd-nspawn is missing and installing systemd-container failed" \
         "($(tail -n 1 /tmp/nspawn-apt.$$.log))"
  rm -f /tmp/nspawn-apt.$$.log
  command -v systemd-nspawn >/dev/null 2>&1 || skip "systemd-nspawn not found after install"
fi
command -v nsenter >/dev/null 2>&1 || skip "nsenter (util-linux) not found"

distd=$build/daemon/distd
distctl=$build/client/distctl/distctl
unit=$build/deploy/distd@.service
for f in "$distd" "$distctl" "$unit"; do
  [ -e "$f" ] || fail "$f was not built"
done

tmp=$(mktemp -d /tmp/distd-nspawn.XXXXXX)
machine=distd-check-$$
nspawn_pid=
init_pid=

in_container() { timeout 20 nsenter -t "$init_pid" -a "$@"; }

show_state() {
  [ -n "$init_pid" ] || { [ -f "$tmp/boot.log" ] && tail -n 20 "$tmp/boot.log"; return; }
  for r in 0 1; do
    in_container systemctl status --no-pager "distd@$r.service" 2>&1 | sed 's/^/    /'
    in_container journalctl --no-pager -n 20 -u "distd@$r.service" 2>&1 | sed 's/^/    /'
  done
}

cleanup() {
  if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
    kill -TERM "$nspawn_pid" 2>/dev/null # nspawn powers the container off
    for _ in $(seq 1 100); do
      kill -0 "$nspawn_pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -KILL "$nspawn_pid" 2>/dev/null
    wait "$nspawn_pid" 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# A gRPC port G whose G+2 (the derived HTTP port) is free too, and a peer port.
free_ports() {
  /usr/bin/python3 - <<'EOF'
import socket
def free():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def usable(p):
    try:
        s = socket.socket(); s.bind(("127.0.0.1", p)); s.close(); return True
    except OSError:
        return False
out = []
while len(out) < 4:
    g = free()
    if g < 65530 and usable(g + 2) and g not in out and g + 2 not in out:
        out += [g, free()]
print(*out)
EOF
}
read -r g0 p0 g1 p1 < <(free_ports)

# The container's /etc: the unit (ExecStart pointed at the bind-mounted
# build), a target pulling in both instances, and /etc/distd.
mkdir -p "$tmp/units" "$tmp/etc-distd"
sed 's|^ExecStart=[^ ]*|ExecStart=/opt/distd/distd|' "$unit" >"$tmp/units/distd@.service"
cat >"$tmp/units/distd-check.target" <<EOF
[Unit]
Description=distd nspawn check: ranks 0 and 1
Requires=basic.target
After=basic.target
Wants=distd@0.service distd@1.service
AllowIsolate=yes
EOF
cat >"$tmp/etc-distd/cluster.conf" <<EOF
# rank 0, rank 1: gRPC address, data-plane address
127.0.0.1:$g0 127.0.0.1:$p0
127.0.0.1:$g1 127.0.0.1:$p1
EOF
cat >"$tmp/etc-distd/distd.conf" <<EOF
cluster_file = /etc/distd/cluster.conf
cluster_id = nspawn-check
peer_timeout = 10s
EOF
chmod 0755 "$tmp" "$tmp/units" "$tmp/etc-distd"
chmod 0644 "$tmp"/units/* "$tmp"/etc-distd/*

# Booting into distd-check.target (not the default target) keeps the
# host's other enabled services from starting on the shared network.
systemd-nspawn -D / --volatile=yes --register=no --keep-unit --console=pipe \
  --machine="$machine" \
  --bind-ro="$distd:/opt/distd/distd" \
  --bind-ro="$tmp/units/distd@.service:/etc/systemd/system/distd@.service" \
  --bind-ro="$tmp/units/distd-check.target:/etc/systemd/system/distd-check.target" \
  --bind-ro="$tmp/etc-distd:/etc/distd" \
  -b -- --unit=distd-check.target >"$tmp/boot.log" 2>&1 </dev/null &
nspawn_pid=$!

# systemd is PID 1 of the container: nspawn's child.
deadline=$((SECONDS + BOOT_TIMEOUT))
while [ $SECONDS -lt $deadline ]; do
  kill -0 "$nspawn_pid" 2>/dev/null ||
    skip "systemd-nspawn cannot boot a container here: $(grep -v '^$' "$tmp/boot.log" | tail -n 1)"
  init_pid=$(pgrep -P "$nspawn_pid" | head -n 1)
  if [ -n "$init_pid" ]; then
    state=$(in_container systemctl is-system-running 2>/dev/null)
    case "$state" in starting | running | degraded) break ;; esac
  fi
  sleep 0.5
done
[ $SECONDS -lt $deadline ] ||
  skip "systemd did not come up in the container within ${BOOT_TIMEOUT}s: $(tail -n 1 "$tmp/boot.log")"
echo "NOTE systemd booted in container $machine (init pid $init_pid)"

# Both instances active/running (Type=notify: only after READY=1).
deadline=$((SECONDS + UNIT_TIMEOUT))
while :; do
  states=
  for r in 0 1; do
    s=$(in_container systemctl show -p ActiveState -p SubState --value "distd@$r.service" |
        paste -sd/)
    states="$states distd@$r=$s"
  done
  case "$states" in
    " distd@0=active/running distd@1=active/running") break ;;
    *failed*) fail "an instance failed:$states" ;;
  esac
  [ $SECONDS -lt $deadline ] || fail "not active/running within ${UNIT_TIMEOUT}s:$states"
  sleep 0.5
done
echo "PASS nspawn: distd@0 and distd@1 active/running under systemd"

# Connected: distctl from the host over loopback sees both ranks healthy.
deadline=$((SECONDS + CONNECT_TIMEOUT))
while :; do
  out=$("$distctl" --cluster "$tmp/etc-distd/cluster.conf" --timeout 3000 status 2>&1)
  [ "$(grep -c ' healthy ' <<<"$out")" = 2 ] && break
  [ $SECONDS -lt $deadline ] || fail "ranks not connected within ${CONNECT_TIMEOUT}s:
$out"
  sleep 0.5
done
sed 's/^/    /' <<<"$out"
echo "PASS nspawn: both ranks connected to each other (distctl status)"
exit 0
