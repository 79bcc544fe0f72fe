#!/usr/bin/env bash
# Compares the vendored reference with the shared original, when present.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
orig=$here/../../../shared/anchors/collectives/global_scatter_ref.py
[ -f "$orig" ] || { echo "no shared original at $orig: nothing to compare"; exit 0; }
cmp "$orig" "$here/global_scatter_ref.py" && echo "global_scatter_ref.py matches the shared original"
