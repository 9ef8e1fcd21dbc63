//! The address classifier: the one place that decides whether an IP is a public destination.
//!
//! IPv4 carried inside IPv6 is unwrapped first and classified as the IPv4 address it reaches:
//! IPv4-mapped `::ffff:0:0/96`, IPv4-translated `::ffff:0:0:0/96`, IPv4-compatible `::/96`
//! (except `::` and `::1`), NAT64 `64:ff9b::/96`, local-use NAT64 `64:ff9b:1::/48` (never
//! public: a public embedded address there is still `Reserved`), 6to4 `2002::/16` and Teredo
//! `2001::/32` (the client address is the bit-inverted last 32 bits; the server address is
//! checked too). `Ipv6Addr::to_ipv4` is never used: it turns `::1` into `0.0.0.1`.
//!
//! Cloud metadata endpoints are their own class, checked before the range they sit in:
//! 169.254.169.254 (AWS, GCP, Azure, OCI, DigitalOcean, ...), 169.254.170.2 (AWS ECS task
//! metadata), 169.254.0.23 (Tencent), 168.63.129.16 (Azure wire server), 100.100.100.200
//! (Alibaba), 192.0.0.192 (OCI), fd00:ec2::/32 (AWS IPv6, fd00:ec2::254 and friends).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// What kind of address an IP is, after unwrapping IPv4 embedded in IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AddrClass {
    Public,
    Unspecified,
    Loopback,
    Private,
    LinkLocal,
    Cgnat,
    UniqueLocal,
    Multicast,
    Broadcast,
    Metadata,
    Reserved,
}

impl AddrClass {
    /// The name used in policy errors and audit lines (`loopback`, `cgnat`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            AddrClass::Public => "public",
            AddrClass::Unspecified => "unspecified",
            AddrClass::Loopback => "loopback",
            AddrClass::Private => "private",
            AddrClass::LinkLocal => "link-local",
            AddrClass::Cgnat => "cgnat",
            AddrClass::UniqueLocal => "unique-local",
            AddrClass::Multicast => "multicast",
            AddrClass::Broadcast => "broadcast",
            AddrClass::Metadata => "metadata",
            AddrClass::Reserved => "reserved",
        }
    }

    pub fn is_public(self) -> bool {
        self == AddrClass::Public
    }
}

impl std::fmt::Display for AddrClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8) -> u32 {
    u32::from_be_bytes([a, b, c, d])
}

/// Whether `ip` lies in `base/len`.
const fn in_v4(ip: u32, base: u32, len: u32) -> bool {
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    ip & mask == base & mask
}

const fn in_v6(ip: u128, base: u128, len: u32) -> bool {
    let mask = if len == 0 {
        0
    } else {
        u128::MAX << (128 - len)
    };
    ip & mask == base & mask
}

const V4_METADATA: [u32; 6] = [
    v4(169, 254, 169, 254),
    v4(169, 254, 170, 2),
    v4(169, 254, 0, 23),
    v4(168, 63, 129, 16),
    v4(100, 100, 100, 200),
    v4(192, 0, 0, 192),
];

/// (base, prefix length, class), checked in order after the metadata addresses.
const V4_RANGES: [(u32, u32, AddrClass); 16] = [
    (v4(0, 0, 0, 0), 32, AddrClass::Unspecified),
    (v4(0, 0, 0, 0), 8, AddrClass::Reserved), // "this network"
    (v4(127, 0, 0, 0), 8, AddrClass::Loopback),
    (v4(10, 0, 0, 0), 8, AddrClass::Private),
    (v4(172, 16, 0, 0), 12, AddrClass::Private),
    (v4(192, 168, 0, 0), 16, AddrClass::Private),
    (v4(169, 254, 0, 0), 16, AddrClass::LinkLocal),
    (v4(100, 64, 0, 0), 10, AddrClass::Cgnat),
    (v4(192, 0, 0, 0), 24, AddrClass::Reserved), // IETF protocol assignments
    (v4(192, 0, 2, 0), 24, AddrClass::Reserved), // TEST-NET-1
    (v4(198, 51, 100, 0), 24, AddrClass::Reserved), // TEST-NET-2
    (v4(203, 0, 113, 0), 24, AddrClass::Reserved), // TEST-NET-3
    (v4(198, 18, 0, 0), 15, AddrClass::Reserved), // benchmarking
    (v4(192, 88, 99, 0), 24, AddrClass::Reserved), // 6to4 relay anycast (deprecated)
    (v4(224, 0, 0, 0), 4, AddrClass::Multicast),
    (v4(255, 255, 255, 255), 32, AddrClass::Broadcast),
];

/// Reserved for future use (240.0.0.0/4), checked after the ranges.
const V4_FUTURE: (u32, u32) = (v4(240, 0, 0, 0), 4);

fn classify_v4(ip: Ipv4Addr) -> AddrClass {
    let n = u32::from(ip);
    if V4_METADATA.contains(&n) {
        return AddrClass::Metadata;
    }
    for (base, len, class) in V4_RANGES {
        if in_v4(n, base, len) {
            return class;
        }
    }
    if in_v4(n, V4_FUTURE.0, V4_FUTURE.1) {
        return AddrClass::Reserved;
    }
    AddrClass::Public
}

const fn v6(segs: [u16; 8]) -> u128 {
    let mut v: u128 = 0;
    let mut i = 0;
    while i < 8 {
        v = (v << 16) | segs[i] as u128;
        i += 1;
    }
    v
}

/// Where an IPv6 address carries an IPv4 address, how it is unwrapped.
enum Embedded {
    /// The IPv6 address reaches exactly this IPv4 address.
    Same(Ipv4Addr),
    /// Local-use NAT64: reaches this IPv4 address, and is never public itself.
    LocalNat64(Ipv4Addr),
    /// Teredo: (server, client).
    Teredo(Ipv4Addr, Ipv4Addr),
}

fn embedded_v4(ip: Ipv6Addr) -> Option<Embedded> {
    let n = u128::from(ip);
    let low32 = Ipv4Addr::from(n as u32);
    if let Some(m) = ip.to_ipv4_mapped() {
        return Some(Embedded::Same(m));
    }
    // IPv4-translated (SIIT, RFC 2765): ::ffff:0:a.b.c.d
    if in_v6(n, v6([0, 0, 0, 0, 0xffff, 0, 0, 0]), 96) {
        return Some(Embedded::Same(low32));
    }
    // IPv4-compatible (deprecated): ::a.b.c.d, but not :: and ::1.
    if in_v6(n, 0, 96) && n > 1 {
        return Some(Embedded::Same(low32));
    }
    if in_v6(n, v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0]), 96) {
        return Some(Embedded::Same(low32));
    }
    if in_v6(n, v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0]), 48) {
        return Some(Embedded::LocalNat64(low32));
    }
    if in_v6(n, v6([0x2002, 0, 0, 0, 0, 0, 0, 0]), 16) {
        return Some(Embedded::Same(Ipv4Addr::from((n >> 80) as u32)));
    }
    if in_v6(n, v6([0x2001, 0, 0, 0, 0, 0, 0, 0]), 32) {
        let server = Ipv4Addr::from((n >> 64) as u32);
        let client = Ipv4Addr::from(!(n as u32));
        return Some(Embedded::Teredo(server, client));
    }
    None
}

/// The IPv4 address an IPv6 address reaches, when it embeds one (for Teredo: the client).
pub fn unwrap_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    match embedded_v4(ip)? {
        Embedded::Same(a) | Embedded::LocalNat64(a) => Some(a),
        Embedded::Teredo(_, client) => Some(client),
    }
}

/// (base, prefix length, class), checked in order for IPv6 without an embedded IPv4.
const V6_RANGES: [(u128, u32, AddrClass); 13] = [
    (0, 128, AddrClass::Unspecified),
    (1, 128, AddrClass::Loopback),
    (
        v6([0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0]),
        32,
        AddrClass::Metadata,
    ),
    (v6([0xfc00, 0, 0, 0, 0, 0, 0, 0]), 7, AddrClass::UniqueLocal),
    (v6([0xfe80, 0, 0, 0, 0, 0, 0, 0]), 10, AddrClass::LinkLocal),
    (v6([0xfec0, 0, 0, 0, 0, 0, 0, 0]), 10, AddrClass::Private), // site-local (deprecated)
    (v6([0xff00, 0, 0, 0, 0, 0, 0, 0]), 8, AddrClass::Multicast),
    (
        v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0]),
        32,
        AddrClass::Reserved,
    ), // documentation
    (v6([0x3fff, 0, 0, 0, 0, 0, 0, 0]), 20, AddrClass::Reserved), // documentation (RFC 9637)
    (v6([0x2001, 2, 0, 0, 0, 0, 0, 0]), 48, AddrClass::Reserved), // benchmarking
    (
        v6([0x2001, 0x10, 0, 0, 0, 0, 0, 0]),
        28,
        AddrClass::Reserved,
    ), // ORCHID
    (
        v6([0x2001, 0x20, 0, 0, 0, 0, 0, 0]),
        28,
        AddrClass::Reserved,
    ), // ORCHIDv2
    (v6([0x5f00, 0, 0, 0, 0, 0, 0, 0]), 16, AddrClass::Reserved), // SRv6 SIDs
];

fn classify_v6(ip: Ipv6Addr) -> AddrClass {
    match embedded_v4(ip) {
        Some(Embedded::Same(a)) => return classify_v4(a),
        Some(Embedded::LocalNat64(a)) => {
            return match classify_v4(a) {
                AddrClass::Public => AddrClass::Reserved,
                c => c,
            };
        }
        Some(Embedded::Teredo(server, client)) => {
            let c = classify_v4(client);
            return if c.is_public() {
                classify_v4(server)
            } else {
                c
            };
        }
        None => {}
    }
    let n = u128::from(ip);
    for (base, len, class) in V6_RANGES {
        if in_v6(n, base, len) {
            return class;
        }
    }
    // Only 2000::/3 is allocated global unicast (100::/64 discard, the rest of ::/8, ...).
    if !in_v6(n, v6([0x2000, 0, 0, 0, 0, 0, 0, 0]), 3) {
        return AddrClass::Reserved;
    }
    AddrClass::Public
}

/// IPv6 prefixes inside 2000::/3 that carry an IPv4 address (6to4, Teredo): the classifier
/// decides them by the IPv4 address inside, which a prefix filter cannot look at.
const V6_GLOBAL_EMBEDDING: [(u128, u32); 2] = [
    (v6([0x2002, 0, 0, 0, 0, 0, 0, 0]), 16),
    (v6([0x2001, 0, 0, 0, 0, 0, 0, 0]), 32),
];

/// The classifier as prefixes, for filters that can only match whole prefixes (a Kubernetes
/// NetworkPolicy's `ipBlock`): an address is public for such a filter when it lies in one of
/// `within` and in none of `except`. Stricter than [`classify`], never looser: every address
/// the prefixes let through is public, while some public addresses (6to4, Teredo) are left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicPrefixes {
    /// `0.0.0.0/0` and `2000::/3` (outside global unicast no IPv6 address is public; IPv4 carried
    /// in IPv6 outside it, `::ffff:0:0/96`, NAT64, is thereby left out whole).
    pub within: Vec<IpNet>,
    /// Every non-public IPv4 range and metadata address, the non-public IPv6 ranges inside
    /// 2000::/3, and the IPv6 prefixes there that embed IPv4; each inside one of `within`,
    /// none inside another.
    pub except: Vec<IpNet>,
}

/// The one list of [`classify`]'s ranges, as prefixes (see [`PublicPrefixes`]).
pub fn public_prefixes() -> PublicPrefixes {
    let v4net = |n: u32, len: u32| IpNet::new(Ipv4Addr::from(n).into(), len as u8);
    let v6net = |n: u128, len: u32| IpNet::new(Ipv6Addr::from(n).into(), len as u8);
    let global: IpNet = v6net(v6([0x2000, 0, 0, 0, 0, 0, 0, 0]), 3).expect("valid prefix");
    let within = vec![v4net(0, 0).expect("valid prefix"), global];
    let mut all: Vec<IpNet> = V4_METADATA
        .iter()
        .map(|&n| v4net(n, 32))
        .chain(V4_RANGES.iter().map(|&(n, len, _)| v4net(n, len)))
        .chain([v4net(V4_FUTURE.0, V4_FUTURE.1)])
        .chain(V6_RANGES.iter().map(|&(n, len, _)| v6net(n, len)))
        .chain(V6_GLOBAL_EMBEDDING.iter().map(|&(n, len)| v6net(n, len)))
        .map(|r| r.expect("valid prefix").trunc())
        .filter(|net| within.iter().any(|w| w.contains(net) && w != net))
        .collect();
    all.sort();
    all.dedup();
    let except = all
        .iter()
        .filter(|net| !all.iter().any(|o| o != *net && o.contains(*net)))
        .copied()
        .collect();
    PublicPrefixes { within, except }
}

/// Classify an address.
pub fn classify(ip: IpAddr) -> AddrClass {
    match ip {
        IpAddr::V4(a) => classify_v4(a),
        IpAddr::V6(a) => classify_v6(a),
    }
}

/// Whether the proxy may connect to `ip`: public addresses always, others only inside one of
/// `allow_cidrs`. The error carries the class that denied it.
///
/// An IPv6 address that embeds an IPv4 address is allowed when either the IPv6 address or the
/// IPv4 address it reaches is inside an allowed net (`10.0.0.0/8` allows `::ffff:10.1.2.3`).
pub fn check_destination(ip: IpAddr, allow_cidrs: &[IpNet]) -> Result<(), AddrClass> {
    let class = classify(ip);
    if class.is_public() {
        return Ok(());
    }
    let inner = match ip {
        IpAddr::V6(a) => unwrap_v4(a).map(IpAddr::V4),
        IpAddr::V4(_) => None,
    };
    let listed = allow_cidrs
        .iter()
        .any(|net| net.contains(&ip) || inner.is_some_and(|i| net.contains(&i)));
    if listed { Ok(()) } else { Err(class) }
}

#[cfg(test)]
mod tests;
