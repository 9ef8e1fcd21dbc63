//! Fuzz the host normalizer, the authority parser and the pattern parser.
//!
//! Properties: nothing panics; normalization is idempotent (a normalized host printed and
//! normalized again is the same host); an authority's host part is what normalize_host makes
//! of it; a parsed pattern re-parses from its canonical form to the same pattern and matches
//! hosts consistently with itself; a name never matches an IP pattern and back.
#![no_main]

use corral_policy::domain::{DomainPattern, Host, normalize_host, parse_authority};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };

    if let Ok(h) = normalize_host(s) {
        let again = normalize_host(&h.to_string()).expect("a normalized host re-normalizes");
        assert_eq!(again, h, "normalize_host not idempotent on {s:?}");
        if let Host::Name(n) = &h {
            assert!(n.len() <= 253 && !n.is_empty(), "{n:?}");
            assert!(
                n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)),
                "{n:?}"
            );
            assert!(
                n.split('.').all(|l| !l.is_empty() && l.len() <= 63),
                "{n:?}"
            );
        }
    }

    if let Ok((h, port)) = parse_authority(s) {
        assert!(port != Some(0));
        let again = normalize_host(&h.to_string()).expect("authority host re-normalizes");
        assert_eq!(again, h);
        let rebuilt = match port {
            Some(p) => format!("{h}:{p}"),
            None => h.to_string(),
        };
        assert_eq!(parse_authority(&rebuilt), Ok((h, port)), "{s:?}");
    }

    if let Ok(p) = DomainPattern::parse(s) {
        let canon = p.to_string();
        assert_eq!(
            DomainPattern::parse(&canon),
            Ok(p.clone()),
            "{s:?} -> {canon:?}"
        );
        // The pattern's own name matches an exact pattern, never a wildcard (apex).
        if let Some(name) = p.name() {
            let h = Host::Name(name.to_string());
            let port = p.port().unwrap_or(443);
            assert_eq!(p.matches(&h, port), !p.is_wildcard(), "{s:?}");
            let sub = normalize_host(&format!("a.{name}"));
            if let Ok(sub) = sub {
                assert_eq!(p.matches(&sub, port), p.is_wildcard(), "{s:?}");
            }
        }
        if let Some(ip) = p.ip() {
            assert!(p.matches(&Host::Ip(ip), p.port().unwrap_or(1)));
            assert!(!p.matches(&Host::Name("example.com".into()), p.port().unwrap_or(1)));
        }
    }
});
