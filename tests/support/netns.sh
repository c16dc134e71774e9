# SPDX-License-Identifier: MIT
# tests/support/netns.sh: two "hosts" for tests, network namespaces A and B
# joined by a veth pair, each with IPv4 and IPv6 (ULA fd00::/8) addresses.
# Source it from a bash test script:
#
#     . tests/support/netns.sh
#     netns_setup || exit 77      # 77: not root, no ip tool, or refused
#     trap netns_cleanup EXIT
#     on_a CMD ARGS...            # CMD inside host A (on_b: host B)
#
# netns_setup sets NS_A, NS_B (names unique to this run, so tests run in
# parallel), ADDR_A, ADDR_B (10.R.S.1/.2), ADDR6_A, ADDR6_B (fd00:R:S::1/2)
# and FAR_B, an address on host B that host A has no route to (for
# "unreachable" tests). Only addresses inside namespaces made here are used.
# Ports are free for the taking: each namespace has its own.

netns_setup() {
  NS_A="" NS_B=""
  if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null; then
    echo "skipped: network namespaces need root and the ip tool (iproute2)"
    return 1
  fi
  local r=$(( ($$ >> 8) % 200 + 20 )) s=$(( $$ % 250 + 1 )) v="zh$$"
  NS_A="zdhostA-$$-$RANDOM" NS_B="zdhostB-$$-$RANDOM"
  ADDR_A="10.$r.$s.1" ADDR_B="10.$r.$s.2" FAR_B="10.$r.$((s ^ 1)).9"
  ADDR6_A="fd00:$r:$s::1" ADDR6_B="fd00:$r:$s::2"
  if ! { ip netns add "$NS_A" && ip netns add "$NS_B" &&
         ip link add "${v}a" type veth peer name "${v}b" &&
         ip link set "${v}a" netns "$NS_A" && ip link set "${v}b" netns "$NS_B" &&
         ip -n "$NS_A" addr add "$ADDR_A/24" dev "${v}a" &&
         ip -n "$NS_B" addr add "$ADDR_B/24" dev "${v}b" &&
         ip -n "$NS_A" -6 addr add "$ADDR6_A/64" dev "${v}a" nodad &&
         ip -n "$NS_B" -6 addr add "$ADDR6_B/64" dev "${v}b" nodad &&
         ip -n "$NS_B" addr add "$FAR_B/32" dev lo &&
         ip -n "$NS_A" link set "${v}a" up && ip -n "$NS_B" link set "${v}b" up &&
         ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up; } 2> /dev/null; then
    echo "skipped: cannot create network namespaces here"
    netns_cleanup
    return 1
  fi
  # The veth link comes up asynchronously (ZeroMQ retries its connects, so
  # this only keeps the first attempts from failing): wait, bounded.
  local i
  for i in $(seq 200); do
    ip -n "$NS_A" -o link show "${v}a" | grep -q LOWER_UP &&
      ip -n "$NS_B" -o link show "${v}b" | grep -q LOWER_UP && return 0
    sleep 0.05
  done
  echo "the link between $NS_A and $NS_B did not come up"
  netns_cleanup
  return 2
}

# netns_hosts A|B LINE...: /etc/hosts as that host sees it (ip netns exec
# mounts /etc/netns/NS/hosts over /etc/hosts), e.g. to give a host name
# different addresses on different hosts.
netns_hosts() {
  local ns
  ns=$([ "$1" = A ] && echo "$NS_A" || echo "$NS_B")
  shift
  mkdir -p "/etc/netns/$ns" && printf '%s\n' "$@" > "/etc/netns/$ns/hosts"
}

netns_cleanup() {
  [ -n "$NS_A" ] && rm -rf "/etc/netns/$NS_A" && rmdir /etc/netns 2> /dev/null
  [ -n "$NS_B" ] && rm -rf "/etc/netns/$NS_B" && rmdir /etc/netns 2> /dev/null
  [ -n "$NS_A" ] && ip netns del "$NS_A" 2> /dev/null
  [ -n "$NS_B" ] && ip netns del "$NS_B" 2> /dev/null
  NS_A="" NS_B=""
  return 0
}

on_a() { ip netns exec "$NS_A" "$@"; }
on_b() { ip netns exec "$NS_B" "$@"; }
