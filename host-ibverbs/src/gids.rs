//! RDMA ports and their GID tables as the kernel publishes them in sysfs
//! (`/sys/class/infiniband/DEV/ports/N/`), and the choice of the GID a RoCE connection should use.
//!
//! This needs no libibverbs: `metaroce devices` lists the table on any build, and the verbs
//! backend takes its default GID index from [`best_gid`]. libibverbs has `ibv_query_gid_ex` for the
//! type of a GID, which `rdma-sys` does not bind; the kernel publishes the same attribute in
//! sysfs (`gid_attrs/types/IDX`), as `show_gids` reads it.
//!
//! The files read, one value each: `ports/N/state` (`4: ACTIVE`), `ports/N/link_layer`
//! (`Ethernet` or `InfiniBand`), `ports/N/gids/IDX` (the GID as eight groups of four hex digits),
//! `ports/N/gid_attrs/types/IDX` (`IB/RoCE v1` or `RoCE v2`; unreadable for an empty entry) and
//! `ports/N/gid_attrs/ndevs/IDX` (the network interface of a RoCE GID).

use std::fmt;
use std::io;
use std::net::Ipv6Addr;
use std::path::Path;

/// Where the kernel publishes the RDMA devices.
pub const SYSFS_ROOT: &str = "/sys/class/infiniband";

/// The protocol a GID entry sends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum GidType {
    /// InfiniBand, or RoCE v1 on an Ethernet port (EtherType 0x8915: not routable, and outside
    /// the DSCP-based PFC and ECN classes of a RoCE fabric).
    IbRoceV1,
    /// RoCE v2: UDP port 4791 over IP, routable, in the fabric's traffic classes.
    RoceV2,
}

impl GidType {
    /// The type as sysfs and `show_gids` name it.
    pub fn name(self) -> &'static str {
        match self {
            GidType::IbRoceV1 => "IB/RoCE v1",
            GidType::RoceV2 => "RoCE v2",
        }
    }

    /// Short name, for the connection exchange (`v1`, `v2`).
    pub fn short(self) -> &'static str {
        match self {
            GidType::IbRoceV1 => "v1",
            GidType::RoceV2 => "v2",
        }
    }

    /// From sysfs's or the exchange's name.
    pub fn from_name(s: &str) -> Option<GidType> {
        match s.trim() {
            "IB/RoCE v1" | "RoCE v1" | "v1" => Some(GidType::IbRoceV1),
            "RoCE v2" | "v2" => Some(GidType::RoceV2),
            _ => None,
        }
    }
}

/// The link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// Ethernet: RoCE.
    Ethernet,
    /// InfiniBand: addressed by LID, which this project does not do.
    InfiniBand,
    /// Something else, as sysfs names it.
    Other,
}

/// One used entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index (`-x` / `--gid-index`).
    pub index: u8,
    /// The GID.
    pub gid: [u8; 16],
    /// Its type; `None` where the kernel does not say (kernels before 4.5).
    pub kind: Option<GidType>,
    /// The network interface it belongs to (RoCE).
    pub netdev: Option<String>,
}

impl GidEntry {
    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4(&self) -> Option<std::net::Ipv4Addr> {
        Ipv6Addr::from(self.gid).to_ipv4_mapped()
    }

    /// Whether the GID is link-local (`fe80::/10`, the default GID of every port).
    pub fn is_link_local(&self) -> bool {
        self.gid[0] == 0xfe && self.gid[1] & 0xc0 == 0x80
    }
}

impl fmt::Display for GidEntry {
    /// `3 ::ffff:192.168.1.10 RoCE v2 eth2`, as `show_gids` shows a row.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addr = match self.ipv4() {
            Some(v4) => format!("::ffff:{v4}"),
            None => Ipv6Addr::from(self.gid).to_string(),
        };
        write!(
            f,
            "{:>3} {:<40} {:<10} {}",
            self.index,
            addr,
            self.kind.map_or("?", GidType::name),
            self.netdev.as_deref().unwrap_or("")
        )
    }
}

/// A port of an RDMA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// Its number (from 1).
    pub num: u8,
    /// Its state as sysfs gives it (`4: ACTIVE`, `1: DOWN`).
    pub state: String,
    /// Its link layer.
    pub link_layer: LinkLayer,
    /// The used entries of its GID table, by index.
    pub gids: Vec<GidEntry>,
    /// The MTU of its network interface (the interface of its GIDs), when known.
    pub netdev_mtu: Option<u32>,
}

/// The RoCE path MTU an interface MTU allows, bytes: the largest IB MTU (256 to 4096) that fits
/// with the RoCE v2 headers around it (IPv6 40, UDP 8, BTH 12, the largest extension headers 28
/// and XRC 4, ICRC 4: 96 bytes, as the kernel's `iboe_get_mtu` counts them).
pub fn roce_mtu(netdev_mtu: u32) -> Option<u32> {
    let room = netdev_mtu.checked_sub(96)?;
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|&m| m <= room)
}

impl Port {
    /// Whether the port is up (`ACTIVE`).
    pub fn is_active(&self) -> bool {
        self.state.split(':').next().map(str::trim) == Some("4")
    }
}

/// An RDMA device with its ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaDevice {
    /// Its name (`mlx5_0`).
    pub name: String,
    /// Its ports.
    pub ports: Vec<Port>,
}

fn read_trimmed(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Parses a GID as sysfs writes it (eight groups of four hex digits, or any IPv6 text).
pub fn parse_gid(s: &str) -> Option<[u8; 16]> {
    s.trim().parse::<Ipv6Addr>().ok().map(|a| a.octets())
}

/// Reads one port (`root/DEV/ports/N`). Entries whose GID is all zero are unused and left out.
pub fn read_port(dir: &Path, num: u8) -> io::Result<Port> {
    let state = read_trimmed(&dir.join("state")).unwrap_or_default();
    let link_layer = match read_trimmed(&dir.join("link_layer")).as_deref() {
        Some("Ethernet") => LinkLayer::Ethernet,
        Some("InfiniBand") => LinkLayer::InfiniBand,
        _ => LinkLayer::Other,
    };
    let mut gids = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir.join("gids")) {
        let mut idx: Vec<u8> = entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        idx.sort_unstable();
        for index in idx {
            let Some(gid) = read_trimmed(&dir.join("gids").join(index.to_string()))
                .as_deref()
                .and_then(parse_gid)
            else {
                continue;
            };
            if gid == [0; 16] {
                continue;
            }
            let attr = |what: &str| {
                read_trimmed(&dir.join("gid_attrs").join(what).join(index.to_string()))
            };
            gids.push(GidEntry {
                index,
                gid,
                kind: attr("types").as_deref().and_then(GidType::from_name),
                netdev: attr("ndevs").filter(|n| !n.is_empty()),
            });
        }
    }
    // The interface's MTU, from the class next to infiniband (`/sys/class/net/IF/mtu`).
    let netdev_mtu = gids.iter().find_map(|g| {
        let net = dir.ancestors().nth(4)?.join("net");
        read_trimmed(&net.join(g.netdev.as_ref()?).join("mtu"))?
            .parse()
            .ok()
    });
    Ok(Port {
        num,
        state,
        link_layer,
        gids,
        netdev_mtu,
    })
}

/// The RDMA devices below `root` (normally [`SYSFS_ROOT`]) with their ports, by name. A missing
/// root (no RDMA support in the kernel) is an empty list.
pub fn read_devices(root: &Path) -> io::Result<Vec<RdmaDevice>> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let mut ports = Vec::new();
        if let Ok(pe) = std::fs::read_dir(e.path().join("ports")) {
            let mut nums: Vec<u8> = pe
                .filter_map(|p| p.ok()?.file_name().to_str()?.parse().ok())
                .collect();
            nums.sort_unstable();
            for n in nums {
                ports.push(read_port(&e.path().join("ports").join(n.to_string()), n)?);
            }
        }
        out.push(RdmaDevice { name, ports });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The GID a RoCE connection should use on `port`, as perftest chooses it by default: RoCE v2
/// before v1 (v1 is not routable and falls outside the fabric's DSCP classes), an IPv4-mapped
/// address before an IPv6 one (or the other way round with `prefer_ipv6`), a global address
/// before the link-local default, then the lowest index. `None` when the table is empty.
pub fn best_gid(port: &Port, prefer_ipv6: bool) -> Option<&GidEntry> {
    port.gids.iter().min_by_key(|g| {
        (
            g.kind != Some(GidType::RoceV2),
            g.ipv4().is_some() == prefer_ipv6,
            g.is_link_local(),
            g.index,
        )
    })
}

/// What is wrong with using GID `index` of `port` for RoCE, if anything: a port that is not
/// Ethernet, not active, or an unused entry, each said by name.
pub fn check_roce_port<'a>(dev: &str, port: &'a Port, index: u8) -> Result<&'a GidEntry, String> {
    if port.link_layer != LinkLayer::Ethernet {
        return Err(format!(
            "port {} of {dev} is {}; RoCE needs an Ethernet port (an InfiniBand port is addressed \
             by LID, which this transport does not do)",
            port.num,
            match port.link_layer {
                LinkLayer::InfiniBand => "InfiniBand",
                _ => "not Ethernet",
            }
        ));
    }
    if !port.is_active() {
        return Err(format!(
            "port {} of {dev} is not active (state {:?}; see `ip link` for its interface)",
            port.num, port.state
        ));
    }
    port.gids.iter().find(|g| g.index == index).ok_or_else(|| {
        format!(
            "GID index {index} of {dev} port {} is empty; `metaroce devices` lists the used ones{}",
            port.num,
            best_gid(port, false).map_or(String::new(), |b| format!(
                " (the best here is {}, {})",
                b.index,
                b.kind.map_or("?", GidType::name)
            ))
        )
    })
}

#[cfg(test)]
mod tests;
