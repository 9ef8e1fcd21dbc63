//! The address classifier: the one place that decides whether an IP is a public destination.
//!
//! STUB: the API below is the contract; the matching helper fills in the bodies.

use std::net::IpAddr;

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

/// Classify an address.
pub fn classify(ip: IpAddr) -> AddrClass {
    let _ = ip;
    unimplemented!("classify")
}

/// Whether the proxy may connect to `ip`: public addresses always, others only inside one of
/// `allow_cidrs`. The error carries the class that denied it.
pub fn check_destination(ip: IpAddr, allow_cidrs: &[IpNet]) -> Result<(), AddrClass> {
    let _ = (ip, allow_cidrs);
    unimplemented!("check_destination")
}
