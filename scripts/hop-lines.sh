#!/usr/bin/env bash
# The cache lines a ping-pong hop touches, by field of the connection. Runs the `hop_lines`
# example (the conn bench's ping-pong: two connections as the UDP transport configures them, a
# 2-byte Write with immediate each way) under valgrind's lackey, which traces every load and
# store, cuts the trace into half hops at the example's marker stores, and names each line of a
# connection by the field its first access fell in (the layout read from the debug information by
# gdb). A line counts once per half hop, whatever the number of accesses to it: after anything
# that empties the caches (a system call, the kernel's packet path, a neighbour), each is a miss.
#
# Prints, per half hop (send: post, data packet, seal, the sender's timer poll; receive: the
# datagram taken in, completions, the receive buffer posted again, the receiver's timer poll):
# the lines of the connection, of the stack, of the datagram buffer and of the rest (the binary's
# tables, the marker); then the connection's lines by field group; then the lines of a whole
# turn of one end (it receives a ping and sends the answer: what a write-lat server touches per
# ping, and the event poll it runs as the sender of the next hop). Deterministic: the same build
# gives the same figures. Lines are the machine's (address / 64), so a connection that starts inside
# a line (an allocation aligned to less than 64 bytes) counts the lines it straddles; the script
# says where each connection starts within its line.
# Needs valgrind and gdb (Debian: valgrind gdb); the stack and binary address ranges are those of
# valgrind on x86-64 Linux.
#
# With DETAIL=1, also every line of the connection a half hop touches: its offset, how often
# (per half hop) and the fields accessed in it.
#
# Usage: [DETAIL=1] scripts/hop-lines.sh [ROUND_TRIPS]   (default 40; the first 10 are left out as warm-up)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-40}
[ "$N" -gt 10 ] || { echo "ROUND_TRIPS must be more than 10"; exit 2; }
for t in valgrind gdb python3; do
  command -v $t >/dev/null || { echo "$t is needed (apt-get install valgrind gdb)"; exit 2; }
done
cargo build -q --profile bench -p transport-core --example hop_lines
X=${CARGO_TARGET_DIR:-target}/release/examples/hop_lines
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
valgrind --tool=lackey --trace-mem=yes --log-file="$D/trace" "$X" "$N" 2>"$D/info"
grep -q '^MARK ' "$D/info" || { echo "hop_lines printed no addresses:"; cat "$D/info"; exit 1; }
# The connection's layout: every leaf field's offset, size and path; arrays of records as a
# record with a stride.
cat >"$D/layout.py" <<'EOF'
import gdb
out = open(LAYOUT_OUT, "w")
def walk(t, off, name, depth):
    t = t.strip_typedefs()
    if t.code == gdb.TYPE_CODE_ARRAY:
        et = t.target().strip_typedefs()
        n = t.sizeof // max(et.sizeof, 1)
        if et.code == gdb.TYPE_CODE_STRUCT and et.sizeof >= 16 and depth < 4:
            out.write("ARR %d %d %d %s\n" % (off, et.sizeof, n, name))
            walk(et, 0, name + "[]", depth + 1)
            out.write("END\n")
        else:
            out.write("F %d %d %s\n" % (off, t.sizeof, name))
        return
    opaque = ("core::option", "core::net", "transport_core::time")
    if (t.code in (gdb.TYPE_CODE_STRUCT, gdb.TYPE_CODE_UNION) and depth < 4 and t.fields()
            and not (t.name or "").startswith(opaque)
            and all(f.name is not None and hasattr(f, "bitpos") for f in t.fields())):
        for f in t.fields():
            walk(f.type, off + f.bitpos // 8, name + "." + f.name, depth + 1)
        return
    out.write("F %d %d %s\n" % (off, t.sizeof, name))
walk(gdb.lookup_type("transport_core::conn::Connection<64, 2048, 8, 128, 32>"), 0, "c", 0)
out.close()
EOF
gdb -batch -ex "python LAYOUT_OUT = '$D/fields'" -ex "source $D/layout.py" "$X" >/dev/null 2>&1
[ -s "$D/fields" ] || { echo "gdb found no layout of the connection in $X"; exit 1; }
python3 - "$D/trace" "$D/info" "$D/fields" "${DETAIL:-0}" <<'EOF'
import collections, re, sys
trace, info, fields, detail = sys.argv[1:5]
lines = open(fields).read().split("\n")
def parse(i, out):
    while i < len(lines):
        l = lines[i]; i += 1
        if not l:
            continue
        if l == "END":
            return i
        p = l.split(" ", 4)
        if p[0] == "F":
            out.append((int(p[1]), int(p[2]), p[3], None, 0))
        else:
            off, stride, n, name = int(p[1]), int(p[2]), int(p[3]), p[4]
            inner = []
            i = parse(i, inner)
            out.append((off, stride * n, name, inner, stride))
    return i
top = []
parse(0, top)
def name_of(lst, off):
    for o, s, nm, inner, stride in lst:
        if o <= off < o + s:
            if inner is None:
                return nm
            sub = name_of(inner, (off - o) % stride) or "?"
            return nm + "[]" + sub.split("[]", 1)[-1]
    return None
def group(nm):
    # Records of a ring or table by their array; a path's sender record and the rings in it
    # by part; everything else by its first two levels.
    nm = re.sub(r"\.__0$", "", nm)
    m = re.match(r"(c\.paths\[\]\.(ring_psn|ring_sent|stats))", nm)
    if m:
        return m.group(1)
    if nm.startswith("c.paths[]"):
        return "c.paths[] (the rest)"
    parts = nm.split(".")
    if len(parts) > 2 and parts[1] in ("cfg", "counters", "rate", "acks", "refusals", "msgs",
                                       "pkts", "rx_streams", "events", "regions", "rx_paths",
                                       "icrc_tx", "icrc_rx", "nacks", "retx"):
        return ".".join(parts[:2])
    return nm
m = re.search(r"MARK (\w+) A (\w+) B (\w+) SIZE (\d+) BUF (\w+) BUFLEN (\d+)", open(info).read())
mark, A, B = (int(m.group(i), 16) for i in (1, 2, 3))
size, buf, buflen = int(m.group(4)), int(m.group(5), 16), int(m.group(6))
segs = []  # (step, {region: set(lines)}, Counter(group))
cur = None
stack_lo = None
for l in open(trace):
    if l[0] in "I=":
        continue
    p = l.split()
    if len(p) < 2:
        continue
    kind, a = p[0], int(p[1].split(",")[0], 16)
    if a == mark and kind in ("S", "M"):
        cur = (len(segs) % 5, collections.defaultdict(set), collections.Counter(),
               collections.defaultdict(set))
        segs.append(cur)
        continue
    if cur is None:
        continue
    ln = a >> 6
    if A <= a < A + size or B <= a < B + size:
        r = "a" if a < A + size and a >= A else "b"
        base = A if r == "a" else B
        if ln not in cur[1][r]:
            cur[2][(r, group(name_of(top, a - base) or "?"))] += 1
        if detail == "1":
            nm = re.sub(r"\[\]\.?", "[].", name_of(top, a - base) or "?").rstrip(".")
            cur[3][(r, ln - (base >> 6))].add(nm)
    elif buf <= a < buf + buflen:
        r = "buffer"
    elif a >= 0x1000000000:
        r = "stack"
    elif a < 0x1000000:
        r = "binary"  # its tables, constants and GOT (valgrind loads it low)
    else:
        r = "other"
    cur[1][r].add(ln)
print("connections at %d and %d bytes into a cache line, %d bytes each" % (A % 64, B % 64, size))
# Steps in a round trip: 0 a sends, 1 b receives, 2 b sends, 3 a receives, 4 after it.
WARM = 10 * 5
kept = segs[WARM:]
rounds = len(kept) // 5
if rounds == 0:
    sys.exit("too few round trips traced")
def avg(step, f):
    xs = [f(s) for s in kept if s[0] == step]
    return sum(xs) / len(xs)
for step, label, own in ((0, "send", "a"), (1, "receive", "b")):
    print("%s half hop, lines: connection %.1f, stack %.1f, datagram buffer %.1f, the binary's "
          "tables %.1f, other %.1f" % (
              label, avg(step, lambda s: len(s[1][own])), avg(step, lambda s: len(s[1]["stack"])),
              avg(step, lambda s: len(s[1]["buffer"])), avg(step, lambda s: len(s[1]["binary"])),
              avg(step, lambda s: len(s[1]["other"]))))
    c = collections.Counter()
    for s in kept:
        if s[0] == step:
            for (r, g), v in s[2].items():
                if r == own:
                    c[g] += v
    for g, v in sorted(c.items(), key=lambda x: (-x[1], x[0])):
        if v / rounds >= 0.05:
            print("  %5.2f  %s" % (v / rounds, g))
    if detail == "1":
        seen = collections.Counter()
        names = collections.defaultdict(set)
        for s in kept:
            if s[0] == step:
                for (r, line), nms in s[3].items():
                    if r == own:
                        seen[line] += 1
                        names[line] |= nms
        for line in sorted(seen):
            if seen[line] / rounds >= 0.05:
                print("    line at +%7d: %4.2f  %s" % (line * 64, seen[line] / rounds,
                                                   " ".join(sorted(names[line]))[:160]))
# One end's turn: b receives the ping (step 1), sends the answer (step 2) and, as the sender of that
# answer, polls its events while a takes it in (step 3: b's own lines only).
turn = collections.defaultdict(list)
for i in range(0, len(kept) - 3, 5):
    r, s, e = kept[i + 1], kept[i + 2], kept[i + 3]
    if (r[0], s[0], e[0]) != (1, 2, 3):
        continue
    for reg in ("b", "stack", "buffer", "binary", "other"):
        turn[reg].append(len(r[1][reg] | s[1][reg] | (e[1][reg] if reg == "b" else set())))
print("a turn of one end (receive, send the answer, poll its events), lines: connection %.1f, stack %.1f, "
      "datagram buffer %.1f, the binary's tables %.1f, other %.1f" % tuple(
          sum(turn[k]) / len(turn[k]) for k in ("b", "stack", "buffer", "binary", "other")))
EOF
