//! Counters of a device and its queue pairs, named as `ethtool -S` users expect, and their
//! publication ([`files`]): a running endpoint writes a snapshot file that `metaroce stats` reads.

mod files;

pub use files::*;

use serde_json::{json, Map, Value};
use std::net::SocketAddr;
use transport_core::conn::{Counters, PathStats};

macro_rules! engine_counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// Device-wide counters of the UDP transport.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct EngineCounters {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl EngineCounters {
            /// Every counter with its name, in a fixed order.
            pub fn named(&self) -> Vec<(&'static str, u64)> {
                vec![ $( (stringify!($name), self.$name), )* ]
            }
        }
    };
}

engine_counters! {
    /// Datagrams sent.
    tx_packets,
    /// Bytes of datagrams sent (BTH to ICRC).
    tx_bytes,
    /// Send system calls.
    tx_syscalls,
    /// Sends that carried several datagrams (UDP GSO).
    tx_gso_batches,
    /// Datagrams staged with their payload left in its region, for the send call to read there
    /// (`DeviceConfig::copy_send` off; a route that cannot segment makes the engine join such a
    /// run before sending it datagram by datagram, and a failed send drops it, as any other).
    tx_in_place,
    /// Times GSO was turned off because the route could not segment.
    tx_gso_disabled,
    /// Datagrams the kernel refused to send (buffer full or error); the core retransmits them.
    tx_errors,
    /// Path source ports held by another process: the path went out from another free port.
    tx_port_fallback,
    /// Send sockets and staging buffers of path ports no connection used any more (a failed
    /// path moves to a new port), closed and freed.
    tx_paths_dropped,
    /// Transmissions whose payload was not in a live region (a bug if ever non-zero).
    tx_bad_local,
    /// Datagrams received.
    rx_packets,
    /// Bytes of datagrams received.
    rx_bytes,
    /// Receive system calls that returned data.
    rx_syscalls,
    /// Receive buffers that held several coalesced datagrams (UDP GRO).
    rx_gro_batches,
    /// Datagrams marked Congestion Experienced.
    rx_ecn_ce,
    /// Datagrams too short to name a queue pair.
    rx_drop_runt,
    /// Datagrams for a queue pair this device does not have.
    rx_drop_unknown_qp,
    /// Datagrams for a queue pair not yet connected.
    rx_drop_not_connected,
    /// Datagrams from an address that is not the queue pair's peer.
    rx_drop_wrong_peer,
    /// Placements outside a live region (a bug if ever non-zero; nothing was written).
    rx_drop_bad_place,
    /// Receive system call failures.
    rx_errors,
    /// Rounds of the engine: each checks the timers and reads the sockets once, then sleeps
    /// on them if nothing happened and its caller may wait. A spinning end runs hundreds of
    /// thousands a second; an idle one asleep runs one per timer or per 10 ms wait slice.
    rounds,
    /// Rounds of the engine that started more than 0.5 ms later than it asked to run (this host
    /// gave it no CPU): the connections' timers restarted.
    host_stalls,
    /// With the AF_XDP datapath (`--xdp`): datagrams that arrived through its socket.
    xdp_rx_frames,
    /// Frames the AF_XDP socket handed over that were no IPv4 UDP datagram to this end's
    /// address and port (dropped).
    xdp_rx_dropped,
    /// Datagrams sent through the AF_XDP socket.
    xdp_tx_frames,
    /// Calls that asked the kernel to send the AF_XDP socket's frames.
    xdp_tx_kicks,
    /// Datagrams the AF_XDP socket had no buffer or ring room for (lost: the connection
    /// repairs them, as after a full socket buffer).
    xdp_tx_no_room,
    /// Datagrams sent through the UDP socket instead, their destination having no next-hop
    /// MAC in the kernel's tables yet (or being this host).
    xdp_tx_via_socket,
    /// Receive queues of the interface with an AF_XDP socket of the datapath (one per queue, up
    /// to 64).
    xdp_queues,
    /// Of those, the queues whose socket has handed over a datagram (how the NIC spread them).
    xdp_rx_queues_used,
    /// Frames for the datapath the kernel dropped before its RX rings (a ring full, no free
    /// buffer: the end read too slowly), as the sockets' statistics count them.
    xdp_rx_kernel_dropped,
}

/// One queue pair's counters and paths.
#[derive(Debug, Clone)]
pub struct QpSnapshot {
    /// Local queue pair number.
    pub qpn: u32,
    /// The peer's data address.
    pub peer: Option<SocketAddr>,
    /// Connection counters.
    pub counters: Counters,
    /// Per path.
    pub paths: Vec<PathStats>,
    /// The rate controller's outputs.
    pub rate: transport_core::conn::RateStatus,
    /// What the connection's datagrams carry in the ICRC field and whether arrivals' are
    /// checked (docs/PROTOCOL.md 4.1).
    pub icrc: transport_core::conn::IcrcMode,
}

/// The name of an ICRC mode in the statistics.
pub fn icrc_mode_name(m: transport_core::conn::IcrcMode) -> &'static str {
    match m {
        transport_core::conn::IcrcMode::Full => "full",
        transport_core::conn::IcrcMode::SendOnly => "send-only",
        transport_core::conn::IcrcMode::Off => "off",
    }
}

/// The connection counters with their `ethtool -S` style names.
pub fn connection_named(c: &Counters) -> Vec<(&'static str, u64)> {
    vec![
        ("tx_data_packets", c.data_sent),
        ("retransmits", c.retransmitted),
        ("rnr_retries", c.rnr_retries),
        ("requests_waited", c.requests_waited),
        ("acked", c.acked),
        ("sacked", c.sacked),
        ("lost_by_sack", c.lost_by_sack),
        ("lost_by_timeout", c.lost_by_timeout),
        ("overdue_probes", c.overdue_probes),
        ("peer_silent_waits", c.peer_silent_waits),
        ("acks_sent", c.acks_sent),
        ("acks_piggybacked", c.acks_piggybacked),
        ("acks_piggyback_received", c.acks_piggyback_received),
        ("nacks_sent", c.nacks_sent),
        ("nacks_received", c.nacks_received),
        ("nacks_resent", c.nacks_resent),
        ("refusals_confirmed", c.refusals_confirmed),
        ("rx_data_packets", c.data_received),
        ("rx_bytes_placed", c.bytes_placed),
        ("rx_duplicates", c.duplicates),
        ("rx_drop_malformed", c.drop_malformed),
        ("rx_drop_bad_icrc", c.drop_bad_icrc),
        ("rx_drop_wrong_qp", c.drop_wrong_qp),
        ("rx_drop_wrong_pkey", c.drop_wrong_pkey),
        ("rx_drop_out_of_window", c.drop_out_of_window),
        ("rx_drop_unknown_path", c.drop_unknown_path),
        ("rx_drop_unsupported_opcode", c.drop_unsupported_opcode),
        ("rx_drop_refusals_full", c.drop_refusals_full),
        ("rx_drop_wrong_port", c.drop_wrong_port),
        ("rx_drop_bad_ack", c.drop_bad_ack),
        ("rx_drop_bad_nack", c.drop_bad_nack),
        ("rx_drop_bad_probe", c.drop_bad_probe),
        ("access_violations", c.access_violations),
        ("ecn_ce_received", c.ecn_ce_received),
        ("ecn_marks_echoed", c.ecn_marks_echoed),
        ("cwnd_cuts", c.cwnd_cuts),
        ("cnps_sent", c.cnps_sent),
        ("cnps_received", c.cnps_received),
        ("probes_sent", c.probes_sent),
        ("path_failures", c.path_failures),
    ]
}

/// A snapshot as JSON.
pub fn to_json(pid: u32, name: &str, engine: &EngineCounters, qps: &[QpSnapshot]) -> Value {
    let mut dev = Map::new();
    for (k, v) in engine.named() {
        dev.insert(k.into(), v.into());
    }
    let qps: Vec<Value> = qps
        .iter()
        .map(|q| {
            let mut m = Map::new();
            for (k, v) in connection_named(&q.counters) {
                m.insert(k.into(), v.into());
            }
            let paths: Vec<Value> = q
                .paths
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    json!({
                        "path": i,
                        "src_port": p.src_port,
                        "state": if p.active { "active" } else { "probing" },
                        "tx_packets": p.sent,
                        "retransmits": p.retransmitted,
                        "acked": p.acked,
                        "lost": p.lost,
                        "timeouts": p.timeouts,
                        "in_flight": p.in_flight,
                        "rtt_min_ns": p.rtt_min,
                        "rtt_smoothed_ns": p.rtt_smoothed,
                        "ecn_marks": p.ecn_marks,
                        "cwnd": p.cwnd,
                        "cwnd_cuts": p.cwnd_cuts,
                        "failures": p.failures,
                    })
                })
                .collect();
            json!({
                "qpn": q.qpn,
                "peer": q.peer.map(|p| p.to_string()),
                "icrc": icrc_mode_name(q.icrc),
                "counters": m,
                "rate": {
                    "rate_mbps": q.rate.rate_mbps,
                    "connection_window": q.rate.connection_window,
                    "hint_received_mbps": q.rate.hint_received_mbps,
                    "hint_sent_mbps": q.rate.hint_sent_mbps,
                },
                "paths": paths,
            })
        })
        .collect();
    json!({ "pid": pid, "name": name, "device": dev, "qps": qps })
}

/// `ethtool -S` style text of a JSON snapshot.
pub fn to_text(v: &Value) -> String {
    let mut s = String::new();
    let pid = v["pid"].as_u64().unwrap_or(0);
    let name = v["name"].as_str().unwrap_or("");
    s.push_str(&format!("{name} (pid {pid}) statistics:\n"));
    if let Some(dev) = v["device"].as_object() {
        for (k, val) in dev {
            s.push_str(&format!("     {k}: {val}\n"));
        }
    }
    for q in v["qps"].as_array().into_iter().flatten() {
        let qpn = q["qpn"].as_u64().unwrap_or(0);
        let peer = q["peer"].as_str().unwrap_or("-");
        let icrc = q["icrc"].as_str().unwrap_or("?");
        s.push_str(&format!("   qp {qpn:#08x} peer {peer} icrc {icrc}:\n"));
        if let Some(c) = q["counters"].as_object() {
            for (k, val) in c {
                s.push_str(&format!("     {k}: {val}\n"));
            }
        }
        for p in q["paths"].as_array().into_iter().flatten() {
            s.push_str(&format!(
                "     path{}: port {} {} tx {} retx {} lost {} rtt_min {:.1}us srtt {:.1}us ecn {} cwnd {} cuts {}\n",
                p["path"],
                p["src_port"],
                p["state"].as_str().unwrap_or("?"),
                p["tx_packets"],
                p["retransmits"],
                p["lost"],
                p["rtt_min_ns"].as_f64().unwrap_or(0.0) / 1000.0,
                p["rtt_smoothed_ns"].as_f64().unwrap_or(0.0) / 1000.0,
                p["ecn_marks"],
                p["cwnd"],
                p["cwnd_cuts"],
            ));
        }
    }
    s
}
