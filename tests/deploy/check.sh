#!/bin/bash
# Checks the deployment files offline (issue 7, "Checks on this machine"):
# the systemd unit with systemd-analyze, the Kubernetes manifests with
# yamllint, kubectl kustomize and kubernetes-models schemas.
# Usage: check.sh SOURCE_ROOT BUILD_ROOT
# Each check prints PASS, FAIL or SKIP with a reason; the exit status is
# non-zero when any check fails. A required tool that is missing is a FAIL
# (CI installs it); only kubectl, which Debian 12 does not package in a
# usable version, is optional.
set -u
src=${1:-${DIST_SOURCE_ROOT:?}}
build=${2:-${DIST_BUILD_ROOT:?}}
k8s=$src/deploy/kubernetes
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

pass() { echo "PASS $*"; }
skip() { echo "SKIP $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
# Indents a tool's output under the verdict line.
show() { sed 's/^/    /' "$1"; }
need() { # need TOOL PACKAGE CHECK: fails CHECK when TOOL is missing
  command -v "$1" >/dev/null 2>&1 && return 0
  fail "$3: $1 not found (install Debian package '$2')"
  return 1
}

# The generated unit, in a scratch directory under its template name.
# systemd-analyze verify insists that the ExecStart binary exists; when the
# install path does not (distd is not installed on this machine), point it
# at the build tree's distd, or at /bin/true when distd is not built, and say
# so.
prepare_unit() {
  local unit=$build/deploy/distd@.service
  if [ ! -f "$unit" ]; then
    fail "systemd unit: $unit was not generated (deploy/meson.build)"
    return 1
  fi
  cp "$unit" "$tmp/distd@.service"
  local exe
  exe=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$unit")
  if [ ! -x "$exe" ]; then
    local stand_in=/bin/true
    [ -x "${DIST_DISTD_BIN:-}" ] && stand_in=$DIST_DISTD_BIN
    echo "NOTE $exe is not installed; verifying with ExecStart=$stand_in"
    sed -i "s|^ExecStart=$exe|ExecStart=$stand_in|" "$tmp/distd@.service"
  fi
}

check_unit_verify() {
  need systemd-analyze systemd "systemd-analyze verify" || return
  # It exits 0 on unknown keys and bad values, printing them: any output
  # at all is a failure.
  (cd "$tmp" && systemd-analyze verify ./distd@.service) >"$tmp/out" 2>&1
  local rc=$?
  if [ $rc -eq 0 ] && [ ! -s "$tmp/out" ]; then
    pass "systemd-analyze verify distd@.service: no output"
  else
    fail "systemd-analyze verify distd@.service (exit $rc):"
    show "$tmp/out"
  fi
}

check_unit_security() {
  need systemd-analyze systemd "systemd-analyze security" || return
  cp "$tmp/distd@.service" "$tmp/distd@0.service"
  (cd "$tmp" && systemd-analyze security --offline=yes --threshold=20 \
     ./distd@0.service) >"$tmp/out" 2>&1
  local rc=$?
  local level
  level=$(grep -o 'Overall exposure level.*' "$tmp/out")
  if [ $rc -eq 0 ]; then
    pass "systemd-analyze security --threshold=20: ${level:-no summary}"
  else
    fail "systemd-analyze security --threshold=20 (exit $rc): ${level:-}"
    grep -E '^✗' "$tmp/out" | sed 's/^/    /'
  fi
}

check_yamllint() {
  need yamllint yamllint yamllint || return
  if yamllint -s -f parsable "$k8s" >"$tmp/out" 2>&1; then
    pass "yamllint -s deploy/kubernetes"
  else
    fail "yamllint -s deploy/kubernetes:"
    show "$tmp/out"
  fi
}

# Renders every kustomization into $tmp/rendered-*.yaml for the schema check.
check_kustomize() {
  if ! command -v kubectl >/dev/null 2>&1; then
    skip "kubectl kustomize: no kubectl on this machine"
    return
  fi
  local dir name
  for dir in "$k8s/base" "$k8s"/overlays/*/; do
    dir=${dir%/}
    name=${dir#"$k8s"/}
    # Warnings (deprecated fields) go to stderr: treat them as failures too.
    if kubectl kustomize "$dir" >"$tmp/rendered-${name//\//-}.yaml" \
         2>"$tmp/err" && [ ! -s "$tmp/err" ]; then
      pass "kubectl kustomize $name"
    else
      fail "kubectl kustomize $name:"
      show "$tmp/err"
    fi
  done
}

# kubernetes-models is installed once per build directory (network needed
# the first time: the npm registry). Sets models to its node_modules.
install_models() {
  local dir=$build/tests/deploy/node
  models=$dir/node_modules
  if [ ! -d "$dir/node_modules/kubernetes-models" ] ||
     [ ! -d "$dir/node_modules/js-yaml" ]; then
    mkdir -p "$dir"
    if ! (cd "$dir" && npm install --no-audit --no-fund --no-save \
            kubernetes-models@4 js-yaml@4) >"$tmp/npm" 2>&1; then
      fail "schema validation: npm install kubernetes-models@4 js-yaml failed:"
      tail -n 20 "$tmp/npm" | sed 's/^/    /'
      return 1
    fi
  fi
}

check_schemas() {
  need node nodejs "schema validation" || return
  need npm npm "schema validation" || return
  local models
  install_models || return
  # The base's own files always; the rendered overlays when kubectl ran.
  local files=()
  local f
  for f in "$k8s"/base/*.yaml "$tmp"/rendered-*.yaml; do
    [ -f "$f" ] || continue
    [ "$(basename "$f")" = kustomization.yaml ] && continue
    files+=("$f")
  done
  if NODE_PATH=$models node "$src/tests/deploy/validate.js" "${files[@]}" \
       >"$tmp/out" 2>&1; then
    pass "kubernetes-models schema validation ($(grep -c '^PASS' "$tmp/out") objects)"
    sed "s|$tmp/||; s|^|    |" "$tmp/out"
  else
    fail "kubernetes-models schema validation:"
    sed "s|$tmp/||; s|^|    |" "$tmp/out"
  fi
}

if prepare_unit; then
  check_unit_verify
  check_unit_security
fi
check_yamllint
check_kustomize
check_schemas
echo "deploy checks: $failures failed"
[ $failures -eq 0 ]
