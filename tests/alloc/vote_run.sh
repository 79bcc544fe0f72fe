#!/usr/bin/env bash
# A vote among three daemons while one of them cannot allocate: each of
# ranks 0, 1 and 2 of a 3-daemon cluster in turn runs under failalloc.so
# (tests/alloc/failalloc.c), armed by SIGUSR2 once it serves, with its k-th
# allocation failing during one put on mesh [0,1,2], for k = 1, 2, ...
# until the put no longer reaches the k-th. A put's daemons vote (vote.h:
# an all-gather of ballots, each daemon deciding from the ballots it got),
# so after each put:
#   - the failing daemon sent its ballot to both peers or to neither (its
#     data frames to each, distd_peer_frames_sent_total): one that left
#     for one peer only lets that peer hold every ballot and store the
#     tensor while this daemon fails;
#   - every daemon holds the tensor or none does;
#   - all three still run.
# The daemons write a send when it is posted (--peer-io-uring=false),
# so a ballot queued before a later allocation failed has left by then
# (with io_uring a small frame waits for the poster's wait, which the
# failure skips, and what was queued is dropped unsent).
#
#     tests/alloc/vote_run.sh BUILD_DIR [SANITIZE]
#
# A k that fails is repeated by hand with
#   FAIL_ALLOC_AT=k FAIL_ALLOC_ARMED_BY_SIGUSR2=1 LD_PRELOAD=.../failalloc.so \
#     distctl cluster up -n 3 --dir D -- --peer-io-uring=false
#   kill -USR2 $(cat D/distd.R.pid)
# then `distctl --cluster D/cluster.conf tensor put ...` as below.
set -uo pipefail
sweep_name=daemon_vote_alloc_sweep
. "$(dirname "$0")/sweep.sh"
sweep_setup "$@"
cluster=$dir/cluster
conf=$cluster/cluster.conf
npy=$dir/x.npy
pids=()
bad=0

trap kill_cluster EXIT

# A 6x2 float32 .npy of zeros: the put's data.
write_npy() {
  local header="{'descr': '<f4', 'fortran_order': False, 'shape': (6, 2), }"
  header=$(printf '%-117s' "$header") # magic, version and length take 10: 128 in all
  { printf '\x93NUMPY\x01\x00\x76\x00%s\n' "$header"; head -c 48 /dev/zero; } >"$npy"
}

# Says what is wrong with rank $1's k=$2 ($3), keeping the logs.
wrong() {
  bad=$((bad + 1))
  echo "$sweep_name: rank $1, k=$2: $3" >&2
  mkdir -p "$dir/r$1k$2"
  cp "$cluster"/distd.*.log "$dir/err" "$dir/r$1k$2/"
}

# The data frames rank $1 sent to each peer, in peer order.
data_frames() {
  timeout 30 "$distctl" --cluster "$conf" metrics --rank "$1" |
    sed -n 's/^distd_peer_frames_sent_total{peer="[0-9]*",kind="data"} \([0-9]*\)$/\1/p' |
    tr '\n' ' '
}

# Each rank's tensor count, in rank order. A rank that did not answer
# status in time (a loaded machine) has no count: asked again, up to three
# times, so that a slow answer is not read as a split.
tensor_counts() {
  local counts try
  for try in 1 2 3; do
    counts=$(timeout 30 "$distctl" --cluster "$conf" status --json |
      sed -n 's/^ *"tensors": \([0-9]*\),$/\1/p' | tr '\n' ' ')
    [ "$(wc -w <<<"$counts")" -eq 3 ] && break
  done
  echo "$counts"
}

# The put, its output in $dir/err.
put() {
  timeout 30 "$distctl" --cluster "$conf" tensor put v "$npy" --mesh '[0,1,2]' \
    --placements 'Shard(0)' >"$dir/err" 2>&1
}

# Every k of a put's ~43 per rank, or one in 100/ALLOC_SHARE of them from
# a random offset (sweep.sh).
stride=${ALLOC_STRIDE:-$(((300 + $(share_of 300) - 1) / $(share_of 300)))}
offset=${ALLOC_OFFSET:-$((RANDOM % stride))}
write_npy
armed_cluster_up 3 0 0 --peer-io-uring=false
put || { cat "$dir/err" >&2; echo "$sweep_name: the clean put failed; logs in $dir" >&2; exit 1; }
tried=0
for rank in 0 1 2; do
  for ((k = offset + 1; k <= 300; k += stride)); do
    armed_cluster_up 3 "$rank" "$k" --peer-io-uring=false
    put
    grep -q "^failalloc: allocation $k fails" "$cluster/distd.$rank.log" || break
    tried=$((tried + 1))
    for r in 0 1 2; do
      daemon_alive "$r" || wrong "$rank" "$k" "daemon rank $r died"
    done
    read -r -a sent <<<"$(data_frames "$rank")"
    [ "${#sent[@]}" -eq 2 ] && [ "${sent[0]}" = "${sent[1]}" ] ||
      wrong "$rank" "$k" "its ballot left for one peer only (data frames sent: ${sent[*]})"
    counts=$(tensor_counts)
    case $counts in
      "0 0 0 " | "1 1 1 ") ;;
      *\ *\ *\ ) wrong "$rank" "$k" "some daemons stored the put, others did not (tensors: $counts)" ;;
      *) wrong "$rank" "$k" "a daemon did not say how many tensors it holds (tensors: $counts)" ;;
    esac
  done
  if [ "$k" -eq $((offset + 1)) ]; then
    echo "$sweep_name: rank $rank: no allocation of a put failed (the first tried, $k, was not reached)"
  else
    echo "$sweep_name: rank $rank: allocations $((offset + 1)) to $((k - stride)) of a put failed in turn (stride $stride)"
  fi
done
kill_cluster
echo "$sweep_name: $tried runs reached the failure; $bad wrong"
sweep_end "$tried" "$bad"
