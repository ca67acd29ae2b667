//! The bodies of the fuzz targets, shared by the libFuzzer binaries in `fuzz_targets/` and by the
//! stable test that replays the corpora (`tests/replay.rs`). Each body panics only when a property
//! fails: parsing must never panic, and whatever parses must emit and parse back to itself.

use transport_core::time::Instant;
use transport_core::wire::metaroce::{
    MrAckRepr, MrDataRepr, MrNackRepr, MrProbeRepr, MrRemoteRepr, PiggyAck,
};
use transport_core::wire::{parse_with, IcrcCheck, ParseOptions};

/// A whole frame: parse with every check, and with the ICRC only reported; re-emit what parses.
pub fn frame(data: &[u8]) {
    let _ = transport_core::wire::parse(data);
    let opts = ParseOptions {
        icrc: IcrcCheck::Report,
        ..ParseOptions::default()
    };
    let Ok(parsed) = parse_with(data, &opts) else {
        return;
    };
    let repr = parsed.repr;
    let mut buf = vec![0u8; repr.buffer_len()];
    let n = repr.emit(&mut buf).expect("a parsed frame emits");
    let again = transport_core::wire::parse(&buf[..n]).expect("an emitted frame parses");
    assert_eq!(again.repr, repr);
    assert_eq!(again.icrc_ok(), Some(true));
}

macro_rules! header_target {
    ($(#[$doc:meta])* $name:ident, $repr:ty) => {
        $(#[$doc])*
        pub fn $name(data: &[u8]) {
            let Ok((repr, rest)) = <$repr>::parse(data) else { return };
            assert_eq!(rest.len(), data.len() - <$repr>::LEN);
            let mut buf = [0u8; <$repr>::LEN];
            repr.emit(&mut buf).expect("a parsed header emits");
            assert_eq!(<$repr>::parse(&buf).expect("an emitted header parses").0, repr);
        }
    };
}

header_target!(
    /// The MetaRoCE data header, and the remote header after it.
    mr_data_header,
    MrDataRepr
);
header_target!(
    /// The MetaRoCE remote header.
    mr_remote,
    MrRemoteRepr
);
header_target!(
    /// The MetaRoCE ACK header.
    mr_ack_header,
    MrAckRepr
);
header_target!(
    /// The ACK a data packet carries (flag A): a cumulative PSN, then the ACK header.
    piggy_ack,
    PiggyAck
);

/// The MetaRoCE ACK header, and the same bytes as the ACK a data packet carries.
pub fn mr_ack(data: &[u8]) {
    mr_ack_header(data);
    piggy_ack(data);
}
header_target!(
    /// The MetaRoCE NACK header.
    mr_nack,
    MrNackRepr
);
header_target!(
    /// The MetaRoCE probe header.
    mr_probe,
    MrProbeRepr
);

/// The data header followed by a remote header, as on a Write.
pub fn mr_data(data: &[u8]) {
    mr_data_header(data);
    if let Some(rest) = data.get(MrDataRepr::LEN..) {
        mr_remote(rest);
    }
}

/// The connection pair the core's tests drive, at their sizes.
type Pair = netsim::pair::Pair<4, 256, 2, 16, 4>;
/// Memory per side: B grants its second quarter.
const MEM: usize = 0x1_0000;
const BASE: u64 = netsim::pair::BASE;
const GRANT: u64 = 0x4000;

fn pair_config(local: u8, remote: u8) -> transport_core::conn::Config {
    let mut c = netsim::pair::config(local, remote);
    c.mtu = 512;
    c
}

/// A live connection pair fed arbitrary datagram sequences, interleaved with its own traffic.
///
/// The input is a list of records `[len lo, len hi, control, bytes...]`. Control bits 7-6 choose
/// the receiver (B, A, or "let the real peers exchange what they have"), bits 1-0 the path whose
/// source port the datagram claims, bit 4 whether to write a correct ICRC over it first (so the
/// fuzzer reaches the logic behind the ICRC check), bit 5 whether time moves on by 1-64 us.
/// Properties: no panic; every placement lies inside the region B granted (or, at A, inside its
/// read destination) and is applied to the side's memory; no completion is reported twice.
pub fn conn_pair(data: &[u8]) {
    use transport_core::conn::{
        compute_icrc, entropy_port, Access, Delivery, Event, PathId, Region, RemoteAddr,
        WorkRequest, WrOp,
    };
    let mut p = Pair::with_memory(pair_config(1, 2), pair_config(2, 1), MEM);
    let access = Access::REMOTE_WRITE.union(Access::REMOTE_READ);
    p.b.conn
        .register(Region {
            key: 5,
            base: BASE + GRANT,
            len: GRANT,
            access,
        })
        .expect("register");
    let remote = RemoteAddr {
        va: BASE + GRANT,
        rkey: 5,
    };
    let wr = |id, op| WorkRequest {
        id,
        op,
        stream: 0,
        local_addr: BASE,
        len: 1500,
        remote,
    };
    let _ = p.a.conn.post(Instant::ZERO, wr(1, WrOp::Write));
    let _ = p.a.conn.post(Instant::ZERO, wr(2, WrOp::Read));
    let mut seen = std::collections::HashSet::new();
    let mut rest = data;
    while rest.len() >= 3 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])) % 1024;
        let control = rest[2];
        rest = &rest[3..];
        let (datagram, tail) = rest.split_at(len.min(rest.len()));
        rest = tail;
        if control & 0x20 != 0 {
            p.now += 1_000 * u64::from(control & 0x3f);
            for side in [&mut p.a, &mut p.b] {
                if side.conn.poll_timeout().is_some_and(|t| t <= p.now) {
                    side.conn.handle_timeout(p.now);
                }
            }
        }
        let to_b = control >> 6 == 0;
        let path = control & 3;
        let mut d = datagram.to_vec();
        if control >> 6 == 2 {
            // The real peers exchange what they have, unharmed.
            p.transmit();
            for (to_b, port, bytes) in std::mem::take(&mut p.wire) {
                check_place(p.deliver(to_b, port, &bytes), to_b);
            }
            continue;
        }
        let (cfg_local, cfg_remote) = if to_b { (2, 1) } else { (1, 2) };
        let port = entropy_port(
            pair_config(cfg_remote, cfg_local).entropy_seed,
            PathId(path),
            0,
        );
        if control & 0x10 != 0 && d.len() >= 16 {
            let cfg = pair_config(cfg_remote, cfg_local);
            let at = d.len() - 4;
            let icrc = compute_icrc(cfg.local_ip, cfg.remote_ip, port, cfg.dst_port, &d[..at]);
            d[at..].copy_from_slice(&icrc.to_le_bytes());
        }
        check_place(p.deliver_marked(to_b, port, &d, control & 0x08 != 0), to_b);
        for (is_a, side) in [(true, &mut p.a), (false, &mut p.b)] {
            while let Some(e) = side.conn.poll_event() {
                if let Event::Completion(done) = e {
                    assert!(seen.insert((is_a, done.id)), "completion {} twice", done.id);
                }
            }
        }
    }

    fn check_place(r: Result<Delivery, transport_core::conn::DropReason>, to_b: bool) {
        if let Ok(Delivery::Place { addr, len, .. }) = r {
            let end = addr + len as u64;
            if to_b {
                assert!(
                    addr >= BASE + GRANT && end <= BASE + 2 * GRANT,
                    "B placed outside its grant"
                );
            } else {
                assert!(
                    addr >= BASE && end <= BASE + MEM as u64,
                    "A placed outside its buffer"
                );
            }
        }
    }
}

/// A fuzz target's body.
pub type Target = fn(&[u8]);

/// Every target by name, for the replay test.
pub const TARGETS: &[(&str, Target)] = &[
    ("frame", frame),
    ("mr_data", mr_data),
    ("mr_ack", mr_ack),
    ("mr_nack", mr_nack),
    ("mr_probe", mr_probe),
    ("conn_pair", conn_pair),
];
