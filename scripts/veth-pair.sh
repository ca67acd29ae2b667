# Sourced by the benchmark scripts: two network namespaces joined by a veth pair.
#
# veth_pair NS_A NS_B MTU NET: creates NS_A and NS_B, a veth `va` in NS_A and `vb` in NS_B (MTU
# bytes), addresses NET.1/24 on va and NET.2/24 on vb, and brings both and each namespace's
# loopback up. The caller removes the namespaces (`ip netns del`) when it is done.
veth_pair() {
  local a=$1 b=$2 mtu=$3 net=$4 ns
  ip netns add "$a"; ip netns add "$b"
  ip link add va netns "$a" mtu "$mtu" type veth peer name vb netns "$b" mtu "$mtu"
  ip -n "$a" addr add "$net.1/24" dev va; ip -n "$b" addr add "$net.2/24" dev vb
  for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
  ip -n "$a" link set va up; ip -n "$b" link set vb up
}
