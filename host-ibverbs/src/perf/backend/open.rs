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

pub(super) fn open_udp(
    cfg: &PerfConfig,
    local_ip: IpAddr,
    fallback_port: bool,
) -> Result<Endpoint, PerfError> {
    let mut dc = udp::DeviceConfig::new(local_ip);
    dc.port = cfg.data_port;
    dc.busy_poll = cfg.busy_poll;
    dc.gso = cfg.gso;
    dc.gro = cfg.gro;
    dc.batch = cfg.batch;
    dc.pcap = cfg.pcap.clone();
    dc.line_rate_mbps = cfg.line_rate_mbps;
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
    let mtu = crate::perf::packet_mtu(cfg.mtu, local_ip)?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq();
    let attr = udp::QpAttr {
        paths: cfg.paths,
        mtu,
        window_per_path: cfg.window,
        icrc: cfg.icrc,
        cc: cfg.cc.algorithm(
            if cfg.line_rate_mbps > 0 {
                cfg.line_rate_mbps
            } else {
                crate::perf::DEFAULT_LINE_MBPS
            },
            cfg.window,
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
    use crate::verbs;
    let ctx = verbs::Context::open(cfg.device.as_deref())?;
    let port = cfg.ib_port;
    let pa = ctx.query_port(port)?;
    if pa.state != 4 {
        return Err(PerfError::Invalid(format!(
            "port {port} of {} is not active (state {})",
            ctx.name(),
            pa.state
        )));
    }
    let gid = ctx.query_gid(port, i32::from(cfg.gid_index))?;
    if gid == [0; 16] {
        return Err(PerfError::Invalid(format!(
            "GID index {} of {} port {port} is empty (see `show_gids`; RoCEv2 GIDs are often 1 or 3)",
            cfg.gid_index,
            ctx.name()
        )));
    }
    // The path MTU: the one asked for (bytes) if the port allows it, else the port's.
    let mtu = match cfg.mtu {
        None => pa.active_mtu,
        Some(m) => {
            let e = match m {
                256 => 1,
                512 => 2,
                1024 => 3,
                2048 => 4,
                4096 => 5,
                _ => {
                    return Err(PerfError::Invalid(
                        "-m must be 256, 512, 1024, 2048 or 4096 with verbs".into(),
                    ))
                }
            };
            e.min(pa.active_mtu)
        }
    };
    let depth = cfg.tx_depth.max(512);
    let pd = ctx.alloc_pd()?;
    let cq_depth = (depth * 2 * cfg.qps).min(1 << 20) as i32;
    let cq = if cfg.use_event {
        ctx.create_cq_with_events(cq_depth)?
    } else {
        ctx.create_cq(cq_depth)?
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
            gid_index: cfg.gid_index,
            gid,
            mtu,
            psns,
            wcs: std::cell::RefCell::new(Vec::with_capacity(16)),
            use_event: cfg.use_event,
        }),
    })
}
