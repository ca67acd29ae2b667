#!/usr/bin/env bash
# What the UDP transport's system-call features buy on loopback: `metaroce write-bw` (defaults:
# 65536-byte Writes, 8 paths, 16 KiB packets) with each of UDP GSO, UDP GRO and batched calls
# (sendmmsg/recvmmsg) turned off in turn, then GSO and GRO together (batches alone left), then all
# three, both ends alike, against the defaults measured in the same round (on loopback the
# defaults leave the ICRC off: both ends are on one host). Prints one line per round and the median ratios.
#
# Usage: scripts/bench-features.sh [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
SECS=${2:-2}
cargo build -q --release -p metaroce-cli --bin metaroce
M=target/release/metaroce
names=(defaults no-gso no-gro no-batch no-gso-gro all-off)
flags=("" "--no-gso" "--no-gro" "--no-batch" "--no-gso --no-gro" "--no-gso --no-gro --no-batch")
results=()
for r in $(seq 1 "$ROUNDS"); do
  line="round $r:"
  row=()
  for i in "${!names[@]}"; do
    # shellcheck disable=SC2086 # the flags are words
    $M write-bw --once -p 18820 ${flags[$i]} >/dev/null 2>&1 &
    sleep 0.3
    # shellcheck disable=SC2086
    j=$($M write-bw 127.0.0.1 -p 18820 -D "$SECS" ${flags[$i]} --json 2>/dev/null)
    wait
    # Read after the run: nothing else takes a CPU from the two ends while they measure.
    g=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["bw_avg_gbps"])' "$j")
    row+=("$g")
    line="$line $(printf "%s %.2f" "${names[$i]}" "$g");"
  done
  echo "$line"
  results+=("$(IFS=,; echo "${row[*]}")")
done
python3 -c "
import statistics as s
rows=[[float(x) for x in r.split(',')] for r in '''$(printf '%s\n' "${results[@]}")'''.split()]
names='${names[*]}'.split()
for i,n in enumerate(names):
    print('median %-8s %6.2f Gb/s, %.2fx the defaults' % (n, s.median(r[i] for r in rows), s.median(r[i]/r[0] for r in rows)))
"
