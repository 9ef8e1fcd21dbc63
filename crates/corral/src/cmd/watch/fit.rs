//! A destination as `corral watch` shows it in the columns it has: whole when it fits, else its
//! start, a visible marker, and always its end — the registrable domain and the port, which are
//! what an allow lets through. Whether it was shown whole decides whether `a` and `p` may allow it.

use ratatui::text::Span;

/// What marks the part of a name left out.
pub const MARKER: &str = "…";

/// A destination fitted into a width.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fitted {
    /// What is drawn.
    pub text: String,
    /// Whether `text` is the whole destination (nothing left out).
    pub whole: bool,
}

/// Second-level labels under which a two-letter country code registers names (`co.uk`,
/// `com.au`, `ac.jp`, `gov.br`, ...): a conservative stand-in for the public suffix list,
/// which corral does not carry. Where it errs, it shows one label more than the registrable
/// domain, never one less.
const SECOND_LEVEL: &[&str] = &[
    "ac", "co", "com", "edu", "gob", "go", "gov", "ltd", "mil", "ne", "net", "nic", "nom", "or",
    "org", "plc", "sch",
];

/// The registrable domain of a host name (its last two labels, or three under a country code's
/// second level such as `co.uk`); an IP address (or a name of one label) is returned whole.
pub fn registrable(host: &str) -> &str {
    &host[registrable_at(host)..]
}

/// Where in `host` its registrable domain starts (0: the whole of it).
fn registrable_at(host: &str) -> usize {
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.starts_with('[') || name.parse::<std::net::IpAddr>().is_ok() {
        return 0;
    }
    let labels: Vec<&str> = name.rsplit('.').collect();
    let keep = match labels.as_slice() {
        [tld, second, _, ..]
            if tld.len() == 2
                && tld.bytes().all(|b| b.is_ascii_alphabetic())
                && SECOND_LEVEL.contains(second) =>
        {
            3
        }
        _ => 2,
    };
    if labels.len() <= keep {
        return 0;
    }
    let kept: usize = labels[..keep].iter().map(|l| l.len() + 1).sum();
    name.len() + 1 - kept
}

/// Display width in terminal columns (as ratatui lays text out).
pub fn width(s: &str) -> usize {
    Span::raw(s).width()
}

/// `host:port` in at most `columns` columns: whole when it fits; else the start of the name,
/// [`MARKER`], then `.REGISTRABLE:PORT` in full (wider than `columns` when even that does not
/// fit: the end is never cut). `host` is already made printable.
pub fn fit(host: &str, port: u16, columns: usize) -> Fitted {
    let whole = format!("{host}:{port}");
    if width(&whole) <= columns {
        return Fitted {
            text: whole,
            whole: true,
        };
    }
    let at = registrable_at(host);
    if at == 0 {
        // An address or a single label: nothing to leave out but all of it.
        return Fitted {
            text: whole,
            whole: false,
        };
    }
    let tail = format!(".{}:{port}", &host[at..]);
    let budget = columns.saturating_sub(width(&tail) + width(MARKER));
    let mut head = String::new();
    for c in host[..at - 1].chars() {
        if width(&head) + width(c.encode_utf8(&mut [0; 4])) > budget {
            break;
        }
        head.push(c);
    }
    Fitted {
        text: format!("{head}{MARKER}{tail}"),
        whole: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrable_domains() {
        for (host, reg) in [
            ("api.github.com", "github.com"),
            ("github.com", "github.com"),
            ("localhost", "localhost"),
            ("a.b.evil.co.uk", "evil.co.uk"),
            ("x.evil.com.au", "evil.com.au"),
            ("x.evil.de", "evil.de"),
            ("co.uk", "co.uk"),
            ("api.github.com.evil.example.", "evil.example."),
            ("127.0.0.1", "127.0.0.1"),
            ("::1", "::1"),
            ("[::1]", "[::1]"),
        ] {
            assert_eq!(registrable(host), reg, "{host}");
        }
    }

    #[test]
    fn a_name_that_fits_is_shown_whole() {
        assert_eq!(
            fit("api.github.com", 443, 40),
            Fitted {
                text: "api.github.com:443".into(),
                whole: true
            }
        );
        assert!(fit("api.github.com", 443, 18).whole);
        assert!(!fit("api.github.com", 443, 17).whole);
    }

    /// A 253-character name that starts like api.github.com: its start, the marker, and its
    /// registrable domain and port, in exactly the columns given.
    #[test]
    fn a_long_name_keeps_its_registrable_domain_and_port() {
        let host = format!(
            "api.github.com.{}.{}.{}.{}.attacker.example",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(29)
        );
        assert_eq!(host.len(), 253);
        let f = fit(&host, 8443, 60);
        assert!(!f.whole);
        assert_eq!(width(&f.text), 60);
        assert_eq!(
            f.text,
            format!(
                "api.github.com.{}….attacker.example:8443",
                "a".repeat(60 - 15 - 1 - 22)
            )
        );
        // Narrower than the end: the end is kept whole anyway.
        assert_eq!(fit(&host, 8443, 10).text, "….attacker.example:8443");
        // Wide enough: whole.
        assert!(fit(&host, 8443, 258).whole);
        assert!(!fit(&host, 8443, 257).whole);
    }

    #[test]
    fn an_address_keeps_its_end() {
        assert_eq!(
            fit("2001:db8::1234:5678", 443, 10),
            Fitted {
                text: "2001:db8::1234:5678:443".into(),
                whole: false
            }
        );
    }
}
