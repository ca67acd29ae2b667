//! Interop with independent implementations, at least 1000 frames each way:
//! - frames from `metaroce gen` have their ICRC recomputed by scapy.contrib.roce;
//! - the same kind of frames are dissected by tshark, field for field equal to `metaroce decode`;
//! - random RoCEv2 frames built by scapy are decoded by the project with the fields scapy was given.
//!
//! These tests need scapy (in `.venv`) and tshark; `scripts/test.sh` installs both and runs them.

use metaroce_frames::capture::PcapWriter;
use metaroce_frames::decode::{to_json, DecodeOptions};
use metaroce_frames::gen::{frame, Kind, Rng};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use tests::{run_python, scratch, tshark_fields, tshark_number};

const FRAMES: usize = 1200;

fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let file = std::fs::File::create(path).expect("create pcap");
    let mut w = PcapWriter::new(std::io::BufWriter::new(file)).expect("pcap header");
    for (i, f) in frames.iter().enumerate() {
        w.write(i as u64 * 1000, f).expect("pcap record");
    }
    w.finish().expect("flush pcap");
}

fn generate(seed: u64, kind: Kind) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed);
    (0..FRAMES).map(|_| frame(&mut rng, kind)).collect()
}

fn scapy_icrcs(pcap: &Path) -> Vec<(u64, u64)> {
    run_python("scapy_icrc.py", &[pcap.to_str().unwrap()])
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("json line");
            assert!(v.get("error").is_none(), "scapy: {l}");
            (v["stored"].as_u64().unwrap(), v["scapy"].as_u64().unwrap())
        })
        .collect()
}

#[test]
#[ignore = "needs scapy in .venv; run by scripts/test.sh"]
fn scapy_agrees_with_the_icrc_of_generated_frames() {
    let dir = scratch("scapy-icrc");
    let frames = generate(11, Kind::Mixed);
    let pcap = dir.join("gen.pcap");
    write_pcap(&pcap, &frames);
    let results = scapy_icrcs(&pcap);
    assert_eq!(results.len(), FRAMES);
    for (i, (stored, scapy)) in results.iter().enumerate() {
        assert_eq!(stored, scapy, "frame {i}: scapy computes a different ICRC");
    }

    // The check can fail: corrupt one covered byte in each of 50 frames and scapy must disagree.
    let corrupt: Vec<Vec<u8>> = frames[..50]
        .iter()
        .map(|f| {
            let mut f = f.clone();
            let at = f.len() - 5; // last byte before the ICRC (payload, pad or a header)
            f[at] ^= 0x10;
            f
        })
        .collect();
    let bad = dir.join("corrupt.pcap");
    write_pcap(&bad, &corrupt);
    let results = scapy_icrcs(&bad);
    assert_eq!(results.len(), 50);
    assert!(results.iter().all(|(stored, scapy)| stored != scapy));
}

/// One field compared between `metaroce decode --json` and tshark.
struct Field {
    json: (&'static str, &'static str),
    tshark: &'static str,
    kind: Conv,
}

#[derive(Clone, Copy)]
enum Conv {
    Num,
    Text,
    /// tshark shows a byte string as bare hex.
    Bytes,
    /// tshark reads the ICRC as a big-endian number; the project stores the little-endian one.
    Swapped,
}

const fn f(json: (&'static str, &'static str), tshark: &'static str, kind: Conv) -> Field {
    Field { json, tshark, kind }
}

const TSHARK_FIELDS: &[Field] = &[
    f(("eth", "src"), "eth.src", Conv::Text),
    f(("eth", "dst"), "eth.dst", Conv::Text),
    f(("vlan", "vid"), "vlan.id", Conv::Num),
    f(("vlan", "pcp"), "vlan.priority", Conv::Num),
    f(("vlan", "dei"), "vlan.dei", Conv::Num),
    f(("ipv4", "src"), "ip.src", Conv::Text),
    f(("ipv4", "dst"), "ip.dst", Conv::Text),
    f(("ipv4", "dscp"), "ip.dsfield.dscp", Conv::Num),
    f(("ipv4", "ecn"), "ip.dsfield.ecn", Conv::Num),
    f(("ipv4", "ttl"), "ip.ttl", Conv::Num),
    f(("ipv4", "ident"), "ip.id", Conv::Num),
    f(("ipv4", "dont_frag"), "ip.flags.df", Conv::Num),
    f(("ipv4", "total_length"), "ip.len", Conv::Num),
    f(("ipv4", "checksum"), "ip.checksum", Conv::Num),
    f(("ipv6", "src"), "ipv6.src", Conv::Text),
    f(("ipv6", "dst"), "ipv6.dst", Conv::Text),
    f(("ipv6", "dscp"), "ipv6.tclass.dscp", Conv::Num),
    f(("ipv6", "ecn"), "ipv6.tclass.ecn", Conv::Num),
    f(("ipv6", "flow_label"), "ipv6.flow", Conv::Num),
    f(("ipv6", "hop_limit"), "ipv6.hlim", Conv::Num),
    f(("ipv6", "payload_length"), "ipv6.plen", Conv::Num),
    f(("udp", "src_port"), "udp.srcport", Conv::Num),
    f(("udp", "dst_port"), "udp.dstport", Conv::Num),
    f(("udp", "length"), "udp.length", Conv::Num),
    f(("bth", "opcode"), "infiniband.bth.opcode", Conv::Num),
    f(("bth", "solicited"), "infiniband.bth.se", Conv::Num),
    f(("bth", "mig_req"), "infiniband.bth.m", Conv::Num),
    f(("bth", "pad_count"), "infiniband.bth.padcnt", Conv::Num),
    f(("bth", "tver"), "infiniband.bth.tver", Conv::Num),
    f(("bth", "pkey"), "infiniband.bth.p_key", Conv::Num),
    f(("bth", "dest_qp"), "infiniband.bth.destqp", Conv::Num),
    f(("bth", "ack_req"), "infiniband.bth.a", Conv::Num),
    f(("bth", "psn"), "infiniband.bth.psn", Conv::Num),
    f(("reth", "va"), "infiniband.reth.va", Conv::Num),
    f(("reth", "rkey"), "infiniband.reth.r_key", Conv::Num),
    f(("reth", "dma_len"), "infiniband.reth.dmalen", Conv::Num),
    // tshark shows the AtomicETH's address and key under the RETH's field names.
    f(("atomic_eth", "va"), "infiniband.reth.va", Conv::Num),
    f(("atomic_eth", "rkey"), "infiniband.reth.r_key", Conv::Num),
    f(
        ("atomic_eth", "swap_add"),
        "infiniband.atomiceth.swapdt",
        Conv::Num,
    ),
    f(
        ("atomic_eth", "compare"),
        "infiniband.atomiceth.cmpdt",
        Conv::Num,
    ),
    f(("aeth", "syndrome"), "infiniband.aeth.syndrome", Conv::Num),
    f(("aeth", "msn"), "infiniband.aeth.msn", Conv::Num),
    f(
        ("atomic_ack_eth", "orig"),
        "infiniband.atomicacketh.origremdt",
        Conv::Num,
    ),
    f(("deth", "qkey"), "infiniband.deth.q_key", Conv::Num),
    f(("deth", "src_qp"), "infiniband.deth.srcqp", Conv::Num),
    f(("immdt", "value"), "infiniband.immdt", Conv::Bytes),
    f(("ieth", "rkey"), "infiniband.ieth", Conv::Bytes),
    f(("icrc", "value"), "infiniband.invariant.crc", Conv::Swapped),
];

fn json_number(v: &Value) -> u64 {
    match v {
        Value::Bool(b) => u64::from(*b),
        other => other
            .as_u64()
            .unwrap_or_else(|| panic!("not a number: {other}")),
    }
}

#[test]
#[ignore = "needs tshark; run by scripts/test.sh"]
fn tshark_dissects_generated_frames_with_equal_fields() {
    let dir = scratch("tshark");
    let mut frames = generate(12, Kind::Rocev2);
    frames.extend(generate(13, Kind::Metaroce).into_iter().take(300));
    let pcap = dir.join("gen.pcap");
    write_pcap(&pcap, &frames);
    let names: Vec<&str> = TSHARK_FIELDS.iter().map(|f| f.tshark).collect();
    let dissected = tshark_fields(&pcap, &names);
    assert_eq!(dissected.len(), frames.len());

    let mut compared = 0usize;
    for (i, (bytes, ts)) in frames.iter().zip(&dissected).enumerate() {
        let ours = to_json(i + 1, bytes, &DecodeOptions::default());
        assert!(ours.get("error").is_none(), "frame {i}: {ours}");
        let opcode = ours["bth"]["opcode"].as_u64().unwrap();
        // tshark 4.0 knows no header past the BTH of a CNP or a vendor opcode, nor their ICRC.
        let bth_only = opcode == 0x81 || opcode >= 0xc0;
        let mut seen: HashMap<&str, bool> = HashMap::new();
        for field in TSHARK_FIELDS {
            let (header, name) = field.json;
            let Some(value) = ours.get(header).and_then(|h| h.get(name)) else {
                continue;
            };
            let past_bth = !matches!(header, "eth" | "vlan" | "ipv4" | "ipv6" | "udp" | "bth");
            let Some(theirs) = ts.get(field.tshark) else {
                assert!(
                    bth_only && past_bth,
                    "frame {i}: tshark shows no {} ({ours})",
                    field.tshark
                );
                continue;
            };
            seen.insert(field.tshark, true);
            let equal = match field.kind {
                Conv::Text => value.as_str() == Some(theirs.as_str()),
                Conv::Num => json_number(value) == tshark_number(theirs),
                Conv::Bytes => json_number(value) == u64::from_str_radix(theirs, 16).unwrap(),
                Conv::Swapped => {
                    (json_number(value) as u32).swap_bytes() == tshark_number(theirs) as u32
                }
            };
            assert!(
                equal,
                "frame {i}: {header}.{name} = {value}, tshark {} = {theirs}",
                field.tshark
            );
            compared += 1;
        }
        // Nothing tshark found may be missing from our decode.
        for name in ts.keys() {
            assert!(
                seen.contains_key(name.as_str()),
                "frame {i}: tshark shows {name}, we do not"
            );
        }
    }
    assert!(
        compared > 20 * frames.len(),
        "only {compared} fields compared"
    );
}

#[test]
#[ignore = "needs scapy in .venv; run by scripts/test.sh"]
fn project_decodes_scapy_frames_with_equal_fields() {
    let dir = scratch("scapy-build");
    let pcap = dir.join("scapy.pcap");
    let jsonl = dir.join("scapy.jsonl");
    run_python(
        "scapy_build.py",
        &[
            &FRAMES.to_string(),
            "21",
            pcap.to_str().unwrap(),
            jsonl.to_str().unwrap(),
        ],
    );
    let (packets, err) = metaroce_frames::capture::read(&std::fs::read(&pcap).unwrap());
    assert!(err.is_none(), "{err:?}");
    let expected: Vec<Value> = std::fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(packets.len(), FRAMES);
    assert_eq!(expected.len(), FRAMES);
    for (i, (p, want)) in packets.iter().zip(&expected).enumerate() {
        let got = to_json(i + 1, &p.data, &DecodeOptions::default());
        assert!(got.get("error").is_none(), "frame {i}: {got}");
        let eq = |ours: &Value, theirs: &Value, what: &str| {
            assert_eq!(
                json_number(ours),
                json_number(theirs),
                "frame {i}: {what}: {got} vs {want}"
            );
        };
        assert_eq!(got["icrc"]["ok"], Value::Bool(true), "frame {i}: {got}");
        eq(&got["icrc"]["value"], &want["icrc"], "icrc");
        assert_eq!(got["eth"]["src"], want["eth_src"]);
        assert_eq!(got["eth"]["dst"], want["eth_dst"]);
        if let Some(v) = want.get("vlan") {
            for k in ["pcp", "dei", "vid"] {
                eq(&got["vlan"][k], &v[k], k);
            }
        } else {
            assert!(got.get("vlan").is_none());
        }
        let ip = if want["ip"] == 4 {
            &got["ipv4"]
        } else {
            &got["ipv6"]
        };
        assert_eq!(ip["src"], want["src"], "frame {i}");
        assert_eq!(ip["dst"], want["dst"], "frame {i}");
        eq(&ip["dscp"], &want["dscp"], "dscp");
        eq(&ip["ecn"], &want["ecn"], "ecn");
        if want["ip"] == 4 {
            eq(&ip["ttl"], &want["ttl"], "ttl");
            eq(&ip["ident"], &want["ident"], "ident");
        } else {
            eq(&ip["hop_limit"], &want["hop_limit"], "hop_limit");
            eq(&ip["flow_label"], &want["flow_label"], "flow_label");
        }
        eq(&got["udp"]["src_port"], &want["sport"], "sport");
        let (b, wb) = (&got["bth"], &want["bth"]);
        eq(&b["opcode"], &want["opcode"], "opcode");
        for (ours, theirs) in [
            ("solicited", "solicited"),
            ("mig_req", "migreq"),
            ("pad_count", "padcount"),
            ("tver", "version"),
            ("pkey", "pkey"),
            ("fecn", "fecn"),
            ("becn", "becn"),
            ("dest_qp", "dqpn"),
            ("ack_req", "ackreq"),
            ("psn", "psn"),
        ] {
            eq(&b[ours], &wb[theirs], ours);
        }
        eq(&got["payload_len"], &want["payload_len"], "payload_len");
        if let Some(r) = want.get("reth") {
            eq(&got["reth"]["va"], &r[0], "reth.va");
            eq(&got["reth"]["rkey"], &r[1], "reth.rkey");
            eq(&got["reth"]["dma_len"], &r[2], "reth.dma_len");
        }
        if let Some(a) = want.get("aeth") {
            eq(&got["aeth"]["syndrome"], &a[0], "aeth.syndrome");
            eq(&got["aeth"]["msn"], &a[1], "aeth.msn");
        }
        if let Some(a) = want.get("atomic_eth") {
            for (k, j) in [("va", 0), ("rkey", 1), ("swap_add", 2), ("compare", 3)] {
                eq(&got["atomic_eth"][k], &a[j], k);
            }
        }
        if let Some(v) = want.get("atomic_ack_eth") {
            eq(&got["atomic_ack_eth"]["orig"], v, "orig");
        }
        if let Some(d) = want.get("deth") {
            eq(&got["deth"]["qkey"], &d[0], "qkey");
            eq(&got["deth"]["src_qp"], &d[1], "src_qp");
        }
        if let Some(v) = want.get("immdt") {
            eq(&got["immdt"]["value"], v, "immdt");
        }
        if let Some(v) = want.get("ieth") {
            eq(&got["ieth"]["rkey"], v, "ieth");
        }
        for header in [
            "reth",
            "aeth",
            "atomic_eth",
            "atomic_ack_eth",
            "deth",
            "immdt",
            "ieth",
        ] {
            assert_eq!(
                got.get(header).is_some(),
                want.get(header).is_some(),
                "frame {i}: {header}"
            );
        }
        assert_eq!(got.get("cnp").is_some(), want["opcode"] == 0x81);
    }
}
