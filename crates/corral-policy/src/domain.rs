//! Host normalization and domain patterns: the one matcher every path uses.
//!
//! Every host the proxy sees (URL host, `Host` header, CONNECT authority) and every pattern a
//! policy names goes through [`normalize_host`], so the two sides are compared in one form:
//!
//! - lower case, one trailing dot removed, internationalized names converted to punycode
//!   (UTS-46 non-transitional processing, the WHATWG URL standard's "domain to ASCII");
//! - after conversion a name consists of labels of ASCII letters, digits, `-` and `_`, each
//!   1..=63 bytes, the whole name at most 253 bytes. `_` is accepted: it is legal in DNS names,
//!   occurs in real hosts (legacy S3 buckets, some CDN nodes), and is not a delimiter in any
//!   syntax the proxy parses, so it cannot shift a label boundary. Everything else (space,
//!   CR, LF, NUL, `@`, `/`, `\`, `%`, `:`, `*`, ...) is rejected, which also rejects IPv6 zone
//!   ids (`fe80::1%eth0`) and ports smuggled into a host (`evil.com:443.example.com`);
//! - IP literals in every spelling are addresses, never names: dotted quads, the shortened and
//!   numeric forms `inet_aton` and the WHATWG URL parser accept (`127.1`, `2130706433`,
//!   `0x7f000001`, `0177.0.0.1`, `0x7f.1`, `127.0.0.1.`), bracketed IPv6 (`[::1]`,
//!   `[::ffff:127.0.0.1]`). A name whose last label is a number (all digits, or `0x` + hex) is
//!   an IPv4 attempt, as in the WHATWG URL standard, and is rejected when it does not parse
//!   as one (`1.2.3.4.5`, `foo.123`, `0x7g.1`... `09.1.1.1`).
//!
//! Patterns ([`DomainPattern`]): `example.org` names that host only; `*.example.org` every
//! subdomain at any depth but not the apex; either may carry `:PORT`; an IP literal names that
//! address only. A bare `*` is refused: a jail that may reach everything is
//! `network.mode = "host"`, said explicitly. Matching is exact on labels, so `notexample.org`
//! and `example.org.evil.net` never match `example.org` or `*.example.org`. A pattern without a
//! port matches every port; which ports are reachable without one (443 for CONNECT, 80 for plain
//! HTTP) is the proxy's rule, not the matcher's.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use idna::uts46::{AsciiDenyList, DnsLength, Hyphens, Uts46};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A normalized destination host: a lower-case ASCII (punycode) name without trailing dot, or an
/// IP address recognised in any spelling. Never both.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

impl fmt::Display for Host {
    /// The form a host takes in an authority: names as they are, IPv6 in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

impl Host {
    /// The name, if this host is one.
    pub fn as_name(&self) -> Option<&str> {
        match self {
            Host::Name(n) => Some(n),
            Host::Ip(_) => None,
        }
    }

    /// The address, if this host is an IP literal.
    pub fn as_ip(&self) -> Option<IpAddr> {
        match self {
            Host::Name(_) => None,
            Host::Ip(ip) => Some(*ip),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// Kept for callers that build one without a reason.
    #[error("invalid host {0:?}")]
    Invalid(String),
    /// What was wrong with the host, in words.
    #[error("invalid host {host:?}: {reason}")]
    Rejected { host: String, reason: String },
}

fn reject(host: &str, reason: impl Into<String>) -> HostError {
    HostError::Rejected {
        host: host.to_string(),
        reason: reason.into(),
    }
}

/// Longest name DNS can carry, without the trailing dot.
const MAX_NAME: usize = 253;
/// Longest label.
const MAX_LABEL: usize = 63;

/// Normalize a host as a client wrote it (URL host, Host header, CONNECT authority host part).
///
/// Accepts a name, an IPv4 literal in any spelling, or an IPv6 literal with or without
/// brackets (without brackets it must contain no port: use [`parse_authority`] for
/// `host:port`).
pub fn normalize_host(raw: &str) -> Result<Host, HostError> {
    if raw.is_empty() {
        return Err(reject(raw, "empty host"));
    }
    if let Some(inner) = raw.strip_prefix('[') {
        let Some(inner) = inner.strip_suffix(']') else {
            return Err(reject(
                raw,
                "unclosed `[` (an IPv6 literal is written [ADDR])",
            ));
        };
        return parse_ipv6(raw, inner).map(|ip| Host::Ip(IpAddr::V6(ip)));
    }
    if raw.contains(':') {
        // Only an IPv6 literal may contain a colon here; a port belongs in parse_authority.
        return parse_ipv6(raw, raw).map(|ip| Host::Ip(IpAddr::V6(ip)));
    }
    if let Some(bad) = raw.chars().find(|c| c.is_ascii() && !is_name_char(*c)) {
        return Err(reject(
            raw,
            format!("character {bad:?} is not allowed in a host"),
        ));
    }
    // UTS-46 for every name, ASCII included: it lower-cases, and it checks `xn--` labels.
    let ascii = Uts46::new()
        .to_ascii(
            raw.as_bytes(),
            AsciiDenyList::EMPTY,
            Hyphens::Allow,
            DnsLength::Ignore,
        )
        .map_err(|_| reject(raw, "not a valid internationalized domain name (UTS-46)"))?
        .into_owned();
    // IDNA maps some non-ASCII characters onto ASCII ones (fullwidth `／` becomes `/`,
    // fullwidth digits become digits): check the result, not only the input.
    if let Some(bad) = ascii.chars().find(|c| !is_name_char(*c)) {
        return Err(reject(
            raw,
            format!("character {bad:?} is not allowed in a host (after IDNA mapping)"),
        ));
    }
    let name = ascii.strip_suffix('.').unwrap_or(&ascii);
    if name.is_empty() {
        return Err(reject(raw, "empty host"));
    }
    let labels: Vec<&str> = name.split('.').collect();
    if ends_in_number(labels[labels.len() - 1]) {
        return match parse_ipv4_labels(&labels) {
            Some(ip) => Ok(Host::Ip(IpAddr::V4(ip))),
            None => Err(reject(
                raw,
                "its last label is a number but it is not a valid IPv4 address",
            )),
        };
    }
    if labels.iter().any(|l| l.is_empty()) {
        return Err(reject(
            raw,
            "empty label (two dots in a row, or a leading dot)",
        ));
    }
    if let Some(l) = labels.iter().find(|l| l.len() > MAX_LABEL) {
        return Err(reject(
            raw,
            format!("label {l:?} is {} bytes, more than {MAX_LABEL}", l.len()),
        ));
    }
    if name.len() > MAX_NAME {
        return Err(reject(
            raw,
            format!("name is {} bytes, more than {MAX_NAME}", name.len()),
        ));
    }
    Ok(Host::Name(name.to_string()))
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'
}

fn parse_ipv6(raw: &str, inner: &str) -> Result<Ipv6Addr, HostError> {
    if inner.contains('%') {
        return Err(reject(
            raw,
            "IPv6 zone ids (`%eth0`) are not allowed in a destination",
        ));
    }
    inner.parse::<Ipv6Addr>().map_err(|_| {
        reject(
            raw,
            "not a valid IPv6 address (and `:` is not allowed in a name)",
        )
    })
}

/// WHATWG URL "ends in a number": the last label is all digits, or `0x`/`0X` followed by hex
/// digits (possibly none).
fn ends_in_number(label: &str) -> bool {
    if !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    match label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"))
    {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => false,
    }
}

/// One part of an IPv4 literal as inet_aton and the WHATWG URL parser read it: `0x` hex,
/// leading-zero octal, or decimal.
fn parse_ipv4_part(part: &str) -> Option<u64> {
    if part.is_empty() {
        return None;
    }
    let (digits, radix) =
        if let Some(h) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (h, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    if digits.is_empty() {
        // "0x" alone is zero for WHATWG (and glibc).
        return Some(0);
    }
    if !digits.bytes().all(|b| (b as char).is_digit(radix)) {
        return None;
    }
    // Anything longer than this is out of range whatever the radix; avoid overflow.
    if digits.trim_start_matches('0').len() > 12 {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// Parse already-split labels (trailing dot removed) as an IPv4 address in any inet_aton form:
/// `a.b.c.d`, `a.b.c` (c is 16 bits), `a.b` (b is 24 bits), `a` (32 bits).
fn parse_ipv4_labels(labels: &[&str]) -> Option<Ipv4Addr> {
    if labels.is_empty() || labels.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(labels.len());
    for l in labels {
        nums.push(parse_ipv4_part(l)?);
    }
    let (last, init) = nums.split_last()?;
    if init.iter().any(|n| *n > 255) {
        return None;
    }
    let last_bits = 8 * (5 - labels.len() as u32);
    if *last >= 1u64 << last_bits {
        return None;
    }
    let mut v: u64 = *last;
    for (i, n) in init.iter().enumerate() {
        v |= n << (8 * (3 - i as u32));
    }
    Some(Ipv4Addr::from(v as u32))
}

/// Split and normalize `host[:port]` / `[v6]:port`.
///
/// The port, when present, is 1..=65535 written in decimal digits only. A bare IPv6 address
/// (several colons, no brackets) is refused: it is ambiguous with a port.
pub fn parse_authority(raw: &str) -> Result<(Host, Option<u16>), HostError> {
    let (host, port) = if raw.starts_with('[') {
        let Some(close) = raw.find(']') else {
            return Err(reject(
                raw,
                "unclosed `[` (an IPv6 literal is written [ADDR])",
            ));
        };
        let (h, rest) = raw.split_at(close + 1);
        match rest {
            "" => (h, None),
            _ => match rest.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None => {
                    return Err(reject(raw, "unexpected text after `]` (expected `:PORT`)"));
                }
            },
        }
    } else {
        match raw.matches(':').count() {
            0 => (raw, None),
            1 => {
                let (h, p) = raw.split_once(':').expect("one colon");
                (h, Some(p))
            }
            _ => {
                return Err(reject(
                    raw,
                    "more than one `:` (write an IPv6 address in brackets: [ADDR]:PORT)",
                ));
            }
        }
    };
    let port =
        match port {
            None => None,
            Some(p) => Some(parse_port(p).ok_or_else(|| {
                reject(raw, format!("port {p:?} is not a number from 1 to 65535"))
            })?),
        };
    if host.is_empty() {
        return Err(reject(raw, "empty host"));
    }
    let host = normalize_host(host).map_err(|e| match e {
        HostError::Rejected { reason, .. } => reject(raw, reason),
        HostError::Invalid(_) => reject(raw, "invalid host part"),
    })?;
    Ok((host, port))
}

fn parse_port(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match p.parse::<u16>() {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

/// `example.org`, `*.example.org`, either with an optional `:PORT`; or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainPattern {
    target: Target,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Target {
    /// Exactly this normalized name.
    Exact(String),
    /// Any name strictly below this normalized suffix.
    Subdomains(String),
    /// This address (IPv4-mapped IPv6 compared as the IPv4 address).
    Ip(IpAddr),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Kept for callers that build one without a reason.
    #[error("invalid domain pattern {0:?}")]
    Invalid(String),
    /// What was wrong with the pattern, in words, and the form that is expected.
    #[error(
        "invalid domain pattern {pattern:?}: {reason} (expected `example.org`, `*.example.org`, an IP address, each with an optional `:PORT`)"
    )]
    Rejected { pattern: String, reason: String },
}

fn bad_pattern(pattern: &str, reason: impl Into<String>) -> PatternError {
    PatternError::Rejected {
        pattern: pattern.to_string(),
        reason: reason.into(),
    }
}

fn host_reason(e: HostError) -> String {
    match e {
        HostError::Rejected { reason, .. } => reason,
        HostError::Invalid(h) => format!("invalid host {h:?}"),
    }
}

impl DomainPattern {
    pub fn parse(raw: &str) -> Result<Self, PatternError> {
        if raw.is_empty() {
            return Err(bad_pattern(raw, "empty pattern"));
        }
        if raw == "*" || raw.starts_with("*:") {
            return Err(bad_pattern(
                raw,
                "`*` alone would allow every destination; to give the jail the host's whole network say `network.mode = \"host\"`",
            ));
        }
        // Split off the port. IPv6 with a port must be bracketed; a bare IPv6 literal (two or
        // more colons) has no port.
        let (host, port) = if raw.starts_with('[') {
            match parse_authority(raw) {
                Ok((host, port)) => return Self::ip_pattern(raw, host, port),
                Err(e) => return Err(bad_pattern(raw, host_reason(e))),
            }
        } else if raw.matches(':').count() >= 2 {
            (raw, None)
        } else if let Some((h, p)) = raw.split_once(':') {
            let port = parse_port(p).ok_or_else(|| {
                bad_pattern(raw, format!("port {p:?} is not a number from 1 to 65535"))
            })?;
            (h, Some(port))
        } else {
            (raw, None)
        };
        if let Some(suffix) = host.strip_prefix("*.") {
            if suffix.contains('*') {
                return Err(bad_pattern(
                    raw,
                    "`*` is allowed only once, as the whole first label (`*.example.org`)",
                ));
            }
            return match normalize_host(suffix) {
                Ok(Host::Name(n)) => Ok(Self {
                    target: Target::Subdomains(n),
                    port,
                }),
                Ok(Host::Ip(_)) => Err(bad_pattern(
                    raw,
                    "`*.` applies to names, not IP addresses (use a CIDR in network.allow_cidrs)",
                )),
                Err(e) => Err(bad_pattern(raw, host_reason(e))),
            };
        }
        if host.contains('*') {
            return Err(bad_pattern(
                raw,
                "`*` is allowed only as the whole first label (`*.example.org`)",
            ));
        }
        match normalize_host(host) {
            Ok(h @ Host::Ip(_)) => Self::ip_pattern(raw, h, port),
            Ok(Host::Name(n)) => Ok(Self {
                target: Target::Exact(n),
                port,
            }),
            Err(e) => Err(bad_pattern(raw, host_reason(e))),
        }
    }

    fn ip_pattern(raw: &str, host: Host, port: Option<u16>) -> Result<Self, PatternError> {
        match host {
            Host::Ip(ip) => Ok(Self {
                target: Target::Ip(ip.to_canonical()),
                port,
            }),
            Host::Name(_) => Err(bad_pattern(raw, "expected an IP address")),
        }
    }

    /// Whether `host` on `port` is named by this pattern.
    pub fn matches(&self, host: &Host, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match (&self.target, host) {
            (Target::Exact(n), Host::Name(h)) => n == h,
            (Target::Subdomains(suffix), Host::Name(h)) => {
                h.len() > suffix.len() + 1
                    && h.ends_with(suffix.as_str())
                    && h.as_bytes()[h.len() - suffix.len() - 1] == b'.'
            }
            (Target::Ip(ip), Host::Ip(h)) => *ip == h.to_canonical(),
            _ => false,
        }
    }

    /// The port the pattern names, if any.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// Whether this is a `*.` pattern (subdomains, not the apex).
    pub fn is_wildcard(&self) -> bool {
        matches!(self.target, Target::Subdomains(_))
    }

    /// The normalized name (the suffix for `*.` patterns), or None for an IP pattern.
    pub fn name(&self) -> Option<&str> {
        match &self.target {
            Target::Exact(n) | Target::Subdomains(n) => Some(n),
            Target::Ip(_) => None,
        }
    }

    /// The address for an IP pattern.
    pub fn ip(&self) -> Option<IpAddr> {
        match &self.target {
            Target::Ip(ip) => Some(*ip),
            _ => None,
        }
    }
}

impl fmt::Display for DomainPattern {
    /// The canonical form: normalized host, IPv6 bracketed when a port follows.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.target, self.port) {
            (Target::Exact(n), _) => f.write_str(n)?,
            (Target::Subdomains(n), _) => write!(f, "*.{n}")?,
            (Target::Ip(IpAddr::V4(ip)), _) => write!(f, "{ip}")?,
            (Target::Ip(IpAddr::V6(ip)), None) => write!(f, "{ip}")?,
            (Target::Ip(IpAddr::V6(ip)), Some(_)) => write!(f, "[{ip}]")?,
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
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

#[cfg(test)]
mod tests;
