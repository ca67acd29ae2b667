#!/usr/bin/env bash
# What a cost per hop does to ping-pong latency on this machine, and how much of the p99 ratio is
# the machine itself. Every round runs, on loopback, interleaved:
#   - the plain UDP ping-pong (host-ibverbs/examples/udp_pingpong.rs), the baseline;
#   - the same plain ping-pong again: p99 against p99 of the same program (the noise floor);
#   - the plain ping-pong with `--work NS` for each NS given: both ends spin NS nanoseconds between
#     a datagram's arrival and the answer, as an engine's processing would;
#   - `metaroce write-lat` (UDP transport, defaults);
#   - with DOORBELL=1, the plain ping-pong with `--doorbell` (needs root): each end notices an
#     arrival from a counter a socket filter keeps in its memory, not by empty receive calls.
# Prints one line per round (p50 and p99 half round trips, microseconds) and, per variant, the
# median p50 and p99 ratios to the baseline and in how many rounds p99 was within 1.5x.
#
# Usage: [DOORBELL=1] scripts/bench-lat-budget.sh [ROUNDS] [ITERS] [SIZE] [NS ...]   (default NS: 200 400 700)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-10}
ITERS=${2:-200000}
SIZE=${3:-2}
shift $(($# < 3 ? $# : 3))
WORK=("$@")
[ ${#WORK[@]} -gt 0 ] || WORK=(200 400 700)
cargo build -q --release -p metaroce-cli --bin metaroce && cargo build -q --release -p host-ibverbs --example udp_pingpong
if [ "${DOORBELL:-0}" = 1 ] && [ "$(id -u)" != 0 ]; then
  echo "DOORBELL=1 needs root (a BPF socket filter and map)"; exit 2
fi
M=target/release/metaroce
P=target/release/examples/udp_pingpong
# The client's JSON line is kept and read after both ends are gone: a reader started beside the
# client (a Python interpreter in a pipe) takes a CPU from the spinning ends while it starts.
pick() { python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["p50_us"], d["p99_us"])' "$1"; }
plain() { # PORT [--work NS]
  $P server "$1" "${@:2}" &
  sleep 0.2
  local j
  j=$($P client "127.0.0.1:$1" "$SIZE" "$ITERS" "${@:2}")
  wait
  pick "$j"
}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for r in $(seq 1 "$ROUNDS"); do
  line="plain $(plain 18801)|again $(plain 18801)"
  for w in "${WORK[@]}"; do
    line="$line|work$w $(plain 18801 --work "$w")"
  done
  if [ "${DOORBELL:-0}" = 1 ]; then
    line="$line|doorbell $(plain 18801 --doorbell)"
  fi
  $M write-lat --once -p 18802 >/dev/null 2>&1 &
  sleep 0.3
  j=$($M write-lat 127.0.0.1 -p 18802 -s "$SIZE" -n "$ITERS" --json 2>/dev/null)
  wait
  line="$line|write-lat $(pick "$j")"
  echo "round $r: $line" | tee -a "$OUT"
done
python3 - "$OUT" <<'EOF'
import statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    for part in line.split(":", 1)[1].split("|"):
        name, p50, p99 = part.split()
        rows.setdefault(name, []).append((float(p50), float(p99)))
base = rows["plain"]
for name, v in rows.items():
    if name == "plain":
        continue
    r50 = [a[0] / b[0] for a, b in zip(v, base)]
    r99 = [a[1] / b[1] for a, b in zip(v, base)]
    print("%-10s p50 %.2fx  p99 %.2fx (%.2fx-%.2fx, within 1.5x in %d of %d rounds)" % (
        name, st.median(r50), st.median(r99), min(r99), max(r99),
        sum(r <= 1.5 for r in r99), len(r99)))
EOF
