#!/usr/bin/env bash
# Two builds (or two option sets) of `metaroce write-bw` against each other between two network
# namespaces joined by a veth pair: every round runs both, idle and then beside two busy loops
# (any real host has other work), the order of the two alternating from round to round. Prints one
# line per run (round, load, variant, Gb/s, retransmissions, paths declared failed) and the
# medians of each variant under each load. Needs root and iproute2.
#
# Usage: [MTU=1500] [OPTS_A=...] [OPTS_B=...] scripts/bench-veth-ab.sh ROUNDS METAROCE_A METAROCE_B [-- client options for both]
#   OPTS_A / OPTS_B: options both ends of that variant get (e.g. OPTS_B=--busy-poll with the same binary twice).
set -euo pipefail
R=$1; BA=$2; BB=$3; shift 3
[ "${1:-}" = "--" ] && shift
MTU=${MTU:-1500}
A=mrab_a$$; B=mrab_b$$
loops=""
cleanup() {
  for p in $loops; do kill "$p" 2>/dev/null || true; done
  ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true
}
trap cleanup EXIT
. "$(dirname "$0")/veth-pair.sh"
veth_pair "$A" "$B" "$MTU" 10.79.0
start_loops() { for _ in 1 2; do (while :; do :; done) & loops="$loops $!"; done; sleep 0.5; }
stop_loops() { for p in $loops; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; loops=""; }
out=$(mktemp)
# One run: BIN, that variant's options for both ends, then the client's.
one() {
  local bin=$1 opts=$2; shift 2
  # shellcheck disable=SC2086 # the variant's options are words
  ip netns exec "$B" "$bin" write-bw --once -p 18806 $opts >/dev/null 2>&1 &
  local sp=$!
  sleep 0.3
  # shellcheck disable=SC2086
  ip netns exec "$A" "$bin" write-bw 10.79.0.2 -p 18806 -D 3 --json $opts "$@" 2>/dev/null | head -1 |
    python3 -c 'import json,sys; d=json.loads(sys.stdin.readline()); assert d["verified"]; print("%.2f" % d["bw_avg_gbps"], d["retransmits"], d["path_failures"])'
  wait "$sp" || true
}
for r in $(seq "$R"); do
  for load in idle busy; do
    [ "$load" = busy ] && start_loops
    if [ $((r % 2)) = 1 ]; then order="a b"; else order="b a"; fi
    for v in $order; do
      if [ "$v" = a ]; then res=$(one "$BA" "${OPTS_A:-}" "$@"); else res=$(one "$BB" "${OPTS_B:-}" "$@"); fi
      echo "$r $load $v $res" | tee -a "$out"
    done
    [ "$load" = busy ] && stop_loops
  done
done
python3 - "$out" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list); bad = collections.Counter()
for line in open(sys.argv[1]):
    r, load, v, gbps, retx, fail = line.split()
    d[(load, v)].append(float(gbps)); bad[(load, v)] += int(retx) + int(fail)
for load in ("idle", "busy"):
    a, b = d[(load, "a")], d[(load, "b")]
    print("%s: A median %.2f Gb/s, B median %.2f (B/A %.3f); retransmissions and failed paths A %d, B %d"
          % (load, statistics.median(a), statistics.median(b), statistics.median(b) / statistics.median(a), bad[(load, "a")], bad[(load, "b")]))
PY
rm -f "$out"
