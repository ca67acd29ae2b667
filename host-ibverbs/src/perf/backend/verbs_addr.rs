//! What two verbs ends tell each other about their port before they connect, and what they
//! agree on: the GID (the address), its type and the path MTU. As perftest exchanges them: each
//! end offers its active MTU (or the one `-m` asks for, if smaller) and both take the smaller;
//! a RoCE v1 end cannot reach a RoCE v2 one, nor an IPv4-mapped GID an IPv6 one.
//!
//! On the exchange a verbs end's data address is `GIDHEX/TYPE/MTU` (`TYPE` `v1`, `v2` or `?`,
//! `MTU` in bytes); a bare `GIDHEX` (an older metaroce) leaves the type unknown and the MTU to the
//! other end.

#![cfg_attr(not(feature = "verbs"), allow(dead_code))]

use crate::gids::GidType;
use crate::oob::OobError;

/// The IB path MTUs, in bytes, by the verbs enum value (`IBV_MTU_256` = 1 ... `IBV_MTU_4096` = 5).
pub const IB_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

/// The verbs enum value of an MTU in bytes, if it is one.
pub fn mtu_enum(bytes: u32) -> Option<u32> {
    IB_MTUS
        .iter()
        .position(|&m| m == bytes)
        .map(|i| i as u32 + 1)
}

/// The MTU in bytes of a verbs enum value (1 to 5).
pub fn mtu_bytes(e: u32) -> Option<u32> {
    IB_MTUS.get((e as usize).checked_sub(1)?).copied()
}

/// A verbs end's port as the exchange carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerbsAddr {
    /// The GID the end sends from.
    pub gid: [u8; 16],
    /// Its type, when the end knows it.
    pub kind: Option<GidType>,
    /// The largest path MTU the end takes, bytes (0: not said).
    pub mtu: u32,
}

impl VerbsAddr {
    /// `GIDHEX/TYPE/MTU`.
    pub fn encode(&self) -> String {
        let hex: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{hex}/{}/{}",
            self.kind.map_or("?", GidType::short),
            self.mtu
        )
    }

    /// Reads what [`VerbsAddr::encode`] wrote, or a bare GID.
    pub fn decode(s: &str) -> Result<VerbsAddr, OobError> {
        let mut it = s.split('/');
        let gid = decode_gid(it.next().unwrap_or(""))?;
        let kind = match it.next() {
            None | Some("?") => None,
            Some(t) => Some(
                GidType::from_name(t).ok_or_else(|| OobError::Field(format!("GID type {t:?}")))?,
            ),
        };
        let mtu = match it.next() {
            None => 0,
            Some(m) => m
                .parse::<u32>()
                .ok()
                .filter(|&m| mtu_enum(m).is_some())
                .ok_or_else(|| OobError::Field(format!("MTU {m:?}")))?,
        };
        if it.next().is_some() {
            return Err(OobError::Field(format!("verbs address {s:?}")));
        }
        Ok(VerbsAddr { gid, kind, mtu })
    }
}

/// A GID as 32 hex digits.
pub fn decode_gid(s: &str) -> Result<[u8; 16], OobError> {
    let bad = || OobError::Field(format!("gid {s:?}"));
    if s.len() != 32 {
        return Err(bad());
    }
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16).map_err(|_| bad())?;
    }
    Ok(gid)
}

fn is_v4_mapped(gid: &[u8; 16]) -> bool {
    std::net::Ipv6Addr::from(*gid).to_ipv4_mapped().is_some()
}

/// The path MTU (bytes) two ends use, or why they cannot connect: GIDs of different types
/// (v1 against v2) or families (IPv4-mapped against IPv6) never reach each other.
pub fn agree(local: &VerbsAddr, peer: &VerbsAddr) -> Result<u32, String> {
    if let (Some(a), Some(b)) = (local.kind, peer.kind) {
        if a != b {
            return Err(format!(
                "this end's GID is {} and the peer's {}: pick GIDs of one type on both ends (-x; \
                 `metaroce devices` lists them)",
                a.name(),
                b.name()
            ));
        }
    }
    if is_v4_mapped(&local.gid) != is_v4_mapped(&peer.gid) {
        let fam = |g: &[u8; 16]| if is_v4_mapped(g) { "IPv4" } else { "IPv6" };
        return Err(format!(
            "this end's GID is an {} address and the peer's an {} one: pick GIDs of one family \
             on both ends (-x; `metaroce devices` lists them)",
            fam(&local.gid),
            fam(&peer.gid)
        ));
    }
    Ok(match (local.mtu, peer.mtu) {
        (0, m) | (m, 0) => m,
        (a, b) => a.min(b),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(last: u8, v4: bool, kind: Option<GidType>, mtu: u32) -> VerbsAddr {
        let mut gid = [0u8; 16];
        if v4 {
            gid[10] = 0xff;
            gid[11] = 0xff;
        } else {
            gid[0] = 0x20;
            gid[1] = 0x01;
        }
        gid[15] = last;
        VerbsAddr { gid, kind, mtu }
    }

    #[test]
    fn the_address_goes_through_the_exchange_and_a_bare_gid_still_reads() {
        let a = addr(7, true, Some(GidType::RoceV2), 4096);
        let s = a.encode();
        assert_eq!(s, "00000000000000000000ffff00000007/v2/4096");
        assert_eq!(VerbsAddr::decode(&s).unwrap(), a);
        let unknown = VerbsAddr { kind: None, ..a };
        assert_eq!(VerbsAddr::decode(&unknown.encode()).unwrap(), unknown);
        let bare = VerbsAddr::decode("00000000000000000000ffff00000007").unwrap();
        assert_eq!((bare.gid, bare.kind, bare.mtu), (a.gid, None, 0));
        let hex = &s[..32];
        for bad in [
            "",
            "00",
            &hex[..30],
            &format!("{}zz", &hex[..30]),
            &format!("{hex}/v3/4096"),
            &format!("{hex}/v2/1500"),
            &format!("{hex}/v2/4096/x"),
            &format!("{hex}/v2/-1"),
        ] {
            assert!(VerbsAddr::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn both_ends_take_the_smaller_mtu_and_refuse_mismatched_gids() {
        let v2 = Some(GidType::RoceV2);
        // The client asked for -m 1024; the server's port runs 4096: both use 1024.
        let client = addr(1, true, v2, 1024);
        let server = addr(2, true, v2, 4096);
        assert_eq!(agree(&client, &server), Ok(1024));
        assert_eq!(agree(&server, &client), Ok(1024));
        // An older peer that said nothing of its MTU or type.
        assert_eq!(agree(&server, &addr(3, true, None, 0)), Ok(4096));
        let e = agree(&server, &addr(3, true, Some(GidType::IbRoceV1), 4096)).unwrap_err();
        assert!(
            e.contains("RoCE v2") && e.contains("IB/RoCE v1") && e.contains("-x"),
            "{e}"
        );
        let e = agree(&server, &addr(3, false, v2, 4096)).unwrap_err();
        assert!(e.contains("IPv4") && e.contains("IPv6"), "{e}");
    }

    /// Through the connection exchange itself: each end sends its address in the `qps` message
    /// as a verbs end does (`Endpoint::local_info`, `session`), reads the other's and agrees on
    /// the same MTU; a peer with a RoCE v1 GID is refused on both ends.
    #[test]
    fn both_ends_agree_through_the_exchange() {
        use crate::oob::{Channel, Message};
        use std::time::Duration;
        let run = |client: VerbsAddr, server: VerbsAddr| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            let t = std::thread::spawn(move || {
                let mut c = Channel::accept(&l).unwrap();
                let peer = c.recv(Some(Duration::from_secs(5))).unwrap();
                c.send(&Message::new("qps").with("data", server.encode()))
                    .unwrap();
                agree(
                    &server,
                    &VerbsAddr::decode(peer.text("data").unwrap()).unwrap(),
                )
            });
            let mut c = Channel::connect("127.0.0.1", port, Duration::from_secs(5)).unwrap();
            c.send(&Message::new("qps").with("data", client.encode()))
                .unwrap();
            let peer = c.recv(Some(Duration::from_secs(5))).unwrap();
            let mine = agree(
                &client,
                &VerbsAddr::decode(peer.text("data").unwrap()).unwrap(),
            );
            (mine, t.join().unwrap())
        };
        let v2 = Some(GidType::RoceV2);
        // The client's -m 1024 reaches the server.
        assert_eq!(
            run(addr(1, true, v2, 1024), addr(2, true, v2, 4096)),
            (Ok(1024), Ok(1024))
        );
        let (a, b) = run(
            addr(1, true, v2, 4096),
            addr(2, true, Some(GidType::IbRoceV1), 4096),
        );
        assert!(a.is_err() && b.is_err(), "{a:?} {b:?}");
    }

    #[test]
    fn mtus_map_to_the_verbs_enum() {
        for (i, m) in IB_MTUS.iter().enumerate() {
            assert_eq!(mtu_enum(*m), Some(i as u32 + 1));
            assert_eq!(mtu_bytes(i as u32 + 1), Some(*m));
        }
        assert_eq!(mtu_enum(1500), None);
        assert_eq!((mtu_bytes(0), mtu_bytes(6)), (None, None));
    }
}
