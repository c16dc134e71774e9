#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test_hosts: the example programs' documented command lines across two
# hosts (network namespaces A and B, tests/support/netns.sh): rank 0 on A
# started as the README says, without --master_addr; the others on B with
# --master_addr=<A>. Also IPv6, --listen_addr, a master host name that
# means loopback on rank 0's host, and worlds that cannot form, which must
# say who could not reach what within the init timeout. Every world off
# loopback needs the world key (tools/keygen) or --insecure: the cases run
# with a key, and a few without one (refused) and with --insecure.
#
#   tests/test_hosts.sh BUILD_DIR        (ctest: test_hosts; 77 = skipped)
#
# Each case is one line at the bottom: `ok` or `fails`, the program, where
# each rank runs (one letter per rank: "ABB" is rank 0 on A, ranks 1-2 on
# B), the flags of rank 0, of the other ranks on A, of the ranks on B, then
# the flags every rank gets.
set -u
build=${1:-${ZDIST_BUILD_DIR:-..}}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/support/netns.sh"
netns_setup || exit 77
T=$(mktemp -d /tmp/zdist-hosts-XXXXXX)
trap 'netns_cleanup; rm -rf "$T"' EXIT
WAIT=${HOSTS_WAIT_S:-240}      # bound on one world; a passing one takes seconds
PORT=29500                     # each namespace has its own ports
export OPENBLAS_NUM_THREADS=1 ZDIST_NUM_THREADS=1 ZDIST_LOG_LEVEL=info
# No default key from the machine's user: each case says which key it has.
export XDG_CONFIG_HOME=$T/config HOME=$T
"$build/tools/keygen" "$T/world.key" > /dev/null || { echo "FAIL keygen"; exit 1; }
"$build/tools/keygen" "$T/other.key" > /dev/null || { echo "FAIL keygen"; exit 1; }
export ZDIST_KEY_FILE=$T/world.key
failed=0

# run NAME PROG HOSTS F0 FA FB COMMON...: starts the world, waits for every
# process (bounded), leaves rank r's output in $T/NAME/rR.log and its exit
# status in $T/NAME/rR.rc, and the seconds it took in $T/NAME/seconds.
run() {
  local name=$1 prog=$2 hosts=$3 f0=$4 fa=$5 fb=$6 n=${#3} r pids=() flags where
  shift 6
  mkdir -p "$T/$name"
  local t0=$SECONDS
  for ((r = 0; r < n; r++)); do
    where=${hosts:r:1}
    if [ "$r" = 0 ]; then flags=$f0; elif [ "$where" = A ]; then flags=$fa; else flags=$fb; fi
    # shellcheck disable=SC2086
    ip netns exec "$([ "$where" = A ] && echo "$NS_A" || echo "$NS_B")" \
      timeout -k 5 "$WAIT" "$build/examples/$prog" --world_size="$n" --rank="$r" \
      --master_port=$PORT $flags "$@" > "$T/$name/r$r.log" 2>&1 &
    pids+=($!)
  done
  for ((r = 0; r < n; r++)); do
    wait "${pids[r]}"
    echo $? > "$T/$name/r$r.rc"
  done
  echo $((SECONDS - t0)) > "$T/$name/seconds"
}

show() {
  local f
  for f in "$T/$1"/r*.log; do echo "---- $f (exit $(cat "${f%.log}.rc"))"; tail -25 "$f"; done
}

# ok NAME PROG HOSTS F0 FA FB COMMON...: every process exits 0.
ok() {
  local name=$1 r
  run "$@"
  for r in "$T/$name"/r*.rc; do
    if [ "$(cat "$r")" != 0 ]; then
      echo "FAIL $name: a process exited $(cat "$r")"
      show "$name"
      failed=1
      return
    fi
  done
  echo "ok   $name ($(cat "$T/$name/seconds") s)"
}

# fails NAME RE0 REB WITHIN PROG HOSTS F0 FA FB COMMON...: every process
# exits non-zero within WITHIN seconds; rank 0's output matches the
# extended regex RE0, and each other rank's REB (when not empty).
fails() {
  local name=$1 re0=$2 reb=$3 within=$4 r bad=""
  shift 4
  run "$name" "$@"
  for r in "$T/$name"/r*.rc; do
    [ "$(cat "$r")" = 0 ] && bad="$bad ${r##*/} exited 0;"
  done
  grep -Eq -- "$re0" "$T/$name/r0.log" || bad="$bad rank 0 did not say /$re0/;"
  for r in "$T/$name"/r*.log; do
    [ -n "$reb" ] && [ "${r##*/}" != r0.log ] && ! grep -Eq -- "$reb" "$r" &&
      bad="$bad ${r##*/} did not say /$reb/;"
  done
  # Failing cleanly: no sanitizer report on the way (sanitizer builds).
  grep -lE "ERROR: (Address|Leak)Sanitizer|runtime error:" "$T/$name"/r*.log > /dev/null &&
    bad="$bad a sanitizer report;"
  [ "$(cat "$T/$name/seconds")" -gt "$within" ] &&
    bad="$bad took $(cat "$T/$name/seconds") s, more than $within;"
  if [ -n "$bad" ]; then
    echo "FAIL $name:$bad"
    show "$name"
    failed=1
    return
  fi
  echo "ok   $name (failed as expected in $(cat "$T/$name/seconds") s)"
}

ps="--max_batches=5 --eval_samples=100 --log_interval=5"
a=$(printf '%s' "$ADDR_A" | sed 's/\./\\./g')
far=$(printf '%s' "$FAR_B" | sed 's/\./\\./g')
netns_hosts A "127.0.0.1 localhost" "127.0.1.1 zdmaster"
netns_hosts B "127.0.0.1 localhost" "$ADDR_A zdmaster"

# The README's recipe, and the other programs' same flags.
ok rpc_ps rpc_ps ABB "" "" "--master_addr=$ADDR_A" $ps
grep -Eq "rank 0 listens at tcp://$a:[0-9]+ " "$T/rpc_ps/r0.log" ||
  { echo "FAIL rpc_ps: rank 0 did not listen at $ADDR_A only"; show rpc_ps; failed=1; }
ok ps_sync_async ps_sync_async ABBB "" "" "--master_addr=$ADDR_A" \
   --mode=sync --num_workers=2 --iterations=3 --test_size=64
ok pipeline pipeline ABB "" "" "--master_addr=$ADDR_A" --iterations=3 --test_size=64
# A trainer on rank 0's host too: it reaches rank 0 at its routable address.
ok rpc_ps_mixed rpc_ps AAB "" "--master_addr=$ADDR_A" "--master_addr=$ADDR_A" $ps
# Rank 0 given its own address, IPv6, a chosen interface.
ok rpc_ps_master rpc_ps AB "--master_addr=$ADDR_A" "" "--master_addr=$ADDR_A" $ps
ok rpc_ps_ipv6 rpc_ps ABB "" "" "--master_addr=$ADDR6_A" $ps
ok rpc_ps_ipv6_master rpc_ps AB "--master_addr=$ADDR6_A" "" "--master_addr=$ADDR6_A" $ps
ok listen_addr rpc_ps AB "--listen_addr=$ADDR_A" "" "--master_addr=$ADDR_A --listen_addr=$ADDR_B" $ps
ok listen_addr_ipv6 rpc_ps AB "--listen_addr=$ADDR6_A" "" \
   "--master_addr=$ADDR_A --listen_addr=$ADDR6_B" $ps
# A host name that /etc/hosts maps to 127.0.1.1 on rank 0's host (Debian).
ok hostname rpc_ps AB "--master_addr=zdmaster" "" "--master_addr=zdmaster" $ps

# Without the key: refused at once on every host, naming the remedies;
# with --insecure everywhere it runs; a trainer with another key cannot
# join (and the world fails at its init timeout).
nokey() { ZDIST_KEY_FILE= "$@"; }
nokey fails no_key "refusing to run unauthenticated.*tools/keygen.*--insecure" \
      "refusing to run unauthenticated" 30 rpc_ps ABB "" "" "--master_addr=$ADDR_A" $ps
nokey ok insecure rpc_ps ABB "--insecure" "" "--master_addr=$ADDR_A --insecure" $ps
fails other_key "timed out with 1 of 2 workers registered" "the same world key file" 30 \
      rpc_ps AB "" "" "--master_addr=$ADDR_A --key_file=$T/other.key" --init_timeout_s=5 $ps

# Worlds that cannot form, each saying why within the init timeout (5 s).
fails loopback_trainer "advertises tcp://127\.0\.0\.1:[0-9]+, which \"trainer_2\" \(rank 2\)" \
      "advertises tcp://127\.0\.0\.1:[0-9]+" 30 rpc_ps AAB "" "" "--master_addr=$ADDR_A" \
      --init_timeout_s=5 $ps
fails no_master "missing ranks 1" "could not reach the master at tcp://10\.[0-9.]+\.77:$PORT" 30 \
      rpc_ps AB "" "" "--master_addr=${ADDR_A%.1}.77" --init_timeout_s=5 $ps
fails far_trainer "\"trainer_1\" \(rank 1\) at tcp://$far:[0-9]+ is unreachable" "" 30 \
      rpc_ps AB "" "" "--master_addr=$ADDR_A --listen_addr=$FAR_B" --init_timeout_s=5 $ps
fails loopback_server "rank 0 .* listens at tcp://127\.0\.0\.1:[0-9]+ \(its listen address\), which \"trainer_1\"" \
      "listens at tcp://127\.0\.0\.1" 30 rpc_ps AB "--listen_addr=127.0.0.1" "" \
      "--master_addr=$ADDR_A" --init_timeout_s=5 $ps

exit $failed
