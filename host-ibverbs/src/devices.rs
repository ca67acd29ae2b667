//! The network interfaces the UDP transport can use.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Its name (`eth0`, `lo`, ...).
    pub name: String,
    /// Its addresses.
    pub addrs: Vec<IpAddr>,
    /// Whether it is up.
    pub up: bool,
    /// Whether it is a loopback.
    pub loopback: bool,
    /// Its MTU, when known.
    pub mtu: Option<u32>,
}

/// The interfaces with at least one IP address, by name.
pub fn interfaces() -> std::io::Result<Vec<Interface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a live out-pointer; on success the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut by_name: BTreeMap<String, Interface> = BTreeMap::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null and points at a sockaddr whose family says its type.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: the family says it is a sockaddr_in.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                IpAddr::V4(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says it is a sockaddr_in6.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        let flags = ifa.ifa_flags;
        let e = by_name.entry(name.clone()).or_insert_with(|| Interface {
            mtu: std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
                .ok()
                .and_then(|s| s.trim().parse().ok()),
            name,
            addrs: Vec::new(),
            up: flags & libc::IFF_UP as u32 != 0,
            loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
        });
        e.addrs.push(addr);
    }
    // SAFETY: `head` came from getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    Ok(by_name.into_values().collect())
}

/// The address to use for interface `name`: its first IPv4 address, else its first IPv6 one.
pub fn address_of(name: &str, prefer_v6: bool) -> Option<IpAddr> {
    let ifs = interfaces().ok()?;
    let i = ifs.into_iter().find(|i| i.name == name)?;
    let pick = |v6: bool| i.addrs.iter().copied().find(|a| a.is_ipv6() == v6);
    pick(prefer_v6).or_else(|| pick(!prefer_v6))
}

/// The MTU of the interface that holds `ip`.
pub fn mtu_of(ip: IpAddr) -> Option<u32> {
    interfaces()
        .ok()?
        .into_iter()
        .find(|i| i.addrs.contains(&ip))?
        .mtu
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed_with_its_address() {
        let ifs = interfaces().unwrap();
        let lo = ifs
            .iter()
            .find(|i| i.loopback)
            .expect("a loopback interface");
        assert!(lo.addrs.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert!(lo.up);
        assert_eq!(
            address_of(&lo.name, false),
            Some(IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
        assert_eq!(address_of("no-such-interface0", false), None);
    }
}
