#!/usr/bin/env bash
# Host transport benchmark between two hosts: two network namespaces joined by a veth pair, the
# server in one, the client in the other. Round by round: iperf3 (TCP, one stream), the bare UDP
# ceiling at write-bw's datagram size (host-ibverbs/examples/udp_ceiling.rs: GSO sender, GRO
# receiver), and `metaroce write-bw` (UDP transport, -D seconds, defaults unless given); with
# LOAD=1, two busy loops run beside both ends meanwhile (any real host has other work); with
# LOAD=alt, every round runs idle and beside the two loops (taking turns at going first), and the
# summary says how much of its idle median each of iperf3 and write-bw keeps under the load (the
# issue's "loses no more than iperf3" as one interleaved series). Prints one line per run and the
# median ratios. Needs root, iproute2 and iperf3.
#
# Usage: scripts/bench-veth.sh [ROUNDS] [SECONDS] [MTU] [LOAD: 0, 1 or alt] [-- extra write-bw client options]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
SECS=${2:-3}
MTU=${3:-1500}
LOAD=${4:-0}
case "$LOAD" in 0 | 1 | alt) ;; *) echo "LOAD is 0, 1 or alt, not $LOAD"; exit 2 ;; esac
shift $(( $# < 4 ? $# : 4 ))
[ "${1:-}" = "--" ] && shift
command -v iperf3 >/dev/null || { echo "iperf3 is needed (apt-get install iperf3)"; exit 2; }
cargo build -q --release -p metaroce-cli --bin metaroce && cargo build -q --release -p host-ibverbs --example udp_ceiling
T=${CARGO_TARGET_DIR:-$(pwd)/target}
M=$T/release/metaroce
C=$T/release/examples/udp_ceiling
# write-bw's Write packets, BTH to ICRC: the payload (-m/--mtu among the extra options, else the
# tools' default: the largest multiple of 64 bytes that fits the veth beside IPv4, UDP and 64 bytes
# of headers, up to 16 KiB) plus BTH 12, data header 24, remote header 12, ICRC 4.
. scripts/payload.sh
payload=$(payload_of "$MTU" "$@")
DGRAM=$((payload + 52))
A=mrbench_a$$; B=mrbench_b$$
cleanup() {
  for p in ${loops:-}; do kill "$p" 2>/dev/null || true; done
  rm -f "${cpu:-}"
  ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true
}
trap cleanup EXIT
. scripts/veth-pair.sh
veth_pair "$A" "$B" "$MTU" 10.78.0
loops=""
start_loops() { for i in 1 2; do (while :; do :; done) & loops="$loops $!"; done; }
stop_loops() { for p in $loops; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; loops=""; }
[ "$LOAD" = 1 ] && start_loops
ina() { ip netns exec "$A" "$@"; }
inb() { ip netns exec "$B" "$@"; }
# Datagrams the kernels of both hosts dropped (UDP InErrors: receive buffers full, bad checksums): what
# write-bw's retransmissions are compared with.
drops() {
  local n=0 ns
  for ns in "$A" "$B"; do
    n=$((n + $(ip netns exec "$ns" awk '/^Udp:/ { if (h) { print $4; exit } h = 1 }' /proc/net/snmp)))
  done
  echo "$n"
}
tcp=(); udp=(); mr=(); idle_tcp=(); idle_mr=(); tper_all=(); mper_all=(); idle_tper=(); idle_mper=()
# The senders' CPU times, bash's `time` (user and system seconds of a client and its children).
TIMEFORMAT='%U %S'
cpu=$(mktemp)
# One run of the three (the label says under which load); its figures go to t, c and mb.
run() {
  local r=$1
  shift
  # Every result is read after its run: nothing else takes a CPU from the two ends meanwhile.
  inb iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
  sleep 0.3
  j=$( { time ina iperf3 -c 10.78.0.2 -p 5299 -t "$SECS" -J 2>/dev/null; } 2>"$cpu")
  wait "$!" 2>/dev/null || true
  t=$(echo "$j" | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9)')
  tcpu=$(tail -1 "$cpu")
  out=$(mktemp)
  inb "$C" recv 10.78.0.2:18805 >"$out" &
  sleep 0.2
  ina "$C" send 10.78.0.2:18805 "$DGRAM" "$SECS"
  wait "$!" 2>/dev/null || true
  c=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["gbps"])' "$out")
  rm -f "$out"
  inb "$M" write-bw --once -p 18806 >/dev/null 2>&1 &
  sleep 0.3
  d0=$(drops)
  j=$( { time ina "$M" write-bw 10.78.0.2 -p 18806 -D "$SECS" --json "$@" 2>/dev/null; } 2>"$cpu" | head -1)
  wait "$!" 2>/dev/null || true
  mcpu=$(tail -1 "$cpu")
  dropped=$(( $(drops) - d0 ))
  m=$(echo "$j" | python3 -c 'import json,sys; j=json.loads(sys.stdin.readline()); print(j["bw_avg_gbps"], j["retransmits"], "%d/%d/%d" % (j["lost_by_sack"], j["lost_by_timeout"], j["peer_silent_waits"]), j["path_failures"], j["verified"])')
  read -r mb retx why fails ok <<<"$m"
  # Gb/s per second of the sending end's CPU (user and system time of the client, its start
  # and end included: about 0.05 s of write-bw's).
  tper=$(python3 -c "print($t * $SECS / max(sum(map(float, '$tcpu'.split())), 1e-3))")
  mper=$(python3 -c "print($mb * $SECS / max(sum(map(float, '$mcpu'.split())), 1e-3))")
  printf '%s: iperf3 %.2f Gb/s, udp ceiling %.2f Gb/s (%d-byte datagrams), write-bw %.2f Gb/s (%.2fx, %.2fx) retransmits %s (lost by sack/timeout, peer waits: %s) path failures %s verified %s; datagrams the kernels dropped %d; Gb/s per second of the sender'"'"'s CPU: iperf3 %.1f, write-bw %.1f\n' \
    "$r" "$t" "$c" "$DGRAM" "$mb" "$(python3 -c "print($mb/$t)")" "$(python3 -c "print($mb/$c)")" "$retx" "$why" "$fails" "$ok" "$dropped" "$tper" "$mper"
}
busy_run() {
  start_loops
  sleep 1  # the loops take their share before the busy runs start
  run "round $1 busy" "${@:2}"
  stop_loops
  busy_t=$t; busy_c=$c; busy_mb=$mb; busy_tper=$tper; busy_mper=$mper
}
for r in $(seq 1 "$ROUNDS"); do
  if [ "$LOAD" = alt ]; then
    # Idle first in odd rounds, busy first in even ones: neither always follows the other.
    [ $((r % 2)) = 0 ] && busy_run "$r" "$@"
    run "round $r idle" "$@"
    idle_tcp+=("$t"); idle_mr+=("$mb"); idle_tper+=("$tper"); idle_mper+=("$mper")
    [ $((r % 2)) = 1 ] && busy_run "$r" "$@"
    t=$busy_t; c=$busy_c; mb=$busy_mb; tper=$busy_tper; mper=$busy_mper
  else
    run "round $r" "$@"
  fi
  tcp+=("$t"); udp+=("$c"); mr+=("$mb"); tper_all+=("$tper"); mper_all+=("$mper")
done
join() { local IFS=,; echo "$*"; }
python3 -c "
import statistics as s
t=[$(join "${tcp[@]}")]; c=[$(join "${udp[@]}")]; m=[$(join "${mr[@]}")]
busy = ' (the busy runs)' if '$LOAD' == 'alt' else ''
tp=[$(join "${tper_all[@]}")]; mp=[$(join "${mper_all[@]}")]
print('MTU $MTU, load $LOAD%s: median write-bw / iperf3 %.2fx (%.2f / %.2f Gb/s), write-bw / udp ceiling %.2fx (%.2f Gb/s); Gb/s per second of the sender\'s CPU: iperf3 %.1f, write-bw %.1f' % (busy, s.median([a/b for a,b in zip(m,t)]), s.median(m), s.median(t), s.median([a/b for a,b in zip(m,c)]), s.median(c), s.median(tp), s.median(mp)))
if busy:
    it=[$(join ${idle_tcp[@]+"${idle_tcp[@]}"})]; im=[$(join ${idle_mr[@]+"${idle_mr[@]}"})]
    itp=[$(join ${idle_tper[@]+"${idle_tper[@]}"})]; imp=[$(join ${idle_mper[@]+"${idle_mper[@]}"})]
    print('idle medians: iperf3 %.2f, write-bw %.2f Gb/s; under the load iperf3 keeps %.2f of its idle median, write-bw %.2f' % (s.median(it), s.median(im), s.median(t)/s.median(it), s.median(m)/s.median(im)))
    print('Gb/s per second of the sender\'s CPU, idle medians: iperf3 %.1f, write-bw %.1f (beside the loops: above)' % (s.median(itp), s.median(imp)))
"
