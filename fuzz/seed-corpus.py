#!/usr/bin/env python3
"""Seeds the fuzz corpora: the real ConnectX frames, frames from `metaroce gen`, and the MetaRoCE
headers cut out of generated MetaRoCE frames. Run from the repository root after a build:
python3 fuzz/seed-corpus.py target/debug/metaroce"""
import hashlib
import json
import os
import subprocess
import sys

tool = sys.argv[1]
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
        f.write(data)


for line in open(os.path.join(os.path.dirname(root), "..", "tests", "data", "rocev2-connectx.hex")):
    line = line.strip()
    if line and not line.startswith("#"):
        put("frame", bytes.fromhex(line))

for kind, seed, count in (("rocev2", 1, 24), ("metaroce", 2, 24), ("metaroce", 3, 400)):
    hexes = subprocess.run([tool, "gen", "--count", str(count), "--seed", str(seed), "--kind", kind],
                           check=True, capture_output=True, text=True).stdout.split()
    decoded = subprocess.run([tool, "decode", "--json"], input="\n".join(hexes), check=True,
                             capture_output=True, text=True).stdout.splitlines()
    for h, j in zip(hexes, decoded):
        frame = bytes.fromhex(h)
        if seed < 3:
            put("frame", frame)
        info = json.loads(j)
        off = 18 if "vlan" in info else 14
        off += info["ipv4"]["ihl"] * 4 if "ipv4" in info else 40
        off += 8 + 12
        body = frame[off:-4]
        op = info["bth"]["opcode"]
        target = {0xE0: "mr_ack", 0xE1: "mr_nack", 0xE2: "mr_probe", 0xE3: "mr_probe"}.get(
            op, "mr_data" if 0xC0 <= op < 0xE0 else None)
        if target:
            put(target, body[:64])
