#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test_hosts_rejoin: rpc_ps processes that die and come back, across two
# hosts (network namespaces A and B, tests/support/netns.sh) with a world
# key (issue 12: rejoin "must work across hosts and with the key"). The
# server (rank 0) runs on A as the README starts it, the trainers on B
# with --master_addr=<A>. The fault is pinned with ZDIST_FAULT (the
# library's fault points), the victim is started again on its host with its
# own command line once its first process has exited, and every process
# of the world must then exit 0:
#   - trainer: rank 2 killed before its 25th batch, started again (no
#     --resume): it rejoins, goes on from the position the server kept
#     (its last forward's, batch 23), and the server counts it again;
#   - server: rank 0 killed in its third checkpoint and started again with
#     --resume: the trainers on B wait for it (--server_wait_s, which rpc_ps
#     hands to the RPC layer as ZDIST_MASTER_WAIT_S), register with it
#     again, take their RRefs anew and finish from the last checkpoint;
#   - shard: two server shards, rank 0 and trainer 2 on A, shard 1 and
#     trainer 3 on B; shard 1 killed mid-training and started again on B
#     with --resume: every shard goes back to one checkpoint generation and
#     both trainers finish.
#
#   tests/test_hosts_rejoin.sh BUILD_DIR     (ctest: test_hosts_rejoin; 77 = skipped)
set -u
build=${1:-${ZDIST_BUILD_DIR:-..}}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/support/netns.sh"
netns_setup || exit 77
T=$(mktemp -d /tmp/zdist-hosts-rejoin-XXXXXX)
trap 'netns_cleanup; rm -rf "$T"' EXIT
WAIT=${HOSTS_WAIT_S:-300}      # bound on one process; a passing world takes seconds
PORT=29500                     # each namespace has its own ports
export OPENBLAS_NUM_THREADS=1 ZDIST_NUM_THREADS=1 ZDIST_LOG_LEVEL=info
export XDG_CONFIG_HOME=$T/config HOME=$T
"$build/tools/keygen" "$T/world.key" > /dev/null || { echo "FAIL keygen"; exit 1; }
export ZDIST_KEY_FILE=$T/world.key
unset ZDIST_FAULT ZDIST_MASTER_WAIT_S
failed=0
N=3                            # ranks of the case's world
ON_A=" 0 "                     # the ranks on host A; the others are on B
pids=()

# start CASE R LOG EXTRA...: starts rank R of the case's world on its host
# (those of $ON_A on A, the others on B) with the world's flags, EXTRA and
# $common; its output goes to $T/CASE/LOG. Its pid is left in pids[R].
start() {
  local name=$1 r=$2 log=$3 ns=$NS_B master="--master_addr=$ADDR_A"
  shift 3
  [[ "$ON_A" == *" $r "* ]] && ns=$NS_A
  [ "$r" = 0 ] && master=""
  # shellcheck disable=SC2086
  ip netns exec "$ns" timeout -k 5 "$WAIT" "$build/examples/rpc_ps" --world_size=$N \
    --rank="$r" --master_port=$PORT $master "--checkpoint=$T/$name/ck" $common "$@" \
    > "$T/$name/$log" 2>&1 &
  pids[r]=$!
}

# The processes of a case, each given its exit status and output.
bad=""
expect() {   # expect CASE LOG REGEX: the log says it
  grep -Eq -- "$3" "$T/$1/$2" || bad="$bad $2 did not say /$3/;"
}
report() {   # report CASE: ok, or FAIL with every log's tail
  local name=$1 f
  grep -lE "ERROR: (Address|Leak)Sanitizer|runtime error:" "$T/$name"/*.log > /dev/null &&
    bad="$bad a sanitizer report;"
  if [ -n "$bad" ]; then
    echo "FAIL $name:$bad"
    for f in "$T/$name"/*.log; do echo "---- $f"; tail -40 "$f"; done
    failed=1
  else
    echo "ok   $name ($((SECONDS - t0)) s)"
  fi
  bad=""
}

# rejoin CASE VICTIM FAULT RESTART_EXTRA: the world with ZDIST_FAULT=FAULT
# given to rank VICTIM; once that process has died of it (SIGKILL), the
# victim again with its flags and RESTART_EXTRA; then every process of the
# world must exit 0.
rejoin() {
  local name=$1 victim=$2 fault=$3 again=$4 r rc
  mkdir -p "$T/$name"
  t0=$SECONDS
  for ((r = 0; r < N; r++)); do
    if [ "$r" = "$victim" ]; then
      ZDIST_FAULT=$fault start "$name" "$r" "r$r.first.log"
    else
      start "$name" "$r" "r$r.log"
    fi
  done
  # (bash's "Killed" notice of the victim is not the test's output)
  { wait "${pids[victim]}"; } 2> /dev/null
  rc=$?
  [ "$rc" = 137 ] || bad="$bad rank $victim's first process exited $rc, not 137 (SIGKILL);"
  expect "$name" "r$victim.first.log" "ZDIST_FAULT: rank $victim: kill at"
  # shellcheck disable=SC2086
  start "$name" "$victim" "r$victim.log" $again
  for ((r = 0; r < N; r++)); do
    wait "${pids[r]}"
    rc=$?
    [ "$rc" = 0 ] || bad="$bad rank $r exited $rc;"
  done
}

common="--max_batches=60 --checkpoint_every=10 --eval_samples=1000 --progress_s=0"
a=$(printf '%s' "$ADDR_A" | sed 's/\./\\./g')

# A trainer on B killed before its 25th batch and started again.
rejoin trainer 2 "2:forward:kill:25" ""
expect trainer r0.log "rpc: \"trainer_2\" \(rank 2\) rejoined from "
expect trainer r0.log "\(rank 2\), lost at batch"
expect trainer r0.log "rejoined; counted again"
expect trainer r0.log "2 of 2 trainers finished"
expect trainer r2.log "Rank 2 rejoined the world; resuming at batch 23 \(23 batches done\)"
expect trainer r2.log "rpc: CURVE on every connection, world key "
expect trainer r1.log "rpc: \"trainer_2\" \(rank 2\) is back, at tcp://"
for r in 1 2; do expect trainer r$r.log "Rank $r test accuracy "; done
report trainer

# The server on A killed in its third checkpoint (before writing it) and
# started again with --resume.
rejoin server 0 "0:checkpoint:kill:3" "--resume"
expect server r0.log "rpc: CURVE on every connection, world key "
expect server r0.log "rpc: rank 0 \(\"parameter_server\"\) restarted and joined the running world"
expect server r0.log "parameter server shard 0: resumed from "
# (the members' registrations queued before it listened are answered once)
grep -q "was not restarted" "$T/server/r0.log" && bad="$bad r0.log turned a member away;"
expect server r0.log "2 of 2 trainers finished"
for r in 1 2; do
  expect server r$r.log "rpc: rank 0 \(\"parameter_server\"\) is lost: waiting up to "
  expect server r$r.log "rpc: \"parameter_server\" \(rank 0\) is back, at tcp://$a:"
  expect server r$r.log "Rank $r: the servers are back after [0-9.]+ s; going on from batch "
  expect server r$r.log "Rank $r test accuracy "
done
report server

# Two shards: shard 1 on B killed about its 50th forward (each trainer's
# 25th batch, between the checkpoints at batches 20 and 30) and started
# again on B with --resume.
N=4 ON_A=" 0 2 "
common="$common --num_servers=2"
rejoin shard 1 "1:forward:kill:50" "--resume"
expect shard r1.first.log "rpc: CURVE on every connection, world key "
expect shard r1.log "rpc: CURVE on every connection, world key "
expect shard r1.log "parameter server shard 1: resumed from "
expect shard r0.log "rpc: \"parameter_server_1\" \(rank 1\) rejoined from "
expect shard r0.log "ps: stage 0 went back from version [0-9]+ to [0-9]+ \(generation [1-9]"
expect shard r0.log "2 of 2 trainers finished"
for r in 2 3; do
  expect shard r$r.log "Rank $r: server shard 1 lost at batch "
  expect shard r$r.log "rpc: \"parameter_server_1\" \(rank 1\) is back, at tcp://"
  expect shard r$r.log "Rank $r: the servers are back after [0-9.]+ s; going on from batch "
  expect shard r$r.log "Rank $r test accuracy "
done
report shard

exit $failed
