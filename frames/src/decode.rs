//! Turning frames into JSON objects (one key per header, fields in snake_case after the
//! specification, numbers as JSON numbers) and into readable text.

use serde_json::{json, Map, Value};
use transport_core::wire::metaroce::{MrAckRepr, PiggyAck};
use transport_core::wire::{
    parse_with, AckSyndrome, IcrcCheck, IpRepr, ParseOptions, Parsed, ROCEV2_PORT,
};

/// Options of the decoder.
#[derive(Debug, Clone, Copy)]
pub struct DecodeOptions {
    /// The RoCEv2 UDP port.
    pub port: u16,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions { port: ROCEV2_PORT }
    }
}

/// Decodes one frame into a JSON object; a frame that cannot be parsed yields `{"error": ...}`.
/// The object always starts with `frame` (the 1-based index) and `len`.
pub fn to_json(index: usize, bytes: &[u8], opts: &DecodeOptions) -> Value {
    let popts = ParseOptions {
        port: opts.port,
        icrc: IcrcCheck::Report,
        ..ParseOptions::default()
    };
    let mut obj = Map::new();
    obj.insert("frame".into(), json!(index));
    obj.insert("len".into(), json!(bytes.len()));
    match parse_with(bytes, &popts) {
        Ok(p) => fill(&mut obj, &p, bytes),
        Err(e) => {
            obj.insert("error".into(), json!(e.to_string()));
        }
    }
    Value::Object(obj)
}

fn be16(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .map_or(0, |s| u16::from_be_bytes([s[0], s[1]]))
}

fn fill(obj: &mut Map<String, Value>, p: &Parsed<'_>, raw: &[u8]) {
    let r = &p.repr;
    obj.insert(
        "eth".into(),
        json!({"dst": r.eth.dst.to_string(), "src": r.eth.src.to_string(), "ethertype": r.eth.ethertype}),
    );
    if let Some(v) = r.eth.vlan {
        obj.insert(
            "vlan".into(),
            json!({"pcp": v.pcp, "dei": v.dei, "vid": v.vid}),
        );
    }
    let ip_at = r.eth.header_len();
    let udp_at = ip_at + r.ip.header_len();
    match &r.ip {
        IpRepr::V4(v4) => {
            obj.insert(
                "ipv4".into(),
                json!({
                    "ihl": r.ip.header_len() / 4,
                    "dscp": v4.dscp,
                    "ecn": v4.ecn.bits(),
                    "total_length": be16(raw, ip_at + 2),
                    "ident": v4.ident,
                    "dont_frag": v4.dont_frag,
                    "ttl": v4.ttl,
                    "protocol": 17,
                    "checksum": be16(raw, ip_at + 10),
                    "src": v4.src.to_string(),
                    "dst": v4.dst.to_string(),
                    "options_len": v4.options.len(),
                }),
            );
        }
        IpRepr::V6(v6) => {
            obj.insert(
                "ipv6".into(),
                json!({
                    "dscp": v6.dscp,
                    "ecn": v6.ecn.bits(),
                    "flow_label": v6.flow_label,
                    "payload_length": be16(raw, ip_at + 4),
                    "next_header": 17,
                    "hop_limit": v6.hop_limit,
                    "src": v6.src.to_string(),
                    "dst": v6.dst.to_string(),
                }),
            );
        }
    }
    obj.insert(
        "udp".into(),
        json!({
            "src_port": r.udp.src_port,
            "dst_port": r.udp.dst_port,
            "length": be16(raw, udp_at + 4),
            "checksum": be16(raw, udp_at + 6),
        }),
    );
    let b = &r.bth;
    obj.insert(
        "bth".into(),
        json!({
            "opcode": b.opcode.to_u8(),
            "opcode_name": b.opcode.to_string(),
            "solicited": b.solicited,
            "mig_req": b.mig_req,
            "pad_count": b.pad_count,
            "tver": b.tver,
            "pkey": b.pkey,
            "fecn": b.fecn,
            "becn": b.becn,
            "dest_qp": b.dest_qp.get(),
            "ack_req": b.ack_req,
            "psn": b.psn.get(),
        }),
    );
    let e = &r.ext.fields();
    if let Some(d) = e.mr_data {
        obj.insert(
            "mr_data".into(),
            json!({
                "retransmit": d.retransmit,
                "ack": d.ack,
                "path_id": d.path_id,
                "stream_id": d.stream_id,
                "path_seq": d.path_seq,
                "msn": d.msn,
                "msg_offset": d.msg_offset,
                "msg_len": d.msg_len,
                "timestamp": d.timestamp,
            }),
        );
    }
    if let Some(d) = e.deth {
        obj.insert(
            "deth".into(),
            json!({"qkey": d.qkey, "src_qp": d.src_qp.get()}),
        );
    }
    if let Some(m) = e.mr_remote {
        obj.insert("mr_remote".into(), json!({"va": m.va, "rkey": m.rkey}));
    }
    if let Some(x) = e.reth {
        obj.insert(
            "reth".into(),
            json!({"va": x.va, "rkey": x.rkey, "dma_len": x.dma_len}),
        );
    }
    if let Some(a) = e.atomic_eth {
        obj.insert(
            "atomic_eth".into(),
            json!({"va": a.va, "rkey": a.rkey, "swap_add": a.swap_add, "compare": a.compare}),
        );
    }
    if let Some(a) = e.aeth {
        let mut m = Map::new();
        m.insert("syndrome".into(), json!(a.syndrome));
        m.insert("msn".into(), json!(a.msn));
        match a.kind() {
            AckSyndrome::Ack { credit } => {
                m.insert("kind".into(), json!("ack"));
                m.insert("credit".into(), json!(credit));
            }
            AckSyndrome::RnrNak { timer } => {
                m.insert("kind".into(), json!("rnr_nak"));
                m.insert("rnr_timer".into(), json!(timer));
            }
            AckSyndrome::Nak(code) => {
                m.insert("kind".into(), json!("nak"));
                m.insert("nak_code".into(), json!(a.syndrome & 0x1f));
                m.insert("nak_reason".into(), json!(code.name()));
            }
            AckSyndrome::Reserved(_) => {
                m.insert("kind".into(), json!("reserved"));
            }
        }
        obj.insert("aeth".into(), Value::Object(m));
    }
    if let Some(a) = e.atomic_ack_eth {
        obj.insert("atomic_ack_eth".into(), json!({"orig": a.orig}));
    }
    if let Some(v) = e.immdt {
        obj.insert("immdt".into(), json!({"value": v}));
    }
    if let Some(v) = e.ieth {
        obj.insert("ieth".into(), json!({"rkey": v}));
    }
    if e.cnp {
        obj.insert("cnp".into(), json!({"reserved_len": 16}));
    }
    if let Some(a) = e.mr_ack {
        obj.insert("mr_ack".into(), ack_json(&a));
    }
    if e.mr_data.is_some_and(|d| d.ack) {
        // The body opens with the acknowledgement riding along; `payload_len` counts it.
        let v = match PiggyAck::parse(r.payload) {
            Ok((p, _)) => {
                let mut v = ack_json(&p.ack);
                v["cum_psn"] = json!(p.cum_psn.get());
                v
            }
            Err(err) => json!({ "error": err.to_string() }),
        };
        obj.insert("mr_piggyback_ack".into(), v);
    }
    if let Some(n) = e.mr_nack {
        obj.insert(
            "mr_nack".into(),
            json!({
                "path_id": n.path_id,
                "reason": n.reason.to_u8(),
                "reason_name": n.reason.name(),
                "path_seq": n.path_seq,
                "stream_id": n.stream_id,
                "msn": n.msn,
            }),
        );
    }
    if let Some(pr) = e.mr_probe {
        obj.insert(
            "mr_probe".into(),
            json!({
                "path_id": pr.path_id,
                "probe_seq": pr.probe_seq,
                "timestamp": pr.timestamp,
                "ts_echo": pr.ts_echo,
            }),
        );
    }
    obj.insert("payload_len".into(), json!(r.payload.len()));
    let mut icrc = Map::new();
    icrc.insert("value".into(), json!(p.icrc));
    if let Some(c) = p.icrc_computed {
        icrc.insert("computed".into(), json!(c));
    }
    icrc.insert("ok".into(), json!(p.icrc_ok().unwrap_or(false)));
    obj.insert("icrc".into(), Value::Object(icrc));
    if p.trailer_len > 0 {
        obj.insert("trailer_len".into(), json!(p.trailer_len));
    }
}

fn ack_json(a: &MrAckRepr) -> Value {
    let sack: String = a.sack.iter().map(|b| format!("{b:02x}")).collect();
    json!({
        "ece": a.ece,
        "refusals": a.refusals,
        "path_id": a.path_id,
        "ce_count": a.ce_count,
        "cum_seq": a.cum_seq,
        "ts_echo": a.ts_echo,
        "ack_delay": a.ack_delay,
        "rate_hint": a.rate_hint,
        "sack": sack,
        "sacked": a.sack.iter().map(|b| b.count_ones()).sum::<u32>(),
    })
}

/// Formats a decoded object as readable text: a line for the frame, then a line per header.
pub fn to_text(v: &Value) -> String {
    let mut out = String::new();
    let Value::Object(obj) = v else { return out };
    let index = obj.get("frame").cloned().unwrap_or(Value::Null);
    match obj.get("len") {
        Some(len) => out.push_str(&format!("frame {index}: {len} bytes\n")),
        None => out.push_str(&format!("frame {index}:\n")),
    }
    if let Some(Value::String(e)) = obj.get("error") {
        out.push_str(&format!("  error: {e}\n"));
        return out;
    }
    for (key, value) in obj {
        match (key.as_str(), value) {
            ("frame" | "len", _) => {}
            (_, Value::Object(fields)) => {
                out.push_str(&format!("  {:<15}", label(key)));
                for (name, field) in fields {
                    out.push_str(&format!(" {name}={}", show(key, name, field)));
                }
                out.push('\n');
            }
            (_, other) => out.push_str(&format!("  {:<15} {other}\n", label(key))),
        }
    }
    out
}

fn label(key: &str) -> &str {
    match key {
        "eth" => "Ethernet",
        "vlan" => "802.1Q",
        "ipv4" => "IPv4",
        "ipv6" => "IPv6",
        "udp" => "UDP",
        "bth" => "BTH",
        "reth" => "RETH",
        "aeth" => "AETH",
        "immdt" => "ImmDt",
        "ieth" => "IETH",
        "deth" => "DETH",
        "atomic_eth" => "AtomicETH",
        "atomic_ack_eth" => "AtomicAckETH",
        "cnp" => "CNP",
        "mr_data" => "MR data",
        "mr_remote" => "MR remote",
        "mr_ack" => "MR ACK",
        "mr_piggyback_ack" => "MR ACK (carried)",
        "mr_nack" => "MR NACK",
        "mr_probe" => "MR probe",
        "payload_len" => "payload bytes",
        "icrc" => "ICRC",
        "trailer_len" => "trailer bytes",
        other => other,
    }
}

/// Hex for the fields that are read as hex (keys, addresses, QPNs, checksums); decimal otherwise.
fn show(header: &str, name: &str, v: &Value) -> String {
    let hex = matches!(
        (header, name),
        (
            _,
            "va" | "rkey" | "qkey" | "pkey" | "dest_qp" | "src_qp" | "checksum" | "ethertype"
        ) | ("icrc", "value" | "computed")
            | ("bth", "opcode")
            | ("aeth", "syndrome")
            | ("immdt", "value")
    );
    match v {
        Value::Number(n) if hex => n
            .as_u64()
            .map_or_else(|| n.to_string(), |x| format!("0x{x:x}")),
        Value::String(s) if s.contains(' ') => format!("{s:?}"),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
