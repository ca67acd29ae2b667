#!/usr/bin/env bash
# Instructions a write-lat ping costs the server, counted by valgrind's callgrind: within about 1%
# from run to run for the same binary, whatever else the machine does, where the latency itself
# moves by a fifth between runs on a shared VM. Use it to compare two builds of the per-hop work
# (the end-to-end effect of a change of a few percent is below what `scripts/bench-lat-ab.sh`
# resolves). The server runs under callgrind on loopback, the client natively; PINGS 2-byte pings.
# Prints, per ping, the server's instructions in all and in each step of a hop (inclusive counts:
# a step includes what it calls, so an "in it" row is part of the row above it, and rows that
# share a callee overlap). The spinning server's empty rounds between pings count too (in the
# receive row and, every 256th round, in the after-send row): that is the 1% that moves.
# Needs valgrind (Debian: valgrind).
#
# Usage: [KEEP=FILE] scripts/hop-instructions.sh [PINGS] [METAROCE]   (default 20000, the release build)
#   KEEP: also keep callgrind's output there (for callgrind_annotate's per-function view).
set -euo pipefail
cd "$(dirname "$0")/.."
PINGS=${1:-20000}
M=${2:-}
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)"; exit 2; }
if [ -z "$M" ]; then
  cargo build -q --release -p metaroce-cli --bin metaroce
  M=target/release/metaroce
fi
OUT=$(mktemp)
srv=""
trap 'if [ -n "$srv" ]; then kill "$srv" 2>/dev/null || true; fi; if [ -n "${KEEP:-}" ]; then cp "$OUT" "$KEEP"; fi; rm -f "$OUT"' EXIT
PORT=18831
valgrind --tool=callgrind --dump-instr=no --callgrind-out-file="$OUT" "$M" write-lat --once -p $PORT >/dev/null 2>&1 &
srv=$!
# valgrind takes a few seconds to start the server; the client retries its connection meanwhile.
ok=""
for _ in $(seq 1 100); do
  sleep 0.2
  if "$M" write-lat 127.0.0.1 -p $PORT -s 2 -n "$PINGS" --json >/dev/null 2>&1; then
    ok=1
    break
  fi
done
if [ -z "$ok" ]; then
  echo "the client never completed a run against the server under callgrind" >&2
  exit 1
fi
wait "$srv"
srv=""
callgrind_annotate --inclusive=yes --threshold=100 "$OUT" | python3 -c '
import re, sys
pings = int(sys.argv[1])
rows = {}
total = None
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(\S.*)", line)
    if not m:
        continue
    n = int(m.group(1).replace(",", ""))
    name = m.group(2)
    if "PROGRAM TOTALS" in name:
        total = n
        continue
    fn = re.sub(r"\s*\[.*\]$", "", name).split(":", 1)[-1]
    rows[fn] = max(rows.get(fn, 0), n)
if not total:
    sys.exit("no program total in callgrind_annotate output")
def get(suffix):
    for fn, n in rows.items():
        if fn.endswith(suffix):
            return "%7.0f" % (n / pings)
    return "    n/a"  # inlined, or renamed
steps = [
    ("receive: datagram read to the connection, completions queued", "Engine>::receive_from"),
    ("  in it: dispatch (parse, connection, placement)", "Engine>::dispatch"),
    ("completions to the completion queue", "Engine::drain_events"),
    ("the tool posts the answer (all of it, incl. what follows the send)", "QueuePair::post_send"),
    ("  in it: data packets built (the answer, and the look for more after the send)", "Connection<_,_,_,_,_>>::poll_transmit_data"),
    ("  in it: after the send, carried ACK, ACKs, loss checks (poll_transmit)", "Connection<_,_,_,_,_>>::poll_transmit"),
    ("timers: the next deadline (poll_timeout)", "Connection<_,_,_,_,_>>::poll_timeout"),
    ("the tool re-posts the receive (after the answer)", "Endpoint::post_recv"),
]
print("server instructions per ping (%d pings): %.0f" % (pings, total / pings))
for label, suffix in steps:
    print("  %-78s %s" % (label, get(suffix)))
' "$PINGS"
