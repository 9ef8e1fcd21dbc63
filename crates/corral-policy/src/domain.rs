//! Host normalization and domain patterns: the one matcher every path uses.
//!
//! STUB: the API below is the contract; the matching helper fills in the bodies.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A normalized destination host: a lower-case ASCII (punycode) name without trailing dot, or an
/// IP address recognised in any spelling. Never both.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("invalid host {0:?}")]
    Invalid(String),
}

/// Normalize a host as a client wrote it (URL host, Host header, CONNECT authority host part).
pub fn normalize_host(raw: &str) -> Result<Host, HostError> {
    let _ = raw;
    unimplemented!("normalize_host")
}

/// Split and normalize `host[:port]` / `[v6]:port`.
pub fn parse_authority(raw: &str) -> Result<(Host, Option<u16>), HostError> {
    let _ = raw;
    unimplemented!("parse_authority")
}

/// `example.org`, `*.example.org`, either with an optional `:PORT`; or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainPattern {
    raw: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("invalid domain pattern {0:?}")]
    Invalid(String),
}

impl DomainPattern {
    pub fn parse(raw: &str) -> Result<Self, PatternError> {
        Ok(Self {
            raw: raw.to_string(),
        })
    }

    /// Whether `host` on `port` is named by this pattern.
    pub fn matches(&self, host: &Host, port: u16) -> bool {
        let _ = (host, port);
        unimplemented!("matches")
    }

    /// The port the pattern names, if any.
    pub fn port(&self) -> Option<u16> {
        None
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl FromStr for DomainPattern {
    type Err = PatternError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for DomainPattern {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DomainPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        raw.parse().map_err(serde::de::Error::custom)
    }
}
