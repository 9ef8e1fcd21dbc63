//! A request target's path in the one form path rules ([`crate::pathrule`]) are matched in and
//! the proxy forwards: decide on this form, send this form, never another.
//!
//! - origin-form only (`/path[?query]`); the caller turns an absolute-form target into its
//!   path after checking its authority;
//! - percent-escapes must be two hex digits; an escaped unreserved character (`%41`, `%2e`) is
//!   decoded, any other escape kept with upper-case hex; an escaped `/`, `\`, `;`, `%` (double
//!   encoding), NUL or control character is refused, as is a raw `\`, `;` (path parameters:
//!   `/a/..;/b` reads as `/a/../b` to some servers), `#`, space, control or non-ASCII byte;
//! - the decoded bytes of each segment must be valid UTF-8 (overlong forms such as `%C0%AE`
//!   are refused);
//! - empty segments (`//`) are collapsed, `.` and `..` resolved as RFC 3986 `remove_dot_segments`
//!   does (after decoding, so `%2e%2e` is `..`), and `..` above the root is refused;
//! - a trailing `/` is kept (an empty last segment), the query is kept as sent (it is never
//!   matched), case is kept (matching is case-sensitive).

/// A normalised origin-form target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    /// The path's segments; a trailing `/` is an empty last segment; `/` alone is none.
    pub segments: Vec<String>,
    /// The query as sent, without `?`.
    pub query: Option<String>,
}

impl Normalized {
    /// The normalised path: `/a/b`, `/a/`, `/`.
    pub fn path(&self) -> String {
        format!("/{}", self.segments.join("/"))
    }

    /// The target to forward: the normalised path and the query as sent.
    pub fn target(&self) -> String {
        match &self.query {
            Some(q) => format!("{}?{q}", self.path()),
            None => self.path(),
        }
    }
}

/// Why a target was refused (answered with `400`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("request target {target:?}: {reason}")]
pub struct PathError {
    pub target: String,
    pub reason: String,
}

struct Reason(String);

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~".contains(&b)
}

/// Normalise an origin-form target (see the module text).
pub fn normalize(target: &str) -> Result<Normalized, PathError> {
    let err = |reason: String| PathError {
        target: target.to_string(),
        reason,
    };
    if let Some(b) = target.bytes().find(|b| !b.is_ascii_graphic() || *b == b'#') {
        return Err(err(format!(
            "byte 0x{b:02x} is not allowed in a request target (control, space, non-ASCII or `#`)"
        )));
    }
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q.to_string())),
        None => (target, None),
    };
    let Some(rest) = path.strip_prefix('/') else {
        return Err(err(
            "only an origin-form path (`/...`) can be decided by a path rule".into(),
        ));
    };
    let raw: Vec<&str> = rest.split('/').collect();
    let mut out: Vec<String> = Vec::new();
    for (i, seg) in raw.iter().enumerate() {
        let last = i + 1 == raw.len();
        let seg = decode_segment(seg).map_err(|r| err(r.0))?;
        match seg.as_str() {
            "" | "." => {}
            ".." => {
                if out.pop().is_none() {
                    return Err(err("`..` goes above the root".into()));
                }
            }
            _ => {
                out.push(seg);
                continue;
            }
        }
        // An empty, `.` or `..` last segment leaves a directory: the path ends in `/`.
        if last && !out.is_empty() {
            out.push(String::new());
        }
    }
    Ok(Normalized {
        segments: out,
        query,
    })
}

/// One segment with unreserved escapes decoded and the others upper-cased; refused as the
/// module text says.
fn decode_segment(seg: &str) -> Result<String, Reason> {
    let bytes = seg.as_bytes();
    let mut text = String::with_capacity(seg.len());
    let mut decoded: Vec<u8> = Vec::with_capacity(seg.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| {
                let h = std::str::from_utf8(h).ok()?;
                u8::from_str_radix(h, 16)
                    .ok()
                    .filter(|_| h.bytes().all(|c| c.is_ascii_hexdigit()))
            });
            let Some(v) = hex else {
                return Err(Reason(format!("invalid percent escape in segment {seg:?}")));
            };
            match v {
                b'/' | b'\\' | b';' | b'%' => {
                    return Err(Reason(format!(
                        "an escaped {:?} (%{v:02X}) in segment {seg:?} is refused: servers disagree on what it means",
                        v as char
                    )));
                }
                0..=0x1f | 0x7f => {
                    return Err(Reason(format!(
                        "an escaped control byte (%{v:02X}) in segment {seg:?} is refused"
                    )));
                }
                v if unreserved(v) => text.push(v as char),
                v => text.push_str(&format!("%{v:02X}")),
            }
            decoded.push(v);
            i += 3;
            continue;
        }
        if b == b'\\' || b == b';' {
            return Err(Reason(format!(
                "{:?} in segment {seg:?} is refused (servers read it as a separator)",
                b as char
            )));
        }
        text.push(b as char);
        decoded.push(b);
        i += 1;
    }
    if std::str::from_utf8(&decoded).is_err() {
        return Err(Reason(format!(
            "segment {seg:?} decodes to invalid UTF-8 (overlong or truncated sequence)"
        )));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(t: &str) -> String {
        normalize(t).unwrap().target()
    }

    fn refused(t: &str, why: &str) {
        let e = normalize(t).unwrap_err().to_string();
        assert!(e.contains(why), "{t}: {e} (wanted {why})");
    }

    #[test]
    fn the_bypass_forms_normalise_to_what_they_mean() {
        for (t, want) in [
            ("/myorg/ok", "/myorg/ok"),
            ("/myorg/../other/secret", "/other/secret"),
            ("/myorg/%2e%2e/other/secret", "/other/secret"),
            ("/myorg/%2E%2e/other/secret", "/other/secret"),
            ("/myorg/.%2e/other", "/other"),
            ("//other/secret", "/other/secret"),
            ("/myorg//ok", "/myorg/ok"),
            ("/myorg/./../other", "/other"),
            ("/myorg/./ok", "/myorg/ok"),
            ("/MyOrg/..", "/"),
            ("/myorg/ok/", "/myorg/ok/"),
            ("/myorg/ok/.", "/myorg/ok/"),
            ("/myorg/ok/x/..", "/myorg/ok/"),
            ("/", "/"),
            ("/%6d%79org/ok", "/myorg/ok"),
            ("/a%2cb/%c3%a9", "/a%2Cb/%C3%A9"),
            ("/myorg/ok?x=/../y&z=%2F", "/myorg/ok?x=/../y&z=%2F"),
            ("/myorg/ok?", "/myorg/ok?"),
        ] {
            assert_eq!(norm(t), want, "{t}");
        }
        assert_eq!(normalize("/").unwrap().segments, Vec::<String>::new());
        assert_eq!(normalize("/a/").unwrap().segments, ["a", ""]);
    }

    /// Generated targets from the pieces the bypass forms are made of: whatever is accepted is
    /// already in normal form (normalising it again changes nothing, so the form decided on is
    /// the form the origin gets), and holds no dot segment or empty segment.
    #[test]
    fn what_is_accepted_is_a_fixed_point() {
        const PIECES: &[&str] = &[
            "/", "a", "B", ".", "..", "%2e", "%2E", "%2f", "%5c", "%25", "%41", "%c3%a9", "%c0%ae",
            ";", "\\", "?", "=", "&", "%", "~", "-", "_", "%3b", "//", "%2", "é",
        ];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut accepted = 0;
        for _ in 0..20_000 {
            let mut t = String::from("/");
            for _ in 0..(next() % 10) {
                t.push_str(PIECES[(next() % PIECES.len() as u64) as usize]);
            }
            let Ok(n) = normalize(&t) else { continue };
            accepted += 1;
            let again = normalize(&n.target()).unwrap_or_else(|e| panic!("{t:?}: {e}"));
            assert_eq!(again, n, "{t:?}");
            let last = n.segments.len().saturating_sub(1);
            for (i, s) in n.segments.iter().enumerate() {
                assert!(s != "." && s != "..", "{t:?} -> {:?}", n.segments);
                assert!(!s.is_empty() || i == last, "{t:?} -> {:?}", n.segments);
                assert!(!s.contains(['/', '\\', ';']), "{t:?} -> {:?}", n.segments);
            }
        }
        assert!(accepted > 1000, "only {accepted} accepted");
    }

    #[test]
    fn ambiguous_targets_are_refused() {
        refused("/myorg%2F..%2Fother/secret", "escaped '/'");
        refused("/myorg%2f..%2fother/secret", "escaped '/'");
        refused("/myorg%5C..%5Cother", "escaped '\\\\'");
        refused("/myorg\\..\\other", "'\\\\' in segment");
        refused("/myorg;/../other", "';' in segment");
        refused("/myorg/..;/other/secret", "';' in segment");
        refused("/myorg/%3b/x", "escaped ';'");
        refused("/myorg/%252e%252e/other", "escaped '%'");
        refused("/myorg/%00/x", "control byte");
        refused("/myorg/%0a/x", "control byte");
        refused("/myorg/%zz", "invalid percent escape");
        refused("/myorg/%2", "invalid percent escape");
        refused("/myorg/%", "invalid percent escape");
        refused("/myorg/%+1", "invalid percent escape");
        refused("/%c0%ae%c0%ae/other", "invalid UTF-8");
        refused("/%e0%80%ae/x", "invalid UTF-8");
        refused("/%c3", "invalid UTF-8");
        refused("/..", "above the root");
        refused("/a/../..", "above the root");
        refused("/%2e%2e/x", "above the root");
        refused("http://evil/x", "origin-form");
        refused("*", "origin-form");
        refused("", "origin-form");
        refused("/a#frag", "`#`");
        refused("/a b", "0x20");
        refused("/é", "0xc3");
    }
}
