//! Two devices on loopback in one thread, driven alternately.

use super::*;
use crate::udp::stats::EngineCounters;
use std::net::Ipv4Addr;

struct Side {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
}

fn side_with(change: impl FnOnce(&mut DeviceConfig)) -> Side {
    let mut cfg = DeviceConfig::new(IpAddr::V4(Ipv4Addr::LOCALHOST));
    cfg.port = 0;
    change(&mut cfg);
    let ctx = Context::open(&cfg).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq();
    Side { ctx, pd, cq }
}

fn side() -> Side {
    side_with(|_| {})
}

fn pair(attr: &QpAttr) -> (Side, QueuePair, Side, QueuePair) {
    pair_with(attr, |_| {})
}

/// Two connected devices opened with `change` made to the default settings.
fn pair_with(
    attr: &QpAttr,
    change: impl Fn(&mut DeviceConfig),
) -> (Side, QueuePair, Side, QueuePair) {
    let a = side_with(&change);
    let b = side_with(&change);
    let qa = a.pd.create_qp(&a.cq, attr).unwrap();
    let qb = b.pd.create_qp(&b.cq, attr).unwrap();
    qa.connect(&qb.info()).unwrap();
    qb.connect(&qa.info()).unwrap();
    (a, qa, b, qb)
}

/// Drives both devices until `want` completions arrived on `a` (and `b_want` on `b`).
fn pump(
    a: &Side,
    b: &Side,
    want: usize,
    b_want: usize,
) -> (Vec<WorkCompletion>, Vec<WorkCompletion>) {
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let end = Instant::now() + Duration::from_secs(20);
    while (wa.len() < want || wb.len() < b_want) && Instant::now() < end {
        a.cq.poll(&mut wa, 64);
        b.cq.poll(&mut wb, 64);
    }
    assert!(
        wa.len() >= want && wb.len() >= b_want,
        "timed out: {} {}\n{:?}\n{:?}\n{:?}\n{:?}",
        wa.len(),
        wb.len(),
        a.ctx.counters(),
        b.ctx.counters(),
        a.ctx.snapshot().first().map(|s| s.counters),
        b.ctx.snapshot().first().map(|s| s.counters)
    );
    (wa, wb)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn write_read_send_and_atomics_over_loopback() {
    let (a, qa, b, qb) = pair(&QpAttr::default());
    let rw = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ)
        .union(Access::REMOTE_ATOMIC);
    let src = a.pd.reg_mr(1 << 20, rw).unwrap();
    let dst = b.pd.reg_mr(1 << 20, rw).unwrap();
    let data = pattern(1 << 20, 7);
    src.write(0, &data).unwrap();

    // A 1 MiB Write, then a Read of it back into the second half... of a fresh region.
    qa.post_send(&SendWr {
        wr_id: 1,
        op: WrOp::Write,
        stream: 0,
        local: src.sge(0, 1 << 20),
        remote: dst.remote(0),
    })
    .unwrap();
    let (wa, _) = pump(&a, &b, 1, 0);
    assert_eq!(wa[0].wr_id, 1);
    assert_eq!(wa[0].status, Status::Success);
    assert_eq!(wa[0].kind, CompletionKind::Write);
    assert!(
        dst.equals(0, &data).unwrap(),
        "the Write landed byte for byte"
    );

    let back = a.pd.reg_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
    qa.post_send(&SendWr {
        wr_id: 2,
        op: WrOp::Read,
        stream: 1,
        local: back.sge(0, 1 << 20),
        remote: dst.remote(0),
    })
    .unwrap();
    let (wa, _) = pump(&a, &b, 1, 0);
    assert_eq!((wa[0].wr_id, wa[0].kind), (2, CompletionKind::Read));
    assert!(back.equals(0, &data).unwrap(), "the Read brought it back");

    // Sends into posted receives, with immediate data.
    let rbuf = b.pd.reg_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    for i in 0..4u64 {
        qb.post_recv(100 + i, 0, rbuf.sge(i as usize * 16384, 16384))
            .unwrap();
    }
    for i in 0..4u64 {
        qa.post_send(&SendWr {
            wr_id: 10 + i,
            op: WrOp::SendWithImm(0xabc0 + i as u32),
            stream: 0,
            local: src.sge(i as usize * 1000, 10_000),
            remote: RemoteAddr::default(),
        })
        .unwrap();
    }
    let (_, wb) = pump(&a, &b, 4, 4);
    for (i, wc) in wb.iter().enumerate() {
        assert_eq!(wc.wr_id, 100 + i as u64);
        assert_eq!(wc.kind, CompletionKind::Recv);
        assert_eq!(wc.byte_len, 10_000);
        assert_eq!(wc.imm, Some(0xabc0 + i as u32));
        assert!(rbuf
            .equals(i * 16384, &data[i * 1000..i * 1000 + 10_000])
            .unwrap());
    }

    // Fetch-and-add and compare-and-swap on the peer's first 8 bytes.
    dst.write(0, &40u64.to_ne_bytes()).unwrap();
    let orig = a.pd.reg_mr(16, Access::LOCAL_WRITE).unwrap();
    qa.post_send(&SendWr {
        wr_id: 20,
        op: WrOp::FetchAdd(2),
        stream: 2,
        local: orig.sge(0, 8),
        remote: dst.remote(0),
    })
    .unwrap();
    qa.post_send(&SendWr {
        wr_id: 21,
        op: WrOp::CompareSwap {
            compare: 42,
            swap: 7,
        },
        stream: 2,
        local: orig.sge(8, 8),
        remote: dst.remote(0),
    })
    .unwrap();
    pump(&a, &b, 2, 0);
    let mut v = [0u8; 16];
    orig.read(0, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v[..8].try_into().unwrap()), 40);
    assert_eq!(u64::from_ne_bytes(v[8..].try_into().unwrap()), 42);
    let mut now = [0u8; 8];
    dst.read(0, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 7);
    let c = a.ctx.counters();
    assert!(c.tx_packets > 256 && c.rx_packets > 0);
    assert_eq!(c.tx_bad_local + c.rx_drop_bad_place, 0);
}

#[test]
fn refused_access_completes_with_an_error_and_writes_nothing() {
    let (a, qa, b, _qb) = pair(&QpAttr::default());
    let src = a.pd.reg_mr(8192, Access::LOCAL_WRITE).unwrap();
    src.write(0, &[0x55; 8192]).unwrap();
    let ro = b.pd.reg_mr(8192, Access::REMOTE_READ).unwrap();
    qa.post_send(&SendWr {
        wr_id: 9,
        op: WrOp::Write,
        stream: 0,
        local: src.sge(0, 4096),
        remote: ro.remote(0),
    })
    .unwrap();
    // Past the end of the region.
    qa.post_send(&SendWr {
        wr_id: 10,
        op: WrOp::Read,
        stream: 1,
        local: src.sge(0, 4096),
        remote: ro.remote(8000),
    })
    .unwrap();
    let (wa, _) = pump(&a, &b, 2, 0);
    assert!(
        wa.iter().all(|w| matches!(w.status, Status::Refused(_))),
        "{wa:?}"
    );
    assert!(ro.to_vec().iter().all(|&x| x == 0), "nothing was written");
}

#[test]
fn bad_posts_name_the_operation_and_the_reason() {
    let (a, qa, _b, _qb) = pair(&QpAttr::default());
    let mr = a.pd.reg_mr(100, Access::REMOTE_READ).unwrap();
    let err = qa
        .post_send(&SendWr {
            wr_id: 1,
            op: WrOp::Write,
            stream: 0,
            local: mr.sge(50, 51),
            remote: RemoteAddr::default(),
        })
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "post_send: local buffer 50..101 lies outside the memory region (100 bytes)"
    );
    let err = qa
        .post_send(&SendWr {
            wr_id: 1,
            op: WrOp::Read,
            stream: 0,
            local: mr.sge(0, 10),
            remote: RemoteAddr::default(),
        })
        .unwrap_err();
    assert!(matches!(err.kind, ErrorKind::NoLocalWrite), "{err}");
    let other = a.ctx.alloc_pd().reg_mr(10, Access::LOCAL_WRITE).unwrap();
    let err = qa.post_recv(1, 0, other.sge(0, 10)).unwrap_err();
    assert!(
        matches!(err.kind, ErrorKind::WrongProtectionDomain),
        "{err}"
    );
    let err = a.pd.reg_mr(0, Access::LOCAL_WRITE).map(|_| ()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "reg_mr: a memory region needs at least one byte"
    );
    let fresh = a.pd.create_qp(&a.cq, &QpAttr::default()).unwrap();
    let err = fresh.post_recv(1, 0, mr.sge(0, 1)).unwrap_err();
    assert!(matches!(
        err.kind,
        ErrorKind::NoLocalWrite | ErrorKind::NotConnected
    ));
    let wmr = a.pd.reg_mr(10, Access::LOCAL_WRITE).unwrap();
    let err = fresh.post_recv(1, 0, wmr.sge(0, 1)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "post_recv: the queue pair is not connected"
    );
    // A device on a busy port says which port.
    let mut cfg = DeviceConfig::new(IpAddr::V4(Ipv4Addr::LOCALHOST));
    cfg.port = a.ctx.local_addr().port();
    let err = Context::open(&cfg).map(|_| ()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("open_device: bind UDP 127.0.0.1:"),
        "{err}"
    );
}

#[test]
fn a_region_compares_in_place_and_refuses_ranges_outside_it() {
    let a = side();
    let mr = a.pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    let data = pattern(64, 5);
    mr.write(0, &data).unwrap();
    assert!(mr.equals(0, &data).unwrap());
    assert!(mr.equals(10, &data[10..20]).unwrap());
    assert!(
        mr.equals(64, &[]).unwrap(),
        "an empty range at the end is inside"
    );
    let mut other = data.clone();
    other[63] ^= 1;
    assert!(!mr.equals(0, &other).unwrap(), "the last byte differs");
    assert!(!mr.equals(1, &data[..63]).unwrap(), "shifted by one");
    let err = mr.equals(1, &data).unwrap_err();
    assert_eq!(err.op, "mr_compare");
    assert!(
        matches!(
            err.kind,
            ErrorKind::LocalBounds {
                offset: 1,
                len: 64,
                region_len: 64
            }
        ),
        "{err}"
    );
    assert!(mr.equals(usize::MAX, &data[..2]).is_err(), "no overflow");
}

#[test]
fn a_region_dropped_with_a_request_in_flight_stays_alive_until_it_completes() {
    let (a, qa, b, _qb) = pair(&QpAttr::default());
    let dst = b.pd.reg_mr(1 << 16, Access::REMOTE_WRITE).unwrap();
    {
        let src = a.pd.reg_mr(1 << 16, Access::LOCAL_WRITE).unwrap();
        src.write(0, &[0xa5; 1 << 16]).unwrap();
        qa.post_send(&SendWr {
            wr_id: 1,
            op: WrOp::Write,
            stream: 0,
            local: src.sge(0, 1 << 16),
            remote: dst.remote(0),
        })
        .unwrap();
    }
    pump(&a, &b, 1, 0);
    assert!(dst.to_vec().iter().all(|&x| x == 0xa5));
}

#[test]
fn datagrams_for_unknown_queue_pairs_or_from_strangers_are_counted_and_dropped() {
    let (a, qa, b, qb) = pair(&QpAttr::default());
    let stranger = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = b.ctx.local_addr();
    stranger.send_to(b"x", target).unwrap();
    let mut bogus = [0u8; 64];
    bogus[5..8].copy_from_slice(&[0xde, 0xad, 0x01]);
    stranger.send_to(&bogus, target).unwrap();
    // Right QPN, but from an address that is not the peer's... on loopback, the same IP: it
    // reaches the connection, whose ICRC check drops it.
    bogus[5..8].copy_from_slice(&qb.qpn().to_be_bytes()[1..]);
    stranger.send_to(&bogus, target).unwrap();
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end && b.ctx.counters().rx_packets < 3 {
        b.ctx.progress(Duration::from_millis(5));
    }
    let c = b.ctx.counters();
    assert_eq!(c.rx_drop_runt, 1);
    assert_eq!(c.rx_drop_unknown_qp, 1);
    assert_eq!(qb.counters().drop_bad_icrc, 1);
    assert_eq!(qb.counters().drop_malformed, 0);
    // The connection still works.
    let src = a.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let dst = b.pd.reg_mr(4096, Access::REMOTE_WRITE).unwrap();
    src.write(0, &[9; 4096]).unwrap();
    qa.post_send(&SendWr {
        wr_id: 5,
        op: WrOp::Write,
        stream: 0,
        local: src.sge(0, 4096),
        remote: dst.remote(0),
    })
    .unwrap();
    pump(&a, &b, 1, 0);
    assert!(dst.to_vec().iter().all(|&x| x == 9));
}

/// Garbage, truncated frames, a wrong ICRC, a forged QPN, P_Key or rkey, and a flood from a
/// stranger: all dropped and counted, nothing written, memory bounded, and the real peer still
/// served on the same queue pair.
#[test]
fn hostile_datagrams_are_dropped_and_counted_while_the_peer_is_served() {
    let dir = std::env::temp_dir().join(format!("metaroce-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("a.pcap");
    let mut cfg = DeviceConfig::new(IpAddr::V4(Ipv4Addr::LOCALHOST));
    cfg.port = 0;
    cfg.pcap = Some(pcap.clone());
    let ctx = Context::open(&cfg).unwrap();
    let a = Side {
        pd: ctx.alloc_pd(),
        cq: ctx.create_cq(),
        ctx,
    };
    let b = side();
    let attr = QpAttr::default();
    let qa = a.pd.create_qp(&a.cq, &attr).unwrap();
    let qb = b.pd.create_qp(&b.cq, &attr).unwrap();
    qa.connect(&qb.info()).unwrap();
    qb.connect(&qa.info()).unwrap();
    let src = a.pd.reg_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    src.write(0, &pattern(64 << 10, 3)).unwrap();
    let dst = b.pd.reg_mr(64 << 10, Access::REMOTE_WRITE).unwrap();
    let write = |id: u64, off: usize| {
        qa.post_send(&SendWr {
            wr_id: id,
            op: WrOp::Write,
            stream: 0,
            local: src.sge(off, 4096),
            remote: dst.remote(off as u64),
        })
        .unwrap();
        pump(&a, &b, 1, 0);
    };
    write(1, 0);
    a.ctx.finish_pcap().unwrap();
    // A real Write datagram as it went out, to forge from.
    let (frames, err) = metaroce_frames::capture::read(&std::fs::read(&pcap).unwrap());
    assert!(err.is_none());
    let real: Vec<u8> = frames
        .iter()
        .map(|f| f.data[14 + 20 + 8..].to_vec())
        .find(|d| d.len() > 4096)
        .expect("a full data packet");
    let target = b.ctx.local_addr();
    let attacker = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let aport = attacker.local_addr().unwrap().port();
    let reseal = |mut d: Vec<u8>| {
        let n = d.len() - 4;
        let icrc = transport_core::conn::compute_icrc(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            aport,
            target.port(),
            &d[..n],
        );
        d[n..].copy_from_slice(&icrc.to_le_bytes());
        d
    };
    let psn_ahead = |mut d: Vec<u8>, ahead: u32| {
        let psn = u32::from_be_bytes([0, d[9], d[10], d[11]]).wrapping_add(ahead) & 0xff_ffff;
        d[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
        d
    };
    let before = dst.to_vec();
    let send = |d: &[u8]| {
        attacker.send_to(d, target).unwrap();
    };
    send(b"garbage that is not a frame at all");
    send(&real[..7]); // truncated below a BTH
    send(&real[..100]); // truncated inside the payload
    let mut bad_icrc = psn_ahead(real.clone(), 500);
    bad_icrc[60] ^= 1;
    send(&bad_icrc);
    let mut wrong_qp = real.clone();
    wrong_qp[7] ^= 0x55;
    send(&reseal(wrong_qp));
    let mut wrong_pkey = psn_ahead(real.clone(), 600);
    wrong_pkey[2] = 0x12;
    send(&reseal(wrong_pkey));
    // A forged rkey on a fresh sequence number: checked before anything is written.
    let rkey = dst.rkey().to_be_bytes();
    let at = real
        .windows(4)
        .position(|w| w == rkey)
        .expect("rkey in the Write");
    let mut forged = psn_ahead(real.clone(), 700);
    forged[at] ^= 0xff;
    send(&reseal(forged));
    // Let B answer what came so far (its ACKs and NACKs may open a path's socket), then a flood
    // from a stranger's address.
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end && b.ctx.progress(Duration::from_millis(20)) {}
    let stranger = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
    let held = b.ctx.footprint();
    let mut junk = real.clone();
    for i in 0..50_000u32 {
        junk[12..16].copy_from_slice(&i.to_be_bytes());
        stranger.send_to(&junk, target).unwrap();
        if i % 1000 == 0 {
            b.ctx.progress(Duration::ZERO);
        }
    }
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end && b.ctx.progress(Duration::from_millis(20)) {}
    let dev = b.ctx.counters();
    let conn = qb.counters();
    assert_eq!(dev.rx_drop_runt, 1, "{dev:?}");
    assert_eq!(
        dev.rx_drop_unknown_qp, 2,
        "garbage and the forged QPN: {dev:?}"
    );
    assert!(dev.rx_drop_wrong_peer > 0, "the stranger's flood: {dev:?}");
    assert!(dev.rx_drop_wrong_peer <= 50_000);
    // Cut inside the payload, the datagram still parses (a shorter packet) and its ICRC fails.
    assert_eq!(conn.drop_bad_icrc, 2, "truncated and bad ICRC: {conn:?}");
    assert_eq!(conn.drop_malformed, 0, "{conn:?}");
    assert_eq!(conn.drop_wrong_pkey, 1, "{conn:?}");
    assert_eq!(conn.access_violations, 1, "{conn:?}");
    assert_eq!(dst.to_vec(), before, "nothing was written by any of them");
    assert_eq!(
        b.ctx.footprint(),
        held,
        "the flood created no state: sockets, buffers, queue pairs, requests, regions"
    );
    // The real peer is still served on the same queue pair.
    for (id, off) in [(2, 4096), (3, 8192)] {
        write(id, off);
    }
    assert!(dst.equals(0, &pattern(64 << 10, 3)[..12288]).unwrap());
    std::fs::remove_dir_all(&dir).ok();
}

/// Another process holds the UDP source ports the paths would use: the paths go out from other
/// free ports, sealed with the ICRC of the port really on the wire, and the transfer is whole.
#[test]
fn paths_whose_ports_are_taken_send_from_other_ports_with_a_good_icrc() {
    let attr = QpAttr {
        paths: 4,
        ..QpAttr::default()
    };
    let (a, qa, b, _qb) = pair(&attr);
    let seed = qa.inner.seed;
    let held: Vec<std::net::UdpSocket> = (0..4u8)
        .filter_map(|i| {
            let port = transport_core::conn::entropy_port(seed, transport_core::conn::PathId(i), 0);
            std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).ok()
        })
        .collect();
    assert!(!held.is_empty(), "no path port could be taken for the test");
    let rw = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
    let src = a.pd.reg_mr(256 << 10, rw).unwrap();
    let dst = b.pd.reg_mr(256 << 10, rw).unwrap();
    let data = pattern(256 << 10, 3);
    src.write(0, &data).unwrap();
    qa.post_send(&SendWr {
        wr_id: 1,
        op: WrOp::Write,
        stream: 0,
        local: src.sge(0, 256 << 10),
        remote: dst.remote(0),
    })
    .unwrap();
    let (wa, _) = pump(&a, &b, 1, 0);
    assert_eq!(wa[0].status, Status::Success);
    assert!(
        dst.equals(0, &data).unwrap(),
        "the Write landed byte for byte"
    );
    // Every held port moved its path; a path port that another process (or another test in
    // this one) held at that moment moves too, so the count is at least the test's.
    let fallbacks = a.ctx.counters().tx_port_fallback;
    assert!(
        fallbacks >= held.len() as u64,
        "{fallbacks} moved, {} held",
        held.len()
    );
    let rx = b.ctx.snapshot()[0].counters;
    assert_eq!(rx.drop_bad_icrc, 0, "datagrams with a bad ICRC: {rx:?}");
    assert_eq!(rx.drop_malformed, 0, "{rx:?}");
    for h in &held {
        // Nothing was sent from a port another process holds.
        h.set_nonblocking(true).unwrap();
        assert!(h.recv(&mut [0u8; 64]).is_err());
    }
    // The connection knows the ports its paths really send from: none of them is held, and the
    // receiver learned each path's port from what arrived (the same ports).
    let held_ports: Vec<u16> = held
        .iter()
        .map(|h| h.local_addr().unwrap().port())
        .collect();
    let tx_paths = &a.ctx.snapshot()[0].paths;
    assert_eq!(tx_paths.len(), 4);
    for p in tx_paths {
        assert!(!held_ports.contains(&p.src_port), "{p:?} {held_ports:?}");
    }
    let moved: Vec<u16> = (0..4u8)
        .map(|i| transport_core::conn::entropy_port(seed, transport_core::conn::PathId(i), 0))
        .zip(tx_paths)
        .filter(|(port, p)| p.src_port != *port)
        .map(|(port, _)| port)
        .collect();
    for port in &held_ports {
        assert!(
            moved.contains(port),
            "the path of held port {port} moved: {moved:?}"
        );
    }
    assert_eq!(
        moved.len() as u64,
        fallbacks,
        "each move counted once: {moved:?}"
    );
}

/// A 2 MiB Write from `a` to `b` with these device settings; returns both devices' counters.
fn write_2mib(change: impl Fn(&mut DeviceConfig)) -> (EngineCounters, EngineCounters) {
    let (a, qa, b, _qb) = pair_with(&QpAttr::default(), change);
    let len = 2 << 20;
    let src = a.pd.reg_mr(len, Access::LOCAL_WRITE).unwrap();
    let dst =
        b.pd.reg_mr(len, Access::LOCAL_WRITE.union(Access::REMOTE_WRITE))
            .unwrap();
    let data = pattern(len, 9);
    src.write(0, &data).unwrap();
    qa.post_send(&SendWr {
        wr_id: 1,
        op: WrOp::Write,
        stream: 0,
        local: src.sge(0, len),
        remote: dst.remote(0),
    })
    .unwrap();
    let (wa, _) = pump(&a, &b, 1, 0);
    assert_eq!(wa[0].status, Status::Success);
    let mut got = vec![0u8; len];
    dst.read(0, &mut got).unwrap();
    assert!(got == data, "the Write arrived whole");
    // Whole, and right the first time: a datagram with a wrong ICRC would be dropped and repaired.
    let rx = b.ctx.snapshot()[0].counters;
    assert_eq!(rx.drop_bad_icrc, 0, "{rx:?}");
    (a.ctx.counters(), b.ctx.counters())
}

#[test]
fn gso_gro_and_batched_calls_can_each_be_turned_off() {
    // Defaults: segments leave in GSO sends, and sends and receives carry several each.
    let (a, b) = write_2mib(|_| {});
    // (Loose: a slow machine, qemu in CI, adds retransmissions, which may leave one by one.)
    assert!(a.tx_gso_batches > 0, "{a:?}");
    assert!(a.tx_packets > a.tx_syscalls, "{a:?}");
    assert!(b.rx_packets > b.rx_syscalls, "{b:?}");
    // Everything off: one datagram per send call and per receive call, nothing coalesced.
    let (a, b) = write_2mib(|c| {
        c.gso = false;
        c.gro = false;
        c.batch = false;
    });
    assert_eq!(a.tx_gso_batches + b.rx_gro_batches, 0, "{a:?} {b:?}");
    assert_eq!(a.tx_syscalls, a.tx_packets, "{a:?}");
    assert_eq!(b.rx_syscalls, b.rx_packets, "{b:?}");
    // Batches alone (no GSO, no GRO): several datagrams per call again.
    let (a, b) = write_2mib(|c| {
        c.gso = false;
        c.gro = false;
    });
    assert_eq!(a.tx_gso_batches + b.rx_gro_batches, 0, "{a:?} {b:?}");
    assert!(a.tx_packets > a.tx_syscalls, "{a:?}");
}

#[test]
fn payloads_leave_from_their_region_or_copied_with_the_same_bytes() {
    // Defaults: every full-sized payload is read by the send call where it lies (write_2mib
    // checks the bytes that arrived, and that no datagram came with a bad ICRC), in GSO runs and
    // batches as before.
    let (a, _) = write_2mib(|_| {});
    assert!(a.tx_in_place >= (2 << 20) / 4096, "{a:?}");
    assert!(a.tx_gso_batches > 0, "{a:?}");
    // Copied next to the headers, as a capture does.
    let (a, _) = write_2mib(|c| c.copy_send = true);
    assert_eq!(a.tx_in_place, 0, "{a:?}");
    // In place, one datagram per call: each call's pieces are one datagram's.
    let (a, _) = write_2mib(|c| {
        c.gso = false;
        c.batch = false;
    });
    assert!(a.tx_in_place > 0 && a.tx_syscalls == a.tx_packets, "{a:?}");
    // A capture turns it off: the file holds whole datagrams.
    let dir = std::env::temp_dir().join(format!("metaroce-inplace-{}", std::process::id()));
    let (a, _) = write_2mib(|c| c.pcap = Some(dir.clone()));
    let _ = std::fs::remove_file(&dir);
    assert_eq!(a.tx_in_place, 0, "{a:?}");
}

/// A route that cannot segment (the kernel refuses UDP GSO with EIO): the first refused run is
/// sent again datagram by datagram, GSO stays off for the device from then on, and every byte
/// arrives with a right ICRC (`write_2mib` checks both), whether the payloads left from their
/// regions (the run's pieces joined for the fallback) or were copied next to their headers.
#[test]
fn a_route_that_cannot_segment_gets_the_same_bytes_datagram_by_datagram() {
    for copy_send in [false, true] {
        let (plain, _) = write_2mib(|c| c.copy_send = copy_send);
        super::socket::REFUSE_GSO.set(true);
        super::socket::GSO_REFUSED.set(0);
        let (a, b) = write_2mib(|c| c.copy_send = copy_send);
        super::socket::REFUSE_GSO.set(false);
        // Refused once per device that tried (the receiver, if it ever put two ACKs in one
        // run): the runs staged for GSO in the same flush, and everything after, were not
        // offered to the kernel again.
        assert_eq!(
            super::socket::GSO_REFUSED.get(),
            (a.tx_gso_disabled + b.tx_gso_disabled) as u32,
            "copy_send {copy_send}: {a:?} {b:?}"
        );
        assert_eq!(a.tx_gso_disabled, 1, "copy_send {copy_send}: {a:?}");
        assert_eq!(a.tx_gso_batches, 0, "copy_send {copy_send}: {a:?}");
        assert_eq!(a.tx_errors, 0, "copy_send {copy_send}: {a:?}");
        assert!(
            plain.tx_gso_batches > 0 && plain.tx_gso_disabled == 0,
            "{plain:?}"
        );
        if copy_send {
            assert_eq!(a.tx_in_place, 0, "{a:?}");
        } else {
            assert!(a.tx_in_place >= (2 << 20) / 4096, "{a:?}");
        }
    }
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[test]
fn an_idle_wait_sleeps_unless_busy_polling() {
    for busy in [false, true] {
        let s = side_with(|c| c.busy_poll = busy);
        let rounds0 = s.ctx.counters().rounds;
        let (cpu0, sw0, t0) = (
            thread_cpu(),
            super::cpu_wait::voluntary_switches(),
            Instant::now(),
        );
        assert!(s.cq.wait(Duration::from_millis(200)).is_none());
        let (cpu, wall) = (thread_cpu() - cpu0, t0.elapsed());
        let sleeps = super::cpu_wait::voluntary_switches() - sw0;
        let rounds = s.ctx.counters().rounds - rounds0;
        assert!(wall >= Duration::from_millis(200), "{wall:?}");
        // Whether the thread blocked and how often the engine ran, not how much CPU the
        // thread was charged: other tests share the two cores, a spinning thread may get
        // little of one, and on a virtual machine a sleeping thread's wake-ups may be charged
        // far more than they took (a CI run charged 23 ms to 20 of them, 1.3 ms here). An idle
        // wait sleeps on the socket at least every 10 ms, so it runs a round or two per sleep;
        // a busy-polling one never blocks and runs a round per spin.
        let seen = format!("{rounds} rounds, blocked {sleeps} times, {cpu:?} CPU of {wall:?}");
        if busy {
            assert!(sleeps <= 2, "busy polling spins: {seen}");
            assert!(rounds > 1000, "busy polling spins: {seen}");
        } else {
            assert!(sleeps >= 10, "an idle wait sleeps: {seen}");
            assert!(
                rounds <= 2 * sleeps as u64 + 4,
                "an idle wait sleeps: {seen}"
            );
        }
    }
}

/// A forger on the peers' host who knows the queue pair number and the initial PSN (a local
/// user who could read the counters of running endpoints learned both) floods A with NACKs
/// ("invalid rkey") for every PSN in flight on every path, and with ACKs claiming all of it
/// arrived, from its own port while A's packets are in flight: nothing is refused or completed
/// early, and every byte lands.
#[test]
fn forged_nacks_and_acks_for_every_psn_in_flight_change_nothing() {
    use transport_core::wire::metaroce::{MrAckRepr, MrNackRepr, NackReason, SACK_BITS};
    use transport_core::wire::{BthRepr, Extensions, Opcode, Psn, Qpn};
    let attr = QpAttr::default();
    let (a, qa, b, _qb) = pair(&attr);
    let rw = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
    let len = 1 << 20;
    let src = a.pd.reg_mr(len, rw).unwrap();
    let dst = b.pd.reg_mr(len, rw).unwrap();
    let data = pattern(len, 11);
    src.write(0, &data).unwrap();
    let target = a.ctx.local_addr();
    let (qpn, psn0) = (qa.qpn(), qa.info().psn);
    let forger = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = forger.local_addr().unwrap().port();
    let seal = |opcode: Opcode, psn: u32, ext: Extensions| {
        let bth = BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(qpn),
            ack_req: false,
            psn: Psn::new(psn & 0xff_ffff),
        };
        let mut buf = vec![0u8; 128];
        let rest = bth.emit(&mut buf).unwrap();
        let n = 128 - ext.emit(opcode.layout(), rest).unwrap().len();
        let icrc = transport_core::conn::compute_icrc(
            target.ip(),
            target.ip(),
            port,
            target.port(),
            &buf[..n],
        );
        buf[n..n + 4].copy_from_slice(&icrc.to_le_bytes());
        buf.truncate(n + 4);
        buf
    };
    let n = 16;
    for i in 0..n {
        let off = i * (len / n);
        qa.post_send(&SendWr {
            wr_id: i as u64,
            op: WrOp::Write,
            stream: 0,
            local: src.sge(off, len / n),
            remote: dst.remote(off as u64),
        })
        .unwrap();
    }
    // A's first window is out; B has not answered. The flood, with A taking it as it comes.
    let mut sent = 0u64;
    for k in 0..256u32 {
        let psn = psn0.wrapping_add(k);
        for path in 0..8u8 {
            for guess in [0u32, k, k / 8] {
                let nack = Extensions::MrNack(MrNackRepr {
                    path_id: path,
                    reason: NackReason::InvalidRkey,
                    path_seq: guess,
                    stream_id: 0,
                    msn: 0,
                });
                forger
                    .send_to(&seal(Opcode::MrNack, psn, nack), target)
                    .unwrap();
                let ack = Extensions::MrAck(MrAckRepr {
                    ece: false,
                    refusals: false,
                    path_id: path,
                    ce_count: 0,
                    cum_seq: guess,
                    ts_echo: 0,
                    ack_delay: 0,
                    rate_hint: 0,
                    sack: [0xff; SACK_BITS / 8],
                });
                forger
                    .send_to(&seal(Opcode::MrAck, psn0.wrapping_add(256), ack), target)
                    .unwrap();
                sent += 2;
            }
        }
        a.ctx.progress(Duration::ZERO);
    }
    let end = Instant::now() + Duration::from_millis(100);
    while Instant::now() < end {
        a.ctx.progress(Duration::from_millis(5));
    }
    let c = qa.counters();
    assert_eq!(c.nacks_received, 0, "{c:?}");
    let dropped = c.drop_wrong_port + c.drop_bad_ack + c.drop_bad_nack;
    assert!(dropped > 0 && dropped <= sent, "{sent} forged, {c:?}");
    let (wa, _) = pump(&a, &b, n, 0);
    assert!(wa.iter().all(|w| w.status == Status::Success), "{wa:?}");
    assert_eq!(dst.to_vec(), data, "every byte landed");
}

/// Paths that keep moving to new source ports (as failed paths do, each failure a new port, and
/// as a peer that keeps failing paths can make them) leave no send socket and no staging buffer
/// behind for each port: the engine closes those of ports no path uses once they pass a bound,
/// and every Write still lands.
#[test]
fn paths_that_keep_moving_leave_no_sockets_behind() {
    // One packet a path at a time: every Write of 16 packets goes out on all eight paths.
    let attr = QpAttr {
        spray_burst: 1,
        ..QpAttr::default()
    };
    let (a, qa, b, _qb) = pair(&attr);
    let rw = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
    let src = a.pd.reg_mr(64 << 10, rw).unwrap();
    let dst = b.pd.reg_mr(64 << 10, rw).unwrap();
    let data = pattern(64 << 10, 5);
    src.write(0, &data).unwrap();
    let paths = usize::from(attr.paths);
    // Ports above Linux's default ephemeral range (32768-60999): no other socket of the tests
    // holds one, so none falls back to a port that a later move would name again.
    let moves = 120u16;
    let mut most = 0;
    for g in 0..moves {
        qa.move_paths(61_000 + g * paths as u16);
        qa.post_send(&SendWr {
            wr_id: u64::from(g),
            op: WrOp::Write,
            stream: 0,
            local: src.sge(0, 64 << 10),
            remote: dst.remote(0),
        })
        .unwrap();
        let (wa, _) = pump(&a, &b, 1, 0);
        assert_eq!(wa[0].status, Status::Success);
        most = most.max(a.ctx.footprint()[0]);
    }
    assert!(dst.equals(0, &data).unwrap());
    let [sockets, stages, ..] = a.ctx.footprint();
    let dropped = a.ctx.counters().tx_paths_dropped;
    assert!(
        most <= 256 + paths && sockets <= 256 + paths && stages <= 256 + paths,
        "{most} sockets at most, {sockets} and {stages} stages at the end, for {} ports used",
        usize::from(moves) * paths
    );
    // Each port used had a socket and a stage; all but those kept were closed and freed.
    assert_eq!(
        dropped as usize,
        2 * (usize::from(moves) * paths) - sockets - stages,
        "{sockets} sockets and {stages} stages kept"
    );
}

/// Posts an 8-byte Send with immediate `id` from the start of `mr` (a ping or its answer).
fn send_imm(qp: &QueuePair, id: u64, mr: &MemoryRegion) {
    qp.post_send(&SendWr {
        wr_id: id,
        op: WrOp::SendWithImm(id as u32),
        stream: 0,
        local: mr.sge(0, 8),
        remote: RemoteAddr::default(),
    })
    .unwrap();
}

/// An end that did not run for a while (its host gave the CPU to others) finds a ping waiting:
/// the round that reads it hands the completion over before it sends anything, so the answer
/// the tool posts carries the ping's ACK, and no ACK goes on its own.
#[test]
fn after_a_stall_the_answer_carries_the_ack_of_what_waited() {
    let (a, qa, b, qb) = pair(&QpAttr::default());
    let src = a.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let rbuf = b.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let answer = b.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let arecv = a.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    qa.post_recv(1, 0, arecv.sge(0, 64)).unwrap();
    qb.post_recv(2, 0, rbuf.sge(0, 64)).unwrap();
    // Both have run (their rounds are expected), then A's ping leaves (a post sends at once) and
    // waits in B's socket while neither runs for well over the stall threshold.
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    a.cq.poll(&mut wa, 8);
    b.cq.poll(&mut wb, 8);
    send_imm(&qa, 10, &src);
    std::thread::sleep(Duration::from_millis(3));
    let stalls = b.ctx.counters().host_stalls;
    let end = Instant::now() + Duration::from_secs(5);
    while wb.is_empty() && Instant::now() < end {
        b.cq.poll(&mut wb, 8);
    }
    assert_eq!(b.ctx.counters().host_stalls, stalls + 1, "B saw its stall");
    assert_eq!(wb.len(), 1, "B has the ping");
    assert_eq!(qb.counters().acks_sent, 0, "no ACK went before the answer");
    send_imm(&qb, 20, &answer);
    let (wa, _) = pump(&a, &b, 2, 0);
    assert!(wa
        .iter()
        .any(|wc| wc.wr_id == 1 && wc.kind == CompletionKind::Recv));
    assert_eq!(qa.counters().acks_piggyback_received, 1);
    let c = qb.counters();
    assert_eq!(
        (c.acks_sent, c.acks_piggybacked),
        (1, 1),
        "the answer carried the ping's ACK, and it was the only one"
    );
}

/// A caller that keeps the engine waiting between every call while pings keep coming still gets
/// its ACKs out: after a round that handed over what waited and sent no ACK, the next round is a
/// full one, stalled or not.
#[test]
fn stalls_in_a_row_do_not_hold_acks_back() {
    let (a, qa, b, qb) = pair(&QpAttr::default());
    let src = a.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let rbuf = b.pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    for i in 0..2 {
        qb.post_recv(i, 0, rbuf.sge(i as usize * 64, 64)).unwrap();
    }
    let mut wb = Vec::new();
    b.cq.poll(&mut wb, 8);
    for (k, id) in [10u64, 11].into_iter().enumerate() {
        send_imm(&qa, id, &src);
        std::thread::sleep(Duration::from_millis(3));
        let stalls = b.ctx.counters().host_stalls;
        b.cq.poll(&mut wb, 8);
        assert_eq!(b.ctx.counters().host_stalls, stalls + 1, "stall {k} seen");
        assert_eq!(wb.len(), k + 1, "ping {k} handed over");
        let acks = qb.counters().acks_sent;
        if k == 0 {
            assert_eq!(
                acks, 0,
                "the first stall's round holds its ACK for an answer"
            );
        } else {
            assert!(
                acks >= 1,
                "the second stall in a row is a full round: ACKs go"
            );
        }
    }
}

/// A receive batch fills at most half of the core's second-level cache, between two and eight
/// 64 KiB buffers, and eight where the size is not known (as before the rule).
#[test]
fn the_receive_batch_fits_half_of_the_second_level_cache() {
    use engine::rx_batch_for_l2;
    for (l2, want) in [
        (None, 8),
        (Some(128 << 10), 2),
        (Some(256 << 10), 2),
        (Some(512 << 10), 4),
        (Some(1 << 20), 8),
        (Some(2 << 20), 8),
        (Some(32 << 20), 8),
        (Some(0), 2),
    ] {
        assert_eq!(rx_batch_for_l2(l2), want, "L2 {l2:?}");
    }
}

#[test]
fn cache_sizes_read_as_sysfs_writes_them() {
    use engine::parse_cache_size;
    assert_eq!(parse_cache_size("512K\n"), Some(512 << 10));
    assert_eq!(parse_cache_size("2048K"), Some(2 << 20));
    assert_eq!(parse_cache_size("32M"), Some(32 << 20));
    assert_eq!(parse_cache_size("1G"), Some(1 << 30));
    assert_eq!(parse_cache_size("4096"), Some(4096));
    for bad in ["", "K", "12Q", "-1K", "1.5M", "99999999999999999999999G"] {
        assert_eq!(parse_cache_size(bad), None, "{bad:?}");
    }
}

/// The second-level cache is found among a CPU's cache entries as Linux lists them, whatever
/// their order; an instruction cache or another level is not taken for it.
#[test]
fn the_second_level_cache_is_read_from_the_cpus_cache_entries() {
    let root = std::env::temp_dir().join(format!("metaroce-l2-{}", std::process::id()));
    let write = |dir: &std::path::Path, entries: &[(&str, &str, &str)]| {
        let _ = std::fs::remove_dir_all(dir);
        for (i, (level, kind, size)) in entries.iter().enumerate() {
            let d = dir.join(format!("index{i}"));
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join("level"), format!("{level}\n")).expect("level");
            std::fs::write(d.join("type"), format!("{kind}\n")).expect("type");
            std::fs::write(d.join("size"), format!("{size}\n")).expect("size");
        }
    };
    let amd: &[(&str, &str, &str)] = &[
        ("1", "Data", "32K"),
        ("1", "Instruction", "32K"),
        ("2", "Unified", "512K"),
        ("3", "Unified", "32768K"),
    ];
    let odd: &[(&str, &str, &str)] = &[
        ("2", "Instruction", "64K"),
        ("3", "Unified", "8M"),
        ("2", "Data", "1M"),
    ];
    let none: &[(&str, &str, &str)] = &[("1", "Data", "48K"), ("3", "Unified", "8M")];
    for (name, entries, want) in [
        ("amd", amd, Some(512 << 10)),
        ("odd", odd, Some(1 << 20)),
        ("none", none, None),
    ] {
        let dir = root.join(name);
        write(&dir, entries);
        assert_eq!(engine::l2_bytes_in(&dir), want, "{name}");
    }
    assert_eq!(engine::l2_bytes_in(&root.join("missing")), None);
    // A level-2 cache four cores share (an Arm cluster's): each core's share.
    let cluster = root.join("cluster");
    write(&cluster, &[("1", "Data", "32K"), ("2", "Unified", "1024K")]);
    std::fs::write(cluster.join("index1/shared_cpu_list"), "0-3\n").expect("list");
    assert_eq!(engine::l2_bytes_in(&cluster), Some(256 << 10));
    // An unreadable list counts the cache as the CPU's own.
    std::fs::write(cluster.join("index1/shared_cpu_list"), "zero\n").expect("list");
    assert_eq!(engine::l2_bytes_in(&cluster), Some(1 << 20));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn cpu_lists_count_as_the_kernel_writes_them() {
    use engine::count_cpu_list;
    for (list, n) in [
        ("0", 1),
        ("0-1\n", 2),
        ("0-3", 4),
        ("0,2,4-5", 4),
        ("8-15,24-31", 16),
    ] {
        assert_eq!(count_cpu_list(list), Some(n), "{list:?}");
    }
    for bad in ["", "3-1", "a", "0-", "-1", "0,,1", "99999999999999999999"] {
        assert_eq!(count_cpu_list(bad), None, "{bad:?}");
    }
}
