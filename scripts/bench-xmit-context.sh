#!/usr/bin/env bash
# In whose time the data packets leave: iperf3 (TCP, one stream) and `metaroce write-bw` between
# two network namespaces joined by a veth pair, idle and beside two busy loops, round by round.
# Every transmission on the client's veth (`net:net_dev_xmit` on it, recorded for 1.5 s in the
# middle of each run with `perf record -a`) is charged to the task it ran in: the sending process,
# the receiving process (a TCP sender's queued data also leaves from the ACKs the receiver's
# system calls deliver), the kernel's softirq threads, or whatever else ran. With each end's CPU
# seconds (`/usr/bin/time`) and the rate, a line says what a second of both ends' CPU moved.
# The tracing itself costs: idle rates are below those of scripts/bench-veth.sh (busy ones not
# always). /usr/bin/time does not see the softirq threads' CPU. Needs root, iproute2, iperf3,
# perf and python3.
#
# Usage: scripts/bench-xmit-context.sh [ROUNDS] [SECONDS] [MTU]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECS=${2:-3}
MTU=${3:-1500}
for tool in iperf3 perf /usr/bin/time python3 pgrep ip timeout; do
  command -v "$tool" >/dev/null || { echo "$tool is needed"; exit 2; }
done
cargo build -q --release -p metaroce-cli --bin metaroce
M=${CARGO_TARGET_DIR:-$(pwd)/target}/release/metaroce
A=mrxc_a$$; B=mrxc_b$$
# The client's veth gets a name of its own: the tracepoint names devices, not namespaces.
DEV=xc$$
loops=""; st=""; ct=""
D=$(mktemp -d)
cleanup() {
  for p in $loops $st $ct; do kill "$p" 2>/dev/null || true; done
  for ns in "$A" "$B"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$D"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
. scripts/veth-pair.sh
veth_pair "$A" "$B" "$MTU" 10.77.0
ip -n "$A" link set va down
ip -n "$A" link set va name "$DEV"
ip -n "$A" link set "$DEV" up
# Each loop ends by itself after ten minutes, should this script be killed without its cleanup.
start_loops() {
  for _ in 1 2; do (end=$((SECONDS + 600)); while ((SECONDS < end)); do :; done) & loops="$loops $!"; done
  sleep 1
}
stop_loops() { for p in $loops; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; loops=""; }
timed() { local ns=$1 out=$2; shift 2; ip netns exec "$ns" /usr/bin/time -f "%U %S" -o "$out" timeout $((SECS + 20)) "$@"; }
# The process in namespace NS whose command line is exactly the given words (one, or fail).
pid_in() {
  local ns=$1 want p found=""; shift
  want="$*"
  for p in $(ip netns pids "$ns"); do
    [ "$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | sed 's/ $//')" = "$want" ] && found="$found $p"
  done
  set -- $found
  [ $# = 1 ] || { echo "expected one process '$want' in $ns, found: ${found:-none}" >&2; return 1; }
  echo "$1"
}
# One run: LABEL, tcp or mr. Prints one line.
one() {
  local label=$1 tool=$2 spid cpid rate extra server client
  if [ "$tool" = tcp ]; then
    server=(iperf3 -s -1 -p 5399)
    client=(iperf3 -c 10.77.0.2 -p 5399 -t "$SECS" -J)
  else
    server=("$M" write-bw --once -p 18906)
    client=("$M" write-bw 10.77.0.2 -p 18906 -D "$SECS" --json)
  fi
  timed "$B" "$D/st" "${server[@]}" >/dev/null 2>&1 &
  st=$!
  sleep 0.3
  timed "$A" "$D/ct" "${client[@]}" >"$D/out" 2>/dev/null &
  ct=$!
  sleep 0.1
  # The tools' own processes (children of time and timeout), by their exact command lines.
  spid=$(pid_in "$B" "${server[@]}"); cpid=$(pid_in "$A" "${client[@]}")
  sleep 0.7
  perf record -q -a -e net:net_dev_xmit -o "$D/perf.data" -- sleep 1.5 >/dev/null 2>"$D/perf.err" ||
    { echo "perf record failed:" >&2; cat "$D/perf.err" >&2; exit 1; }
  wait "$ct" || true
  wait "$st" 2>/dev/null || true
  st=""; ct=""
  if [ "$tool" = tcp ]; then
    rate=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"]/1e9)' "$D/out")
    extra=""
  else
    read -r rate extra < <(head -1 "$D/out" | python3 -c 'import json,sys; j=json.loads(sys.stdin.readline()); print(j["bw_avg_gbps"], "retransmits %d, path failures %d" % (j["retransmits"], j["path_failures"])) if j["verified"] else sys.exit("write-bw did not verify its bytes")')
    [ -n "$rate" ] || exit 1
  fi
  perf script -i "$D/perf.data" -F comm,pid,trace 2>/dev/null | python3 -c '
import collections, re, sys
spid, cpid, label, rate, secs = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[7])
dev, loops, extra = sys.argv[8], set(sys.argv[9].split()), sys.argv[10]
cpu_c = sum(map(float, open(sys.argv[5]).read().split()[-2:]))
cpu_s = sum(map(float, open(sys.argv[6]).read().split()[-2:]))
nbytes = collections.Counter(); skbs = collections.Counter()
for line in sys.stdin:
    m = re.search(r"^\s*(\S.*?)\s+(\d+)\s+dev=(\S+) .*len=(\d+) rc=0\b", line)
    if not m or m.group(3) != dev:
        continue
    comm, pid = m.group(1), m.group(2)
    who = ("sender" if pid == cpid else "receiver" if pid == spid else
           "softirq threads" if comm.startswith("ksoftirqd") else
           "idle CPU (interrupts)" if pid == "0" else "busy loops" if pid in loops else "other")
    nbytes[who] += int(m.group(4)); skbs[who] += 1
total = sum(nbytes.values()) or 1
shares = ", ".join("%s %.1f%%" % (k, 100 * v / total) for k, v in nbytes.most_common())
print("%s: %.2f Gb/s; CPU seconds: sender %.2f, receiver %.2f; %.1f Gb/s per second of both ends\x27 CPU; "
      "%.0f bytes a transmission; data bytes sent in the time of: %s%s"
      % (label, rate, cpu_c, cpu_s, rate * secs / (cpu_c + cpu_s), total / max(sum(skbs.values()), 1), shares,
         "; " + extra if extra else ""))
' "$spid" "$cpid" "$label" "$rate" "$D/ct" "$D/st" "$SECS" "$DEV" "$loops" "$extra"
}
for r in $(seq 1 "$ROUNDS"); do
  one "round $r idle, iperf3" tcp
  one "round $r idle, write-bw" mr
  start_loops
  one "round $r busy, iperf3" tcp
  one "round $r busy, write-bw" mr
  stop_loops
done
