#!/usr/bin/env bash
# Host transport benchmarks on loopback, as ratios against baselines measured in the same run:
#   - `metaroce write-bw` (UDP transport, defaults, -D seconds) against iperf3 (TCP, one stream,
#     default settings) and against the bare UDP ceiling at write-bw's datagram size (a GSO sender
#     and a GRO receiver: host-ibverbs/examples/udp_ceiling.rs), interleaved round by round;
#   - `metaroce write-lat` p50 and p99 against a plain UDP ping-pong of the same size
#     (host-ibverbs/examples/udp_pingpong.rs), both spinning, both reporting half the round trip;
#     and, to tell the socket features from the engine, against the same ping-pong with the
#     socket features a spinning latency test of the transport opens (--like-transport: its
#     datagram length, ECT(0), DF, the ECN cmsg, 8 MiB buffers, answers from a connected path
#     socket; without UDP GRO, arrival times and the turn over eight path sockets, which the
#     transport leaves off for a ping, see LIKE below).
# Prints one line per round and the median ratios. Needs iperf3 (Debian: iperf3). The tools'
# defaults on loopback leave the ICRC off (both ends on one host; `-- --icrc` keeps it): figures
# from before that default (2026-12-03) had it on.
#
# Usage: scripts/bench-host.sh [ROUNDS] [SECONDS] [LAT_SIZE] [LAT_ITERS] [-- extra metaroce client options]
# (the extra options go to the write-bw and write-lat clients; the server takes what the exchange
# carries, such as --no-icrc)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
SECS=${2:-3}
SIZE=${3:-2}
ITERS=${4:-20000}
shift $(( $# < 4 ? $# : 4 ))
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")
command -v iperf3 >/dev/null || { echo "iperf3 is needed (apt-get install iperf3)"; exit 2; }
cargo build -q --release -p metaroce-cli --bin metaroce && cargo build -q --release -p host-ibverbs --example udp_pingpong --example udp_ceiling
T=${CARGO_TARGET_DIR:-target}
# What a spinning latency test of the transport opens (DeviceConfig::arrival_times off, UDP GRO
# only for a phase whose messages take several packets, one path while nothing is in flight).
LIKE=(--like-transport --without gro,timestamp,paths)
M=$T/release/metaroce
P=$T/release/examples/udp_pingpong
C=$T/release/examples/udp_ceiling
# A Write packet on the wire, BTH to ICRC: BTH 12, data header 24, remote header 12, payload (-m/--mtu
# among the extra options, else the tools' default at loopback's MTU: the largest multiple of 64
# bytes beside IPv4, UDP and 64 bytes of headers, up to 16 KiB), ICRC 4 (there with --no-icrc too).
LO_MTU=$(cat /sys/class/net/lo/mtu 2>/dev/null || echo 65536)
. scripts/payload.sh
PAYLOAD=$(payload_of "$LO_MTU" ${EXTRA[@]+"${EXTRA[@]}"})
DGRAM=$((PAYLOAD + 52))
py() { python3 -c "$1"; }
bw_tcp=(); bw_mr=(); bw_udp=(); lat_udp50=(); lat_udp99=(); lat_mr50=(); lat_mr99=(); lat_like50=(); lat_like99=()
for r in $(seq 1 "$ROUNDS"); do
  iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
  sleep 0.3
  # Every result is read after its run: nothing else takes a CPU from the two ends meanwhile.
  j=$(iperf3 -c 127.0.0.1 -p 5299 -t "$SECS" -J)
  wait
  t=$(echo "$j" | py 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9)')
  out=$(mktemp)
  $C recv 127.0.0.1:18804 >"$out" &
  sleep 0.2
  $C send 127.0.0.1:18804 "$DGRAM" "$SECS"
  wait
  c=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["gbps"])' "$out")
  rm -f "$out"
  $M write-bw --once -p 18800 >/dev/null 2>&1 &
  sleep 0.3
  j=$($M write-bw 127.0.0.1 -p 18800 -D "$SECS" --json ${EXTRA[@]+"${EXTRA[@]}"} 2>/dev/null)
  wait
  m=$(echo "$j" | py 'import json,sys; print(json.loads(sys.stdin.readline())["bw_avg_gbps"])')
  $P server 18801 &
  sleep 0.2
  u=$($P client 127.0.0.1:18801 "$SIZE" "$ITERS")
  wait
  $P server 18803 "${LIKE[@]}" &
  sleep 0.2
  ul=$($P client 127.0.0.1:18803 "$SIZE" "$ITERS" "${LIKE[@]}")
  wait
  $M write-lat --once -p 18802 >/dev/null 2>&1 &
  sleep 0.3
  l=$($M write-lat 127.0.0.1 -p 18802 -s "$SIZE" -n "$ITERS" --json ${EXTRA[@]+"${EXTRA[@]}"} 2>/dev/null)
  wait
  u50=$(echo "$u" | py 'import json,sys; print(json.load(sys.stdin)["p50_us"])')
  u99=$(echo "$u" | py 'import json,sys; print(json.load(sys.stdin)["p99_us"])')
  l50=$(echo "$l" | py 'import json,sys; print(json.load(sys.stdin)["p50_us"])')
  l99=$(echo "$l" | py 'import json,sys; print(json.load(sys.stdin)["p99_us"])')
  ul50=$(echo "$ul" | py 'import json,sys; print(json.load(sys.stdin)["p50_us"])')
  ul99=$(echo "$ul" | py 'import json,sys; print(json.load(sys.stdin)["p99_us"])')
  printf 'round %d: iperf3 %.2f Gb/s, udp ceiling %.2f Gb/s, write-bw %.2f Gb/s (%.2fx, %.2fx); udp ping-pong p50 %.2f p99 %.2f us, write-lat p50 %.2f p99 %.2f us (%.2fx, %.2fx); like-transport ping-pong p50 %.2f p99 %.2f us (write-lat %.2fx, %.2fx)\n' \
    "$r" "$t" "$c" "$m" "$(py "print($m/$t)")" "$(py "print($m/$c)")" "$u50" "$u99" "$l50" "$l99" "$(py "print($l50/$u50)")" "$(py "print($l99/$u99)")" "$ul50" "$ul99" "$(py "print($l50/$ul50)")" "$(py "print($l99/$ul99)")"
  bw_tcp+=("$t"); bw_mr+=("$m"); bw_udp+=("$c"); lat_udp50+=("$u50"); lat_udp99+=("$u99"); lat_mr50+=("$l50"); lat_mr99+=("$l99"); lat_like50+=("$ul50"); lat_like99+=("$ul99")
done
join() { local IFS=,; echo "$*"; }
py "
import statistics as s
t=[$(join "${bw_tcp[@]}")]; m=[$(join "${bw_mr[@]}")]; c=[$(join "${bw_udp[@]}")]
u50=[$(join "${lat_udp50[@]}")]; u99=[$(join "${lat_udp99[@]}")]
l50=[$(join "${lat_mr50[@]}")]; l99=[$(join "${lat_mr99[@]}")]; k50=[$(join "${lat_like50[@]}")]; k99=[$(join "${lat_like99[@]}")]
print('median write-bw / iperf3: %.2fx (%.2f / %.2f Gb/s)' % (s.median([a/b for a,b in zip(m,t)]), s.median(m), s.median(t)))
print('median write-bw / udp ceiling: %.2fx (%.2f / %.2f Gb/s)' % (s.median([a/b for a,b in zip(m,c)]), s.median(m), s.median(c)))
print('median write-lat p50 / udp ping-pong p50: %.2fx (%.2f / %.2f us)' % (s.median([a/b for a,b in zip(l50,u50)]), s.median(l50), s.median(u50)))
print('median write-lat p99 / udp ping-pong p99: %.2fx (%.2f / %.2f us)' % (s.median([a/b for a,b in zip(l99,u99)]), s.median(l99), s.median(u99)))
print('median like-transport ping-pong p50 / udp ping-pong p50: %.2fx (%.2f us)' % (s.median([a/b for a,b in zip(k50,u50)]), s.median(k50)))
print('median like-transport ping-pong p99 / udp ping-pong p99: %.2fx (%.2f us)' % (s.median([a/b for a,b in zip(k99,u99)]), s.median(k99)))
print('median write-lat p50 / like-transport ping-pong p50: %.2fx' % s.median([a/b for a,b in zip(l50,k50)]))
print('median write-lat p99 / like-transport ping-pong p99: %.2fx' % s.median([a/b for a,b in zip(l99,k99)]))
"
