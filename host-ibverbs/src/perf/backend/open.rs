//! Opening an endpoint on either backend, and the queue pairs a peer names in the exchange.

use super::*;

/// A peer's queue pair as the exchange names it: `qpn:psn`, and over UDP `qpn:psn:path_seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PeerQp {
    pub(super) qpn: u32,
    pub(super) psn: u32,
    pub(super) path_seq: Option<u32>,
}

pub(super) fn decode_qps(s: &str) -> Result<Vec<PeerQp>, OobError> {
    s.split(',')
        .map(|p| {
            let mut it = p.split(':');
            let mut num = |what: &str| {
                it.next()
                    .and_then(|x| x.parse::<u32>().ok())
                    .ok_or_else(|| OobError::Field(format!("{what} of qp {p:?}")))
            };
            let (qpn, psn) = (num("qpn")?, num("psn")?);
            let path_seq = match it.next() {
                None => None,
                Some(x) => Some(
                    x.parse()
                        .map_err(|_| OobError::Field(format!("path sequence of qp {p:?}")))?,
                ),
            };
            if qpn > 0x00ff_ffff || psn > 0x00ff_ffff || it.next().is_some() {
                return Err(OobError::Field(format!("qp {p:?}")));
            }
            Ok(PeerQp { qpn, psn, path_seq })
        })
        .collect()
}

/// Whether this end runs a latency test spinning (not `-e`).
pub(crate) fn spinning_latency(cfg: &PerfConfig) -> bool {
    cfg.test.is_latency() && !cfg.use_event
}

/// Whether a phase of `size`-byte messages wants arrivals coalesced (UDP GRO): always, but in a
/// spinning latency test only when a message takes more than one packet of `payload` bytes,
/// this end's (a ping has nothing to coalesce, and GRO costs it about 0.1 us a hop on loopback;
/// a message of many packets arrives in one receive call with it, in many without); never
/// against `--no-gro`.
pub(crate) fn phase_gro(cfg: &PerfConfig, size: usize, payload: u32) -> bool {
    cfg.gro && (!spinning_latency(cfg) || size > payload as usize)
}

/// The UDP device a test's end opens on `local_ip`.
pub(crate) fn device_config(cfg: &PerfConfig, local_ip: IpAddr) -> udp::DeviceConfig {
    let mut dc = udp::DeviceConfig::new(local_ip);
    dc.port = cfg.data_port;
    dc.busy_poll = cfg.busy_poll;
    dc.gso = cfg.gso;
    dc.copy_send = cfg.copy_send;
    // A latency test's ends spin (unless -e): each datagram is read within a round of its
    // arrival, so the kernel's arrival time buys nothing there, and it costs about 0.1 us a hop
    // on loopback (docs/BENCHMARKS.md); so does GRO for a ping, which such a device starts
    // without (a phase of longer messages turns it on: `Endpoint::prepare_phase`).
    dc.gro = cfg.gro && !spinning_latency(cfg);
    dc.arrival_times = !spinning_latency(cfg);
    dc.xdp = cfg.xdp;
    dc.batch = cfg.batch;
    dc.pcap = cfg.pcap.clone();
    dc.line_rate_mbps = cfg.line_rate_mbps;
    dc.share_table = cfg.share_table.clone();
    dc.traffic_class = cfg.tclass;
    dc.priority = cfg.sl;
    dc
}

pub(super) fn open_udp(
    cfg: &PerfConfig,
    local_ip: IpAddr,
    fallback_port: bool,
) -> Result<Endpoint, PerfError> {
    let mut dc = device_config(cfg, local_ip);
    let ctx = match udp::Context::open(&dc) {
        Ok(c) => c,
        Err(e)
            if fallback_port
                && matches!(&e.kind, udp::ErrorKind::Io { source, .. }
                    if source.kind() == std::io::ErrorKind::AddrInUse) =>
        {
            // Both ends on one host: the server holds the port, take any other.
            dc.port = 0;
            udp::Context::open(&dc)?
        }
        Err(e) => return Err(e.into()),
    };
    let mtu = crate::perf::payload_with_peer(
        crate::perf::packet_mtu(cfg.mtu, local_ip)?,
        cfg.peer_payload,
    );
    let (window, start_window) = crate::perf::windows(cfg, mtu);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq();
    let attr = udp::QpAttr {
        paths: cfg.paths,
        mtu,
        window_per_path: window,
        start_window_per_path: start_window,
        icrc: cfg.icrc.unwrap_or_default(),
        spray_burst: cfg.spray_burst,
        max_rd_atomic: cfg.outs,
        cc: cfg.cc.algorithm(
            if cfg.line_rate_mbps > 0 {
                cfg.line_rate_mbps
            } else {
                crate::perf::DEFAULT_LINE_MBPS
            },
            window,
        ),
        ..udp::QpAttr::default()
    };
    let qps = (0..cfg.qps)
        .map(|_| pd.create_qp(&cq, &attr))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Endpoint {
        be: Be::Udp(UdpEp {
            ctx,
            pd,
            cq,
            qps,
            // Latency tests spin, as perftest's do: a sleeping end takes tens of microseconds to
            // wake (and the scheduler then tends to put both ends on one CPU), which is the
            // figure they measure. Bandwidth tests adapt.
            wait: if cfg.use_event {
                Wait::Event
            } else if cfg.busy_poll || cfg.test.is_latency() {
                Wait::Spin
            } else {
                Wait::Adaptive
            },
            idle_since: std::cell::Cell::new(None),
            cpu_wait: Default::default(),
            payload: mtu,
        }),
    })
}

#[cfg(not(feature = "verbs"))]
pub(super) fn open_verbs(_cfg: &PerfConfig) -> Result<Endpoint, PerfError> {
    Err(PerfError::Invalid(
        "this build has no verbs backend (build with --features verbs); use --transport udp".into(),
    ))
}

#[cfg(feature = "verbs")]
pub(super) fn open_verbs(cfg: &PerfConfig) -> Result<Endpoint, PerfError> {
    use crate::gids;
    use crate::verbs;
    let ctx = verbs::Context::open(cfg.device.as_deref())?;
    let dev = ctx.name().to_string();
    let port = cfg.ib_port;
    let da = ctx.query()?;
    if port == 0 || port > da.phys_port_cnt {
        return Err(PerfError::Invalid(format!(
            "{dev} has {} port(s); -i {port} names none",
            da.phys_port_cnt
        )));
    }
    if cfg.test.is_atomic() && !da.has_atomics() {
        return Err(PerfError::Invalid(format!(
            "{dev} does not do remote atomics (its atomic_cap is IBV_ATOMIC_NONE)"
        )));
    }
    let pa = ctx.query_port(port)?;
    if pa.link_layer != verbs::LINK_LAYER_ETHERNET {
        return Err(PerfError::Invalid(format!(
            "port {port} of {dev} is {}: RoCE needs an Ethernet port (an InfiniBand port is \
             addressed by LID, which this transport does not do)",
            if pa.link_layer == 1 {
                "InfiniBand"
            } else {
                "not Ethernet"
            }
        )));
    }
    if pa.state != 4 {
        return Err(PerfError::Invalid(format!(
            "port {port} of {dev} is {} (not ACTIVE; see `ip link` for its interface)",
            verbs::port_state_name(pa.state)
        )));
    }
    // The GID: the one -x names, else the best RoCE v2 one, as perftest picks it; its type from
    // sysfs (rdma-sys does not bind ibv_query_gid_ex).
    let sysfs_port = gids::read_port(
        &std::path::Path::new(gids::SYSFS_ROOT)
            .join(&dev)
            .join("ports")
            .join(port.to_string()),
        port,
    )
    .ok();
    let prefer_v6 = cfg.server.as_deref().is_some_and(|s| s.contains(':'));
    let gid_index = match (cfg.gid_index, &sysfs_port) {
        (Some(i), _) => i,
        (None, Some(p)) => gids::best_gid(p, prefer_v6)
            .map(|g| g.index)
            .ok_or_else(|| {
                PerfError::Invalid(format!(
                    "port {port} of {dev} has no GID in use (does its interface have an address?)"
                ))
            })?,
        (None, None) => {
            return Err(PerfError::Invalid(format!(
                "cannot read the GID table of {dev} port {port} in {}; name a GID index with -x",
                gids::SYSFS_ROOT
            )))
        }
    };
    let gid = ctx.query_gid(port, i32::from(gid_index))?;
    if gid == [0; 16] {
        return Err(PerfError::Invalid(format!(
            "GID index {gid_index} of {dev} port {port} is empty (`metaroce devices` lists the \
             used ones)"
        )));
    }
    let kind = sysfs_port
        .as_ref()
        .and_then(|p| p.gids.iter().find(|g| g.index == gid_index))
        .and_then(|g| g.kind);
    if cfg.gid_index.is_none() {
        eprintln!(
            "metaroce: {dev} port {port}: GID index {gid_index} ({}, {})",
            std::net::Ipv6Addr::from(gid),
            kind.map_or("type unknown", gids::GidType::name)
        );
    }
    // The MTU this end offers: the port's, or the smaller one -m asks for.
    let active = verbs_addr::mtu_bytes(pa.active_mtu).unwrap_or(1024);
    let mtu = match cfg.mtu {
        None => active,
        Some(m) if verbs_addr::mtu_enum(m).is_some() => m.min(active),
        Some(_) => {
            return Err(PerfError::Invalid(
                "-m must be 256, 512, 1024, 2048 or 4096 with verbs".into(),
            ))
        }
    };
    // Queues within the device's limits, said by name.
    let depth = cfg.tx_depth.max(512);
    let cq_depth = u64::from(depth) * 2 * u64::from(cfg.qps);
    for (what, want, max) in [
        ("queue pairs (-q)", u64::from(cfg.qps), da.max_qp),
        (
            "work requests per queue (-t)",
            u64::from(depth),
            da.max_qp_wr,
        ),
        (
            "completion queue entries (-t x 2 x -q)",
            cq_depth,
            da.max_cqe,
        ),
    ] {
        if want > max.max(0) as u64 {
            return Err(PerfError::Invalid(format!(
                "{dev} allows {max} {what}; this run needs {want}"
            )));
        }
    }
    // Remote atomics only for the atomic tests (and those are refused above on a device
    // without them); the other tests grant what they use.
    let mut access = super::ALL_ACCESS;
    if !cfg.test.is_atomic() {
        access = access.without(crate::udp::Access::REMOTE_ATOMIC);
    }
    let dest_rd_atomic = da.max_qp_rd_atom.clamp(1, 16) as u8;
    let rd_atomic = da.max_qp_init_rd_atom.min(i32::from(cfg.outs)).clamp(1, 16) as u8;
    let pd = ctx.alloc_pd()?;
    let cq = if cfg.use_event {
        ctx.create_cq_with_events(cq_depth as i32)?
    } else {
        ctx.create_cq(cq_depth as i32)?
    };
    let qps = (0..cfg.qps)
        .map(|_| pd.create_qp(&cq, depth))
        .collect::<Result<Vec<_>, _>>()?;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.subsec_nanos());
    let psns = (0..cfg.qps)
        .map(|i| (seed.wrapping_mul(2_654_435_761).wrapping_add(i * 7919)) & 0xff_ffff)
        .collect();
    Ok(Endpoint {
        be: Be::Verbs(VerbsEp {
            qps,
            cq,
            pd,
            ctx,
            port,
            gid_index,
            local: verbs_addr::VerbsAddr { gid, kind, mtu },
            tclass: cfg.tclass,
            sl: cfg.sl,
            rd_atomic,
            dest_rd_atomic,
            access,
            psns,
            wcs: std::cell::RefCell::new(Vec::with_capacity(16)),
            use_event: cfg.use_event,
        }),
    })
}
