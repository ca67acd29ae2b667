#!/usr/bin/env bash
# Loss tolerance between two hosts: two network namespaces joined by a veth pair, nftables
# dropping a share of RoCEv2 datagrams (UDP 4791/4792) at random on input in both namespaces.
# With the tools' defaults (UDP GSO and GRO on) the kernel moves a path's consecutive datagrams as
# one buffer, so each drop removes a run of them; --no-gso --no-gro gives independent losses.
# Round by round, for each test and each share (lossless first, interleaved), prints the rate, the
# ratio to the lossless run of the same round, the datagrams nftables dropped (its byte counter
# divided by the datagram size) and the retransmissions per datagram dropped. Every byte is
# verified by the tools (a run that fails verification fails the script). Needs root, nftables.
#
# Usage: scripts/bench-loss.sh [ROUNDS] [SECONDS] [TESTS] [PER_MILLE...] [-- extra client options]
#   TESTS: comma-separated, default write-bw,send-bw,read-bw; PER_MILLE default 10 50 100.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECS=${2:-3}
TESTS=${3:-write-bw,send-bw,read-bw}
shift $(( $# < 3 ? $# : 3 ))
shares=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do shares+=("$1"); shift; done
[ ${#shares[@]} -eq 0 ] && shares=(10 50 100)
[ "${1:-}" = "--" ] && shift
cargo build -q --release -p metaroce-cli --bin metaroce
T=${CARGO_TARGET_DIR:-$(pwd)/target}
M=$T/release/metaroce
# Datagram size of a full data packet at the veth's MTU of 1500: the tools' default payload there
# (the largest multiple of 64 bytes beside IPv4, UDP and 64 bytes of headers: 1408; -m among the
# extra options sets it) + BTH 12 + data header 24 + remote header 12 + ICRC 4, plus UDP 8 and IPv4
# 20 as nftables counts at the input hook.
. scripts/payload.sh
PAYLOAD=$(payload_of 1500 "$@")
DGRAM=$((PAYLOAD + 52 + 28))
A=mrloss_a$$; B=mrloss_b$$
cleanup() {
  ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true
  [ "${ok:-0}" = 1 ] || { [ -s "${log:-}" ] && { echo "the tools said:"; tail -20 "$log"; }; }
  rm -f "${summary:-}" "${srv:-}" "${log:-}"
}
trap cleanup EXIT
. scripts/veth-pair.sh
veth_pair "$A" "$B" 1500 10.81.0
set_loss() {
  for ns in "$A" "$B"; do
    ip netns exec "$ns" nft delete table inet mrloss 2>/dev/null || true
    [ "$1" = 0 ] && continue
    printf 'table inet mrloss {\n chain in {\n type filter hook input priority 0;\n udp dport { 4791, 4792 } numgen random mod 1000 < %s counter drop\n }\n}\n' "$1" |
      ip netns exec "$ns" nft -f -
  done
}
dropped() {
  local bytes=0 b
  for ns in "$A" "$B"; do
    b=$(ip netns exec "$ns" nft list table inet mrloss 2>/dev/null | grep -o 'bytes [0-9]*' | awk '{s+=$2} END {print s+0}')
    bytes=$((bytes + ${b:-0}))
  done
  echo $((bytes / DGRAM))
}
summary=$(mktemp); srv=$(mktemp); log=$(mktemp)
port=18990
for r in $(seq 1 "$ROUNDS"); do
  for t in ${TESTS//,/ }; do
    base=""
    for pm in 0 "${shares[@]}"; do
      set_loss "$pm"
      port=$((port + 1))
      ip netns exec "$B" "$M" "$t" --once -p "$port" --json >"$srv" 2>>"$log" & s=$!
      sleep 0.3
      out=$(ip netns exec "$A" "$M" "$t" 10.81.0.2 -p "$port" -D "$SECS" --json "$@" 2>>"$log" | head -1)
      wait "$s"
      d=$(dropped)
      line=$(python3 - "$out" "$d" "${base:-0}" "$srv" <<'PY'
import json, sys
j = json.loads(sys.argv[1]); d = int(sys.argv[2]); base = float(sys.argv[3])
assert j["verified"], "bytes not verified: %s" % j
# Retransmissions by both ends: the server's are the Read responses it sent again.
server = [json.loads(l) for l in open(sys.argv[4]) if l.strip()]
srx = sum(q["counters"]["retransmits"] for s in server for q in s.get("stats", {}).get("qps", []))
bw = j["bw_avg_gbps"]; rx = j["retransmits"] + srx
ratio = bw / base if base > 0 else 1.0
per = rx / d if d else 0.0
print("%.3f %.3f %d %d %.2f %d" % (bw, ratio, d, rx, per, j.get("path_failures", 0)))
PY
)
      read -r bw ratio d rx per pf <<<"$line"
      [ "$pm" = 0 ] && base=$bw
      printf 'round %s %-8s %5.1f%% loss: %6.2f Gb/s  %.3fx lossless  dropped %6d  retransmits %6d  (%.2f per drop)  path failures %s\n' \
        "$r" "$t" "$(echo "$pm/10" | bc -l)" "$bw" "$ratio" "$d" "$rx" "$per" "$pf"
      echo "$t $pm $ratio $per" >>"$summary"
    done
  done
done
ok=1
echo "median over $ROUNDS rounds (ratio to lossless, retransmissions per datagram dropped):"
python3 - "$summary" <<'PY'
import statistics, sys, collections
rows = collections.defaultdict(list)
for l in open(sys.argv[1]):
    t, pm, ratio, per = l.split()
    rows[(t, int(pm))].append((float(ratio), float(per)))
for (t, pm), v in sorted(rows.items()):
    if pm == 0:
        continue
    print("  %-8s %5.1f%%  %.3fx  %.2f" % (t, pm / 10, statistics.median(x for x, _ in v), statistics.median(y for _, y in v)))
PY
