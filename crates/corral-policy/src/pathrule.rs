//! Network rules by method and path: `network.allow = ["GET api.github.com/repos/myorg/**"]`.
//!
//! Grammar of one entry: `[METHOD[,METHOD...] ]HOST[:PORT]/PATH-GLOB`.
//!
//! - `METHOD`: an HTTP method token (RFC 9110 `tchar`s), compared exactly (methods are
//!   case-sensitive); none means every method.
//! - `HOST[:PORT]`: a [`DomainPattern`] as in a plain entry (`*.example.org` included).
//! - `PATH-GLOB`: `/` then segments separated by `/`; a segment is literal text, `*` (exactly
//!   one non-empty segment) or `**` (any number of segments, none included: `/myorg/**` matches
//!   `/myorg`, `/myorg/` and `/myorg/a/b`). `*` inside a segment, empty segments (`//`), `.` and
//!   `..`, `%`, `\`, `;`, a query (`?`) or a fragment (`#`) are refused: rules are written in the
//!   normalised form requests are matched in ([`crate::reqpath`]). Matching is case-sensitive.
//!
//! A request's path is matched only after [`crate::reqpath::normalize`]; the proxy forwards
//! exactly the normalised form it matched.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::domain::{DomainPattern, Host};

/// One `network.allow` entry: a plain host pattern, or a rule by method and path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowEntry {
    Host(DomainPattern),
    Path(PathRule),
}

impl AllowEntry {
    /// A plain pattern unless the entry names a method (a space) or a path (a `/`).
    pub fn parse(raw: &str) -> Result<Self, AllowError> {
        if raw.contains(' ') || raw.contains('/') {
            return Ok(AllowEntry::Path(PathRule::parse(raw)?));
        }
        Ok(AllowEntry::Host(DomainPattern::parse(raw)?))
    }
}

/// Why an allow entry was refused: as a host pattern, or as a path rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllowError {
    #[error(transparent)]
    Host(#[from] crate::domain::PatternError),
    #[error(transparent)]
    Path(#[from] PathRuleError),
}

/// `[METHODS ]HOST[:PORT]/GLOB`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathRule {
    /// Empty: every method.
    methods: Vec<String>,
    host: DomainPattern,
    glob: Vec<GlobSegment>,
}

/// One `/`-separated piece of a rule's path glob.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum GlobSegment {
    Literal(String),
    /// One non-empty segment.
    One,
    /// Any number of segments, none included.
    Any,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid network rule {entry:?}: {reason} (expected `[METHOD[,METHOD...] ]HOST[:PORT]/PATH`, e.g. `GET api.github.com/repos/myorg/**`)"
)]
pub struct PathRuleError {
    pub entry: String,
    pub reason: String,
}

/// RFC 9110 `tchar`.
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Characters a rule's literal segment may hold: `pchar` without `%` (rules are written
/// decoded), `;` (path parameters are refused in requests) and `:`/`@`/`=` are fine.
fn rule_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._~!$&'()*+,=:@".contains(c)
}

impl PathRule {
    pub fn parse(raw: &str) -> Result<Self, PathRuleError> {
        let bad = |reason: &str| PathRuleError {
            entry: raw.to_string(),
            reason: reason.to_string(),
        };
        if !raw.contains('/') {
            return Err(bad(
                "a host cannot contain a space, and a rule with methods needs a path (`GET host/**` for every path)",
            ));
        }
        let (methods, rest) = match raw.split_once(' ') {
            Some((m, rest)) => (parse_methods(m).map_err(|r| bad(&r))?, rest),
            None => (Vec::new(), raw),
        };
        if rest.contains(' ') {
            return Err(bad(
                "only one space, between the methods and the host, is allowed",
            ));
        }
        let Some(slash) = rest.find('/') else {
            return Err(bad(
                "a rule with methods needs a path: write `HOST/**` for every path",
            ));
        };
        let (host, path) = rest.split_at(slash);
        let host = DomainPattern::parse(host).map_err(|e| bad(&e.to_string()))?;
        if host.ip().is_some() {
            return Err(bad(
                "path rules need a host name (an IP-literal CONNECT cannot be decided per request: TLS to an address is never terminated)",
            ));
        }
        let glob = parse_glob(path).map_err(|r| bad(&r))?;
        Ok(PathRule {
            methods,
            host,
            glob,
        })
    }

    /// The host pattern the rule is for.
    pub fn host(&self) -> &DomainPattern {
        &self.host
    }

    /// The methods the rule allows; empty is every method.
    pub fn methods(&self) -> &[String] {
        &self.methods
    }

    /// Whether the rule is for `host` on `port` (the port as [`DomainPattern::matches`]).
    pub fn names_host(&self, host: &Host, port: u16) -> bool {
        self.host.matches(host, port)
    }

    /// Whether `method` on the normalised path `segments` ([`crate::reqpath::Normalized`]) is
    /// allowed by this rule (the host is checked apart, [`PathRule::names_host`]).
    pub fn allows(&self, method: &str, segments: &[String]) -> bool {
        (self.methods.is_empty() || self.methods.iter().any(|m| m == method))
            && glob_matches(&self.glob, segments)
    }

    /// The glob as written: `/repos/myorg/**`.
    pub fn path(&self) -> String {
        let mut s = String::new();
        for seg in &self.glob {
            s.push('/');
            match seg {
                GlobSegment::Literal(l) => s.push_str(l),
                GlobSegment::One => s.push('*'),
                GlobSegment::Any => s.push_str("**"),
            }
        }
        if s.is_empty() {
            s.push('/');
        }
        s
    }
}

fn parse_methods(m: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for t in m.split(',') {
        if t.is_empty() || !t.bytes().all(is_tchar) {
            return Err(format!(
                "method {t:?} is not an HTTP method token (write `GET` or `GET,POST`)"
            ));
        }
        if t.bytes().any(|b| b.is_ascii_lowercase()) {
            return Err(format!(
                "method {t:?} has lower-case letters: methods are case-sensitive, write {:?}",
                t.to_ascii_uppercase()
            ));
        }
        if !out.iter().any(|o| o == t) {
            out.push(t.to_string());
        }
    }
    Ok(out)
}

fn parse_glob(path: &str) -> Result<Vec<GlobSegment>, String> {
    if let Some(c) = path.chars().find(|c| "?#".contains(*c)) {
        return Err(format!(
            "{c:?}: rules match the path only, never a query or a fragment"
        ));
    }
    if path == "/" {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for seg in path[1..].split('/') {
        out.push(match seg {
            "" => return Err("empty path segment (`//`, or a trailing `/`)".into()),
            "." | ".." => return Err(format!("`{seg}` segments are not allowed in a rule")),
            "*" => GlobSegment::One,
            "**" => GlobSegment::Any,
            s if s.contains('*') => {
                return Err(format!(
                    "segment {s:?}: `*` and `**` must be a whole segment"
                ));
            }
            s => {
                if let Some(c) = s.chars().find(|c| !rule_char(*c)) {
                    return Err(format!(
                        "character {c:?} in segment {s:?} (write paths decoded, without `%`, `\\`, `;`)"
                    ));
                }
                GlobSegment::Literal(s.to_string())
            }
        });
    }
    Ok(out)
}

/// Glob segments against path segments. `**` backtracks; rules are short, so this is cheap.
fn glob_matches(glob: &[GlobSegment], path: &[String]) -> bool {
    match glob.split_first() {
        None => path.is_empty(),
        Some((GlobSegment::Any, rest)) => (0..=path.len()).any(|i| glob_matches(rest, &path[i..])),
        Some((seg, rest)) => match path.split_first() {
            None => false,
            Some((p, more)) => {
                let ok = match seg {
                    GlobSegment::Literal(l) => l == p,
                    GlobSegment::One => !p.is_empty(),
                    GlobSegment::Any => unreachable!("handled above"),
                };
                ok && glob_matches(rest, more)
            }
        },
    }
}

impl fmt::Display for PathRule {
    /// The canonical form: `GET,POST host:port/path`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.methods.is_empty() {
            write!(f, "{} ", self.methods.join(","))?;
        }
        write!(f, "{}{}", self.host, self.path())
    }
}

impl FromStr for PathRule {
    type Err = PathRuleError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for PathRule {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PathRule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        raw.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(p: &str) -> Vec<String> {
        crate::reqpath::normalize(p).unwrap().segments
    }

    #[test]
    fn entries_parse_to_their_kind() {
        assert!(matches!(
            AllowEntry::parse("github.com").unwrap(),
            AllowEntry::Host(_)
        ));
        let r = PathRule::parse("GET,POST API.github.com:8443/repos/myorg/**").unwrap();
        assert_eq!(r.to_string(), "GET,POST api.github.com:8443/repos/myorg/**");
        assert_eq!(r.methods(), ["GET", "POST"]);
        let r = PathRule::parse("github.com/").unwrap();
        assert_eq!(r.to_string(), "github.com/");
        let r = PathRule::parse("*.github.com/*/x").unwrap();
        assert_eq!(r.to_string(), "*.github.com/*/x");
    }

    #[test]
    fn malformed_rules_are_refused_naming_the_entry() {
        for (raw, why) in [
            ("get github.com/a", "lower-case"),
            ("G(T github.com/a", "not an HTTP method token"),
            (",GET github.com/a", "not an HTTP method token"),
            ("GET github.com", "needs a path"),
            ("GET  github.com/a", "only one space"),
            ("github.com/a?x=1", "query"),
            ("github.com/a#f", "query or a fragment"),
            ("github.com/a/../b", "`..`"),
            ("github.com/a/./b", "`.`"),
            ("github.com//a", "empty path segment"),
            ("github.com/a/", "empty path segment"),
            ("github.com/a*/b", "whole segment"),
            ("github.com/***", "whole segment"),
            ("github.com/a%2Fb", "'%'"),
            ("github.com/a\\b", "'\\\\'"),
            ("github.com/a;x", "';'"),
            ("10.0.0.1/a", "host name"),
            ("*/a", "`*` alone"),
            ("exa mple.com/a", "lower-case"),
            ("exa mple.com", "cannot contain a space"),
        ] {
            let e = AllowEntry::parse(raw).unwrap_err().to_string();
            assert!(e.contains(&format!("{raw:?}")), "{raw}: {e}");
            assert!(e.contains(why), "{raw}: {e} (wanted {why})");
        }
    }

    #[test]
    fn globs_match_whole_segments() {
        let r = PathRule::parse("github.com/myorg/**").unwrap();
        for ok in ["/myorg", "/myorg/", "/myorg/a", "/myorg/a/b/c"] {
            assert!(r.allows("GET", &segs(ok)), "{ok}");
        }
        for no in ["/", "/myorgx", "/MyOrg/a", "/other/myorg", "/myor"] {
            assert!(!r.allows("GET", &segs(no)), "{no}");
        }
        let r = PathRule::parse("GET github.com/*/ok").unwrap();
        assert!(r.allows("GET", &segs("/a/ok")));
        assert!(!r.allows("POST", &segs("/a/ok")));
        assert!(!r.allows("get", &segs("/a/ok")));
        assert!(!r.allows("GET", &segs("/a/b/ok")));
        assert!(!r.allows("GET", &segs("/ok")));
        let r = PathRule::parse("github.com/").unwrap();
        assert!(r.allows("GET", &segs("/")));
        assert!(!r.allows("GET", &segs("/a")));
        let r = PathRule::parse("github.com/**/raw").unwrap();
        assert!(r.allows("GET", &segs("/raw")));
        assert!(r.allows("GET", &segs("/a/b/raw")));
        assert!(!r.allows("GET", &segs("/a/b/raw/x")));
    }

    #[test]
    fn serde_round_trips_the_canonical_form() {
        let r = PathRule::parse("GET github.com/myorg/**").unwrap();
        let j = serde_json::to_string(&r).unwrap();
        assert_eq!(j, "\"GET github.com/myorg/**\"");
        assert_eq!(serde_json::from_str::<PathRule>(&j).unwrap(), r);
    }
}
