#!/usr/bin/env bash
# Two builds of `metaroce write-lat` against each other on loopback, with the plain UDP ping-pong
# (host-ibverbs/examples/udp_pingpong.rs) as the baseline of both: every round runs the three in
# an order that rotates over six rounds, and every half round trip goes into one pool per variant.
# Prints the pooled p50 of each (all rounds, odd, even), B against A, and in how many rounds B's
# median ratio to the plain ping-pong was the lower. The same binary as A and B shows what an A/B
# resolves on the machine at hand (on the 2-vCPU machine of docs/BENCHMARKS.md: 0.967x).
#
# Usage: [ITERS=20000] scripts/bench-lat-ab.sh ROUNDS METAROCE_A METAROCE_B
set -euo pipefail
cd "$(dirname "$0")/.."
R=$1; A=$2; B=$3; ITERS=${ITERS:-20000}
cargo build -q --release -p host-ibverbs --example udp_pingpong
P=${CARGO_TARGET_DIR:-target}/release/examples/udp_pingpong
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
plain() { $P server 18811 & sleep 0.2; $P client 127.0.0.1:18811 2 "$ITERS" --samples "$1" >/dev/null; wait; }
wl() {
  "$1" write-lat --once -p 18812 >/dev/null 2>&1 &
  sleep 0.3
  "$1" write-lat 127.0.0.1 -p 18812 -s 2 -n "$ITERS" --json -U >"$2.json" 2>/dev/null
  wait
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["verified"]; print("\n".join("%.3f" % v for v in d["samples_us"]))' "$2.json" >"$2"
}
for r in $(seq "$R"); do
  case $((r % 6)) in 0) o="p a b";; 1) o="a b p";; 2) o="b p a";; 3) o="p b a";; 4) o="b a p";; 5) o="a p b";; esac
  for v in $o; do case $v in p) plain "$D/p.$r";; a) wl "$A" "$D/a.$r";; b) wl "$B" "$D/b.$r";; esac; done
done
python3 - "$D" "$R" <<'PY'
import os, statistics, sys
d, R = sys.argv[1], int(sys.argv[2])
def read(v, r): return [float(x) for x in open(os.path.join(d, "%s.%d" % (v, r)))]
def pool(v, keep): return sorted(x for r in range(1, R + 1) if keep(r) for x in read(v, r))
def q(xs, p): return xs[int(len(xs) * p)]
for lab, keep in [("all", lambda r: True), ("odd", lambda r: r % 2), ("even", lambda r: not r % 2)]:
    P, A, B = [pool(v, keep) for v in "pab"]
    print("%-4s plain p50 %.3f us, A %.3f (%.3fx), B %.3f (%.3fx), B/A %.3f" % (lab, q(P, .5), q(A, .5), q(A, .5) / q(P, .5), q(B, .5), q(B, .5) / q(P, .5), q(B, .5) / q(A, .5)))
ratio = lambda v, r: statistics.median(read(v, r)) / statistics.median(read("p", r))
ra = [ratio("a", r) for r in range(1, R + 1)]; rb = [ratio("b", r) for r in range(1, R + 1)]
print("round ratios, medians: A %.3f, B %.3f; B lower in %d of %d rounds" % (statistics.median(ra), statistics.median(rb), sum(b < a for a, b in zip(ra, rb)), R))
PY
