#!/usr/bin/env python3
"""Recompute the ICRC of every frame in a pcap with scapy.contrib.roce, independently of the project.

Prints one JSON object per frame: {"i": index, "stored": int, "scapy": int}. scapy's compute_icrc
wrongly includes Ethernet padding, so each frame is cut at the IP length first.
"""
import json
import sys

from scapy.all import Ether, IP, IPv6, UDP, Raw, rdpcap, raw, load_contrib, bind_layers

load_contrib("roce")
from scapy.contrib.roce import BTH  # noqa: E402

bind_layers(UDP, BTH, dport=4791)


def cut_at_ip_length(frame: bytes) -> bytes:
    pkt = Ether(frame)
    if IP in pkt:
        ip_off = len(frame) - len(raw(pkt[IP]))
        return frame[: ip_off + pkt[IP].len]
    if IPv6 in pkt:
        ip_off = len(frame) - len(raw(pkt[IPv6]))
        return frame[: ip_off + 40 + pkt[IPv6].plen]
    return frame


def main() -> None:
    for i, p in enumerate(rdpcap(sys.argv[1])):
        frame = cut_at_ip_length(bytes(p))
        pkt = Ether(frame)
        if BTH not in pkt:
            print(json.dumps({"i": i, "error": "scapy found no BTH"}))
            continue
        stored = int.from_bytes(frame[-4:], "little")
        again = pkt.copy()
        again[BTH].icrc = None
        rebuilt = raw(again)
        computed = int.from_bytes(rebuilt[-4:], "little")
        print(json.dumps({"i": i, "stored": stored, "scapy": computed}))


if __name__ == "__main__":
    main()
