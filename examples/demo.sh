#!/usr/bin/env bash
# The main demo: installs what is missing, builds, starts a local cluster of
# two daemons, shows its status, shards a tensor and reshards it, runs the
# example trainers with `distctl launch`, and stops the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
.ci/install-deps
echo "== building into build/ (the first time takes a few minutes)"
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build | sed -n '/Linking/p'  # pipefail: a failed build stops the demo
distctl=build/client/distctl/distctl
dir=$(mktemp -d /tmp/distd-demo-XXXXXX)
trap '$distctl cluster down --dir "$dir/cluster" >/dev/null 2>&1; rm -rf "$dir"' EXIT

echo "== distctl cluster up -n 2"
$distctl cluster up -n 2 --dir "$dir/cluster"
export DIST_CLUSTER=$dir/cluster/cluster.conf

echo; echo "== distctl status"
$distctl status
echo; echo "== distctl peers"
$distctl peers

echo; echo "== a 6x4 tensor: Shard(0) over the mesh [0,1], resharded to Shard(1), read back"
/usr/bin/python3 -c "import numpy as np; np.save('$dir/x.npy', np.arange(24, dtype=np.float32).reshape(6, 4))"
$distctl tensor put x "$dir/x.npy" --mesh '[0,1]' --placements 'Shard(0)'
$distctl tensor show x
$distctl tensor reshard x --placements 'Shard(1)'
$distctl tensor show x
$distctl tensor get x -o "$dir/back.npy"
/usr/bin/python3 -c "import numpy as np; a=np.load('$dir/x.npy'); b=np.load('$dir/back.npy'); print('round trip equal:', bool((a==b).all()))"

# Each example starts a local cluster of its own for the run (no --cluster).
for ex in masked_loss global_scatter shard_mlp moe_layer; do
  echo; echo "== distctl launch -n 2 -- build/examples/$ex"
  env -u DIST_CLUSTER $distctl launch -n 2 --log-dir "$dir/log-$ex" -- "build/examples/$ex"
done
