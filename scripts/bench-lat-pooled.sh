#!/usr/bin/env bash
# write-lat against the plain UDP ping-pong, every sample pooled over many short interleaved runs.
#
# One long run's p99 depends on what else the machine did during it (on a shared 2-vCPU machine the
# same program against itself lands anywhere from 0.2x to 2.1x in one run: scripts/bench-lat-budget.sh).
# Here each round runs, in an order that changes from round to round (see ORDERS), on loopback:
#   - the plain UDP ping-pong (host-ibverbs/examples/udp_pingpong.rs), the baseline;
#   - the same plain ping-pong again (what the estimator gives a program against itself);
#   - the plain ping-pong with the socket features a spinning latency test of the transport
#     opens (--like-transport --without gro,timestamp,paths: its datagram length, ECT(0), DF, the
#     ECN cmsg, 8 MiB buffers, answers from a connected path socket; the transport leaves UDP GRO,
#     arrival times and the turn over its paths off for a ping), to tell what those cost from
#     what the engine costs;
#   - `metaroce write-lat` (UDP transport, defaults, -U for its samples);
# and every half round trip of every round goes into one pool per variant, so all variants see the
# machine's quiet and noisy phases alike. Prints each pool's percentiles and ratios to the baseline,
# and the same ratios from the odd and the even rounds alone (how far the estimate moves when half
# of the data is left out).
#
# Usage: [KEEP=DIR] scripts/bench-lat-pooled.sh [ROUNDS] [ITERS] [SIZE]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-24}
ITERS=${2:-50000}
SIZE=${3:-2}
cargo build -q --release -p metaroce-cli --bin metaroce && cargo build -q --release -p host-ibverbs --example udp_pingpong
M=target/release/metaroce
P=target/release/examples/udp_pingpong
if [ -n "${KEEP:-}" ]; then # KEEP=DIR keeps every round's samples there
  DIR=$KEEP
  mkdir -p "$DIR"
else
  DIR=$(mktemp -d)
  trap 'rm -rf "$DIR"' EXIT
fi
plain() { # OUTFILE [--like-transport]
  $P server 18811 "${@:2}" &
  sleep 0.2
  $P client 127.0.0.1:18811 "$SIZE" "$ITERS" --samples "$1" "${@:2}" >/dev/null
  wait
}
writelat() { # OUTFILE
  $M write-lat --once -p 18812 >/dev/null 2>&1 &
  sleep 0.3
  # Nothing else runs during a measurement: the JSON is read after both ends are gone (a reader
  # started beside the client, such as a Python interpreter, takes a CPU from the spinning ends).
  $M write-lat 127.0.0.1 -p 18812 -s "$SIZE" -n "$ITERS" --json -U >"$1.json" 2>/dev/null
  wait
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["verified"]; print("\n".join("%.3f" % v for v in d["samples_us"]))' "$1.json" >"$1"
  rm "$1.json"
}
# The orders of a balanced Latin square: over four rounds every program runs in every position
# once and right after every other program once (a run can leave work behind for the next one:
# sockets closing, memory freed).
ORDERS=("plain again write-lat like" "again like plain write-lat" "like write-lat again plain"
  "write-lat plain like again")
for r in $(seq 1 "$ROUNDS"); do
  for v in ${ORDERS[$((r % 4))]}; do
    case $v in
      write-lat) writelat "$DIR/$v.$r" ;;
      like) plain "$DIR/$v.$r" --like-transport --without gro,timestamp,paths ;;
      *) plain "$DIR/$v.$r" ;;
    esac
  done
  echo "round $r of $ROUNDS done" >&2
done
python3 - "$DIR" "$ROUNDS" <<'PY'
import glob, os, sys
d, rounds = sys.argv[1], int(sys.argv[2])
def pool(v, keep):
    xs = []
    for r in range(1, rounds + 1):
        if keep(r):
            xs += [float(x) for x in open(os.path.join(d, "%s.%d" % (v, r)))]
    xs.sort()
    return xs
def q(xs, p):
    return xs[min(len(xs) - 1, max(0, int(len(xs) * p + 0.5) - 1))]
QS = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)]
for label, keep in [("all rounds", lambda r: True), ("odd rounds", lambda r: r % 2),
                    ("even rounds", lambda r: not r % 2)]:
    pools = {v: pool(v, keep) for v in ("plain", "again", "like", "write-lat")}
    base = pools["plain"]
    print("%s (%d samples per variant):" % (label, len(base)))
    for v, xs in pools.items():
        cells = []
        for name, p in QS:
            cell = "%s %.2f us" % (name, q(xs, p))
            if v != "plain":
                cell += " (%.2fx)" % (q(xs, p) / q(base, p))
            cells.append(cell)
        print("  %-9s %s" % (v, ", ".join(cells)))
    like = pools["like"]
    print("  write-lat against like: %s" % ", ".join(
        "%s %.2fx" % (name, q(pools["write-lat"], p) / q(like, p)) for name, p in QS))
PY
