#!/usr/bin/env bash
# What AF_XDP would buy the UDP transport between two hosts, measured without the transport: two
# network namespaces joined by a veth pair (MTU 1500), round by round, in an order that alternates:
#   - latency: the plain UDP ping-pong (host-ibverbs/examples/udp_pingpong.rs), the same ping-pong
#     through the transport's AF_XDP datapath alone, no connection (host-ibverbs/examples/xdp_probe.rs:
#     copy mode, the arrivals read from the RX ring without a system call), and `metaroce write-lat` (the UDP
#     transport) through its UDP sockets and with `--xdp` on both ends, 2-byte messages; the p50
#     of each run (half the round trip);
#   - bulk: the bare UDP ceiling (host-ibverbs/examples/udp_ceiling.rs: GSO sender, GRO receiver)
#     and AF_XDP frames of the same UDP payload, with the CPU seconds of each end (/usr/bin/time),
#     and `metaroce write-bw -D SECONDS` without and with `--xdp`.
# Prints one line per run and the medians. Needs root, iproute2 and XDP in the veth driver.
#
# Usage: scripts/bench-xdp.sh [ROUNDS] [PINGS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
PINGS=${2:-20000}
SECS=${3:-3}
cargo build -q --release -p metaroce-cli --bin metaroce
cargo build -q --release -p host-ibverbs --example udp_pingpong --example udp_ceiling --example xdp_probe
T=${CARGO_TARGET_DIR:-$(pwd)/target}
M=$T/release/metaroce
P=$T/release/examples/udp_pingpong
C=$T/release/examples/udp_ceiling
X=$T/release/examples/xdp_probe
A=mrxdp_a$$; B=mrxdp_b$$
cleanup() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; }
trap cleanup EXIT
. scripts/veth-pair.sh
veth_pair "$A" "$B" 1500 10.78.1
ina() { ip netns exec "$A" "$@"; }
inb() { ip netns exec "$B" "$@"; }
p50() { python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["p50_us"])'; }
# UDP payload of the bulk runs: what a 1500-byte MTU leaves beside IPv4 and UDP headers.
PAYLOAD=1472
lat_udp() {
  inb "$P" server 18811 &
  sleep 0.3
  ina "$P" client 10.78.1.2:18811 2 "$PINGS" | p50
  wait "$!"
}
lat_xdp() {
  inb "$X" server 10.78.1.2:18812 &
  sleep 0.5
  ina timeout 60 "$X" client 10.78.1.1:18813 10.78.1.2:18812 2 "$PINGS" | p50
  wait "$!"
}
lat_mr() { # [--xdp]
  inb "$M" write-lat --once -p 18814 "$@" >/dev/null 2>&1 &
  sleep 0.5
  ina "$M" write-lat 10.78.1.2 -p 18814 -s 2 -n "$PINGS" --json "$@" 2>/dev/null | p50
  wait "$!" || true
}
bw_mr() { # [--xdp]
  inb "$M" write-bw --once -p 18815 "$@" >/dev/null 2>&1 &
  sleep 0.5
  ina "$M" write-bw 10.78.1.2 -p 18815 -D "$SECS" --json "$@" 2>/dev/null |
    python3 -c 'import json,sys; j=json.loads(sys.stdin.readline()); assert j["verified"]; print("%.2f" % j["bw_avg_gbps"])'
  wait "$!" || true
}
# Bulk: prints "Gb/s sender-CPU receiver-CPU" (CPU seconds, user plus system).
cpu() { python3 -c 'import sys; u, s = open(sys.argv[1]).read().split()[-2:]; print("%.2f" % (float(u) + float(s)))' "$1"; }
bulk_udp() {
  local o r s
  o=$(mktemp); r=$(mktemp); s=$(mktemp)
  inb /usr/bin/time -f "%U %S" -o "$r" "$C" recv 10.78.1.2:18805 >"$o" &
  sleep 0.3
  ina /usr/bin/time -f "%U %S" -o "$s" "$C" send 10.78.1.2:18805 "$((PAYLOAD))" "$SECS" >/dev/null
  wait "$!"
  echo "$(python3 -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))["gbps"])' "$o") $(cpu "$s") $(cpu "$r")"
  rm -f "$o" "$r" "$s"
}
bulk_xdp() {
  local o r s
  o=$(mktemp); r=$(mktemp); s=$(mktemp)
  inb /usr/bin/time -f "%U %S" -o "$r" "$X" recv 10.78.1.2:18806 "$SECS" >"$o" &
  sleep 0.5
  ina /usr/bin/time -f "%U %S" -o "$s" "$X" send 10.78.1.1:18807 10.78.1.2:18806 "$PAYLOAD" "$SECS"
  wait "$!"
  echo "$(python3 -c 'import json,sys; print("%.2f" % json.load(open(sys.argv[1]))["gbps"])' "$o") $(cpu "$s") $(cpu "$r")"
  rm -f "$o" "$r" "$s"
}
lu=(); lx=(); lm=(); lmx=(); bu=(); bx=(); bm=(); bmx=()
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="udp xdp mr mrx"; else order="mrx mr xdp udp"; fi
  for v in $order; do
    case $v in
      udp) u=$(lat_udp); bu_r=$(bulk_udp) ;;
      xdp) x=$(lat_xdp); bx_r=$(bulk_xdp) ;;
      mr) m=$(lat_mr); bm_r=$(bw_mr) ;;
      mrx) mx=$(lat_mr --xdp); bmx_r=$(bw_mr --xdp) ;;
    esac
  done
  echo "round $r: p50 udp ping-pong $u us, AF_XDP ping-pong $x us, write-lat $m us, write-lat --xdp $mx us; bulk (Gb/s, sender and receiver CPU s) udp ceiling $bu_r, AF_XDP $bx_r; write-bw $bm_r Gb/s, write-bw --xdp $bmx_r Gb/s"
  lu+=("$u"); lx+=("$x"); lm+=("$m"); lmx+=("$mx"); bu+=("${bu_r%% *}"); bx+=("${bx_r%% *}"); bm+=("$bm_r"); bmx+=("$bmx_r")
done
join() { local IFS=,; echo "$*"; }
python3 -c "
import statistics as s
u=[$(join "${lu[@]}")]; x=[$(join "${lx[@]}")]; m=[$(join "${lm[@]}")]; mx=[$(join "${lmx[@]}")]
bu=[$(join "${bu[@]}")]; bx=[$(join "${bx[@]}")]; bm=[$(join "${bm[@]}")]; bmx=[$(join "${bmx[@]}")]
r = lambda a, b: s.median([y / x for x, y in zip(a, b)])
print('medians (ratios: medians of the rounds\' ratios to the udp ping-pong or the udp ceiling):')
print('  p50: udp ping-pong %.3f us, AF_XDP ping-pong %.3f us (%.2fx), write-lat %.3f us (%.2fx), write-lat --xdp %.3f us (%.2fx)' % (s.median(u), s.median(x), r(u, x), s.median(m), r(u, m), s.median(mx), r(u, mx)))
print('  bulk: udp ceiling %.2f Gb/s, AF_XDP %.2f Gb/s (%.2fx), write-bw %.2f Gb/s (%.2fx), write-bw --xdp %.2f Gb/s (%.2fx)' % (s.median(bu), s.median(bx), r(bu, bx), s.median(bm), r(bu, bm), s.median(bmx), r(bu, bmx)))
"
