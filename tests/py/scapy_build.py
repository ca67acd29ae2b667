#!/usr/bin/env python3
"""Build random RoCEv2 frames with scapy, independently of the project.

Usage: scapy_build.py COUNT SEED OUT.pcap OUT.jsonl

Writes the frames to a pcap and, for each, a JSON object with the field values scapy was asked to
put in it and the ICRC scapy computed. Extension headers scapy lacks (RETH, ImmDt, DETH, IETH,
AtomicETH, AtomicAckETH) are packed by hand from IBTA Annex A17; the BTH, the ACK's AETH, the CNP
and the ICRC are scapy's own.
"""
import ipaddress
import json
import random
import struct
import sys

from scapy.all import Ether, Dot1Q, IP, IPv6, UDP, Raw, wrpcap, raw, load_contrib

load_contrib("roce")
from scapy.contrib.roce import BTH, AETH, CNPPadding  # noqa: E402

# opcode -> extension headers after the BTH, in order (IBTA vol. 1 table 38).
LAYOUTS = {}
for base in (0x00, 0x20):  # RC and UC share the SEND and WRITE layouts
    LAYOUTS.update({
        base + 0x00: [], base + 0x01: [], base + 0x02: [], base + 0x03: ["immdt"],
        base + 0x04: [], base + 0x05: ["immdt"],
        base + 0x06: ["reth"], base + 0x07: [], base + 0x08: [], base + 0x09: ["immdt"],
        base + 0x0A: ["reth"], base + 0x0B: ["reth", "immdt"],
    })
LAYOUTS.update({
    0x0C: ["reth"], 0x0D: ["aeth"], 0x0E: [], 0x0F: ["aeth"], 0x10: ["aeth"],
    0x11: ["aeth"], 0x12: ["aeth", "atomic_ack_eth"], 0x13: ["atomic_eth"], 0x14: ["atomic_eth"],
    0x16: ["ieth"], 0x17: ["ieth"],
    0x64: ["deth"], 0x65: ["deth", "immdt"],
    0x81: ["cnp"],
})
NO_PAYLOAD = {0x0C, 0x11, 0x12, 0x13, 0x14, 0x81}


def rand_mac(r):
    b = [r.randrange(256) for _ in range(6)]
    b[0] = (b[0] & 0xFC) | 0x02
    return ":".join("%02x" % x for x in b)


def build(r):
    op = r.choice(sorted(LAYOUTS))
    f = {"opcode": op}
    plen = 0 if op in NO_PAYLOAD else r.randrange(0, 4097)
    payload = bytes(r.randrange(256) for _ in range(plen))
    pad = (4 - plen % 4) % 4
    f["payload_len"] = plen

    f["eth_src"], f["eth_dst"] = rand_mac(r), rand_mac(r)
    frame = Ether(src=f["eth_src"], dst=f["eth_dst"])
    if r.random() < 0.5:
        f["vlan"] = {"pcp": r.randrange(8), "dei": r.randrange(2), "vid": r.randrange(1, 4095)}
        frame = frame / Dot1Q(prio=f["vlan"]["pcp"], id=f["vlan"]["dei"], vlan=f["vlan"]["vid"])
    dscp, ecn = r.randrange(64), r.randrange(4)
    f["dscp"], f["ecn"] = dscp, ecn
    if r.random() < 0.5:
        f["ip"] = 4
        f["src"] = "%d.%d.%d.%d" % tuple(r.randrange(256) for _ in range(4))
        f["dst"] = "%d.%d.%d.%d" % tuple(r.randrange(256) for _ in range(4))
        f["ttl"], f["ident"] = r.randrange(1, 256), r.randrange(65536)
        frame = frame / IP(src=f["src"], dst=f["dst"], tos=(dscp << 2) | ecn, ttl=f["ttl"],
                           id=f["ident"], flags="DF")
    else:
        f["ip"] = 6
        f["src"] = str(ipaddress.IPv6Address(r.randrange(1 << 128)))
        f["dst"] = str(ipaddress.IPv6Address(r.randrange(1 << 128)))
        f["hop_limit"], f["flow_label"] = r.randrange(256), r.randrange(1 << 20)
        frame = frame / IPv6(src=f["src"], dst=f["dst"], tc=(dscp << 2) | ecn,
                             hlim=f["hop_limit"], fl=f["flow_label"])
    f["sport"] = r.randrange(0xC000, 0x10000)
    frame = frame / UDP(sport=f["sport"], dport=4791, chksum=0)

    bth = dict(solicited=r.randrange(2), migreq=r.randrange(2), padcount=pad, version=0,
               pkey=r.randrange(65536), fecn=r.randrange(2), becn=r.randrange(2),
               dqpn=r.randrange(1 << 24), ackreq=r.randrange(2), psn=r.randrange(1 << 24))
    if op == 0x81:
        bth["becn"] = 1
    f["bth"] = bth
    pkt = frame / BTH(opcode=op, **bth)
    ext = b""
    for h in LAYOUTS[op]:
        if h == "reth":
            v = (r.randrange(1 << 64), r.randrange(1 << 32), r.randrange(1 << 32))
            f["reth"] = v
            ext += struct.pack("!QII", *v)
        elif h == "aeth":
            syn = r.choice([r.randrange(32), 0x20 | r.randrange(32), 0x60 | r.randrange(5)])
            f["aeth"] = (syn, r.randrange(1 << 24))
            if op == 0x11:
                pkt = pkt / AETH(syndrome=f["aeth"][0], msn=f["aeth"][1])
            else:
                ext += struct.pack("!I", (syn << 24) | f["aeth"][1])
        elif h == "atomic_ack_eth":
            f["atomic_ack_eth"] = r.randrange(1 << 64)
            ext += struct.pack("!Q", f["atomic_ack_eth"])
        elif h == "atomic_eth":
            v = (r.randrange(1 << 61) * 8, r.randrange(1 << 32), r.randrange(1 << 64),
                 r.randrange(1 << 64))
            f["atomic_eth"] = v
            ext += struct.pack("!QIQQ", *v)
        elif h == "immdt":
            f["immdt"] = r.randrange(1 << 32)
            ext += struct.pack("!I", f["immdt"])
        elif h == "ieth":
            f["ieth"] = r.randrange(1 << 32)
            ext += struct.pack("!I", f["ieth"])
        elif h == "deth":
            v = (r.randrange(1 << 32), r.randrange(1 << 24))
            f["deth"] = v
            ext += struct.pack("!II", v[0], v[1])
        elif h == "cnp":
            pkt = pkt / CNPPadding()
    body = ext + payload + b"\0" * pad
    if body:
        pkt = pkt / Raw(body)
    # scapy's FCS field: append a placeholder so compute_icrc sees the right lengths.
    built = raw(pkt)
    f["icrc"] = int.from_bytes(built[-4:], "little")
    return built, f


def main() -> None:
    count, seed, pcap_path, jsonl_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    r = random.Random(seed)
    frames, fields = [], []
    for _ in range(count):
        b, f = build(r)
        frames.append(Ether(b))
        fields.append(f)
    wrpcap(pcap_path, frames)
    with open(jsonl_path, "w") as out:
        for f in fields:
            out.write(json.dumps(f) + "\n")


if __name__ == "__main__":
    main()
