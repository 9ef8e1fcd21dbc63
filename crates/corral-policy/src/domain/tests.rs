use super::*;
use proptest::prelude::*;
use std::net::{Ipv4Addr, Ipv6Addr};

fn name(s: &str) -> Host {
    Host::Name(s.to_string())
}

fn v4(s: &str) -> Host {
    Host::Ip(IpAddr::V4(s.parse().unwrap()))
}

fn v6(s: &str) -> Host {
    Host::Ip(IpAddr::V6(s.parse().unwrap()))
}

fn pat(s: &str) -> DomainPattern {
    DomainPattern::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn host(s: &str) -> Host {
    normalize_host(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn normalizes_case_trailing_dot_and_idn() {
    assert_eq!(host("EXAMPLE.com."), name("example.com"));
    assert_eq!(host("Example.COM"), name("example.com"));
    assert_eq!(host("bücher.example"), name("xn--bcher-kva.example"));
    assert_eq!(host("BÜCHER.example."), name("xn--bcher-kva.example"));
    assert_eq!(host("xn--bcher-kva.example"), name("xn--bcher-kva.example"));
    // Fullwidth dot (U+FF0E) is a label separator after UTS-46 mapping.
    assert_eq!(host("example\u{ff0e}com"), name("example.com"));
    assert_eq!(host("_dmarc.example.com"), name("_dmarc.example.com"));
    assert_eq!(host("localhost"), name("localhost"));
    assert_eq!(host("localhost."), name("localhost"));
}

#[test]
fn rejects_malformed_names() {
    for bad in [
        "",
        ".",
        "..",
        "example..com",
        ".example.com",
        "example.com..",
        "exa mple.com",
        "example.com\r\nX-Injected: 1",
        "example.com\n",
        "example.com\0",
        "user@example.com",
        "example.com/path",
        "example.com\\path",
        "example%2ecom",
        "evil.com:443.example.com",
        "example.com:443",
        "*.example.com",
        "exa\tmple.com",
        "example.com#frag",
        "example.com?q",
        "xn--zz.example",     // invalid punycode
        "example\u{ff0f}com", // fullwidth solidus maps to '/'
        "example\u{ff1a}443", // fullwidth colon maps to ':'
    ] {
        assert!(
            normalize_host(bad).is_err(),
            "{bad:?} accepted as {:?}",
            normalize_host(bad)
        );
    }
}

#[test]
fn enforces_dns_lengths() {
    let l63 = "a".repeat(63);
    let l64 = "a".repeat(64);
    assert_eq!(host(&format!("{l63}.com")), name(&format!("{l63}.com")));
    assert!(normalize_host(&format!("{l64}.com")).is_err());
    // 4 labels of 63 + 3 dots = 255 > 253.
    let long = [l63.as_str(); 4].join(".");
    assert!(normalize_host(&long).is_err());
    let ok = format!("{}.{}.{}.{}", l63, l63, l63, "a".repeat(61));
    assert_eq!(ok.len(), 253);
    assert_eq!(host(&ok), name(&ok));
    // A trailing dot does not count.
    assert_eq!(host(&format!("{ok}.")), name(&ok));
}

#[test]
fn ipv4_in_every_spelling_is_an_address() {
    for spelled in [
        "127.0.0.1",
        "127.1",
        "127.0.1",
        "2130706433",
        "0x7f000001",
        "0X7F000001",
        "0177.0.0.1",
        "0177.1",
        "0x7f.1",
        "0x7f.0.0.1",
        "127.0.0.1.",
        "0x7f.0x0.0x0.0x1",
        "017700000001",
        "127.0x0.0.01",
        "\u{ff11}\u{ff12}\u{ff17}.0.0.1", // fullwidth digits
    ] {
        assert_eq!(host(spelled), v4("127.0.0.1"), "{spelled}");
    }
    assert_eq!(host("0"), v4("0.0.0.0"));
    assert_eq!(host("0x"), v4("0.0.0.0"));
    assert_eq!(host("4294967295"), v4("255.255.255.255"));
    assert_eq!(host("169.254.43518"), v4("169.254.169.254"));
    assert_eq!(host("0xa9fea9fe"), v4("169.254.169.254"));
    assert_eq!(host("10.1"), v4("10.0.0.1"));
}

#[test]
fn names_ending_in_a_number_must_be_ipv4() {
    for bad in [
        "4294967296",
        "1.2.3.4.5",
        "256.0.0.1",
        "1.2.3.256",
        "1.2.65536",
        "1.16777216",
        "09.0.0.1",
        "0x7g.0.0.1",
        "foo.123",
        "example.0x1",
        "1..1",
        "127.0.0.1..",
        "0x100000000",
        "99999999999999999999999999",
    ] {
        assert!(
            normalize_host(bad).is_err(),
            "{bad:?} accepted as {:?}",
            normalize_host(bad)
        );
    }
    // Numbers inside a name are fine when the last label is not one.
    assert_eq!(host("1.2.3.4.nip.io"), name("1.2.3.4.nip.io"));
    assert_eq!(host("123.example"), name("123.example"));
    assert_eq!(host("0x7f.example"), name("0x7f.example"));
    assert_eq!(host("example.1a"), name("example.1a"));
}

#[test]
fn ipv6_literals() {
    assert_eq!(host("[::1]"), v6("::1"));
    assert_eq!(host("::1"), v6("::1"));
    assert_eq!(host("[::ffff:127.0.0.1]"), v6("::ffff:127.0.0.1"));
    assert_eq!(host("[0:0:0:0:0:FFFF:7F00:1]"), v6("::ffff:127.0.0.1"));
    assert_eq!(host("[64:ff9b::7f00:1]"), v6("64:ff9b::127.0.0.1"));
    for bad in [
        "[fe80::1%eth0]",
        "fe80::1%eth0",
        "[fe80::1%25eth0]",
        "[::1",
        "::1]",
        "[::1]:443",
        "[example.com]",
        "[127.0.0.1]",
        "[]",
        ":::",
    ] {
        assert!(
            normalize_host(bad).is_err(),
            "{bad:?} accepted as {:?}",
            normalize_host(bad)
        );
    }
}

#[test]
fn authorities() {
    assert_eq!(
        parse_authority("example.com:443").unwrap(),
        (name("example.com"), Some(443))
    );
    assert_eq!(
        parse_authority("EXAMPLE.com.").unwrap(),
        (name("example.com"), None)
    );
    assert_eq!(
        parse_authority("[::1]:8080").unwrap(),
        (v6("::1"), Some(8080))
    );
    assert_eq!(parse_authority("[::1]").unwrap(), (v6("::1"), None));
    assert_eq!(
        parse_authority("127.1:80").unwrap(),
        (v4("127.0.0.1"), Some(80))
    );
    for bad in [
        "evil.com:443.example.com",
        "evil.com:443:443",
        "example.com:",
        "example.com:0",
        "example.com:65536",
        "example.com:+443",
        "example.com:-1",
        "example.com: 443",
        "example.com:443 ",
        "example.com:0x1bb",
        ":443",
        "",
        "::1",
        "::1:443",
        "[::1]443",
        "[::1]:",
        "[fe80::1%eth0]:443",
        "[::1]]:443",
        "user@example.com:443",
        "example.com:443/",
    ] {
        assert!(
            parse_authority(bad).is_err(),
            "{bad:?} accepted as {:?}",
            parse_authority(bad)
        );
    }
}

#[test]
fn error_messages_say_what_is_wrong() {
    let e = normalize_host("evil.com:443.example.com")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "invalid host \"evil.com:443.example.com\": not a valid IPv6 address (and `:` is not allowed in a name)"
    );
    let e = normalize_host("[fe80::1%eth0]").unwrap_err().to_string();
    assert!(e.contains("zone ids"), "{e}");
    let e = DomainPattern::parse("exa mple.com")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "invalid domain pattern \"exa mple.com\": character ' ' is not allowed in a host (expected `example.org`, `*.example.org`, an IP address, each with an optional `:PORT`)"
    );
}

#[test]
fn exact_patterns() {
    let p = pat("example.com");
    assert!(p.matches(&host("example.com"), 443));
    assert!(p.matches(&host("EXAMPLE.com."), 443));
    assert!(p.matches(&host("example.com"), 8080));
    for other in [
        "notexample.com",
        "example.com.evil.org",
        "www.example.com",
        "example.co",
        "xample.com",
    ] {
        assert!(!p.matches(&host(other), 443), "{other}");
    }
    assert!(pat("EXAMPLE.com.").matches(&host("example.com"), 443));
}

#[test]
fn wildcard_patterns() {
    let p = pat("*.example.com");
    assert!(p.matches(&host("www.example.com"), 443));
    assert!(p.matches(&host("a.b.c.example.com"), 443));
    assert!(p.matches(&host("WWW.Example.COM."), 443));
    for other in [
        "example.com",
        "notexample.com",
        "www.notexample.com",
        "example.com.evil.org",
        "www.example.com.evil.org",
        "wwwexample.com",
    ] {
        assert!(!p.matches(&host(other), 443), "{other}");
    }
    assert!(p.is_wildcard());
    assert_eq!(p.name(), Some("example.com"));
}

#[test]
fn ported_patterns() {
    let p = pat("registry.example.com:8443");
    assert_eq!(p.port(), Some(8443));
    assert!(p.matches(&host("registry.example.com"), 8443));
    assert!(!p.matches(&host("registry.example.com"), 443));
    let w = pat("*.example.com:443");
    assert!(w.matches(&host("a.example.com"), 443));
    assert!(!w.matches(&host("a.example.com"), 80));
    assert_eq!(pat("example.com").port(), None);
}

#[test]
fn ip_patterns_match_that_address_only() {
    let p = pat("127.0.0.1");
    assert!(p.matches(&host("127.1"), 80));
    assert!(p.matches(&host("2130706433"), 80));
    assert!(p.matches(&host("[::ffff:127.0.0.1]"), 80));
    assert!(!p.matches(&host("127.0.0.2"), 80));
    assert!(!p.matches(&name("localhost"), 80));
    let p6 = pat("[::1]:8080");
    assert_eq!(p6.port(), Some(8080));
    assert!(p6.matches(&host("[::1]"), 8080));
    assert!(!p6.matches(&host("[::1]"), 80));
    assert!(!p6.matches(&host("127.0.0.1"), 8080));
    assert!(pat("::1").matches(&host("[::1]"), 1));
    assert!(pat("0x7f000001").matches(&host("127.0.0.1"), 1));
    // A pattern naming a dotted name never matches an address, and back.
    assert!(!pat("example.com").matches(&host("93.184.216.34"), 443));
}

#[test]
fn rejected_patterns() {
    for bad in [
        "",
        "*",
        "*:443",
        "*.",
        "**.example.com",
        "*example.com",
        "www.*.example.com",
        "*.*.example.com",
        "example.*",
        ".example.com",
        "example.com:",
        "example.com:0",
        "example.com:99999",
        "example.com:https",
        "evil.com:443.example.com",
        "*.127.0.0.1",
        "*.10.1",
        "fe80::1%eth0",
        "[fe80::1%eth0]:443",
        "http://example.com",
        "example.com/path",
        "user@example.com",
        " example.com",
        "1.2.3.4.5",
    ] {
        assert!(
            DomainPattern::parse(bad).is_err(),
            "{bad:?} accepted as {:?}",
            DomainPattern::parse(bad)
        );
    }
}

#[test]
fn patterns_display_canonically_and_roundtrip() {
    for (raw, canon) in [
        ("EXAMPLE.com.", "example.com"),
        ("*.Example.COM:443", "*.example.com:443"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("127.1", "127.0.0.1"),
        ("[::1]:80", "[::1]:80"),
        ("::1", "::1"),
        ("[::ffff:10.0.0.1]", "10.0.0.1"),
    ] {
        let p = pat(raw);
        assert_eq!(p.to_string(), canon, "{raw}");
        assert_eq!(pat(canon), p, "{raw}");
    }
    let json = serde_json::to_string(&pat("*.example.com:8443")).unwrap();
    assert_eq!(json, "\"*.example.com:8443\"");
    let back: DomainPattern = serde_json::from_str(&json).unwrap();
    assert_eq!(back, pat("*.example.com:8443"));
    assert!(serde_json::from_str::<DomainPattern>("\"*\"").is_err());
}

// ---- properties ----

fn label() -> impl Strategy<Value = String> {
    "[a-z_][a-z0-9_-]{0,10}"
}

fn dns_name() -> impl Strategy<Value = String> {
    prop::collection::vec(label(), 1..5).prop_map(|v| v.join("."))
}

/// Arbitrary text that looks host-ish: ASCII letters, digits, the characters that matter to
/// the parser, and a few non-ASCII ones that IDNA maps.
fn hostish() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9.:\\[\\]%@/_*xX -]{0,30}|[a-zé\u{ff0e}\u{ff11}\u{00df}.]{1,20}"
}

proptest! {
    #[test]
    fn normalization_is_idempotent(raw in hostish()) {
        if let Ok(h) = normalize_host(&raw) {
            let again = normalize_host(&h.to_string()).expect("normalized host re-parses");
            prop_assert_eq!(again, h);
        }
    }

    #[test]
    fn normalized_names_are_ldh(raw in hostish()) {
        if let Ok(Host::Name(n)) = normalize_host(&raw) {
            prop_assert!(n.len() <= 253);
            prop_assert!(n.split('.').all(|l| !l.is_empty() && l.len() <= 63));
            prop_assert!(n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'.'));
        }
    }

    #[test]
    fn pattern_matches_only_at_a_label_boundary(
        suffix in dns_name(),
        host_name in dns_name(),
        prefix in "[a-z0-9_-]{0,5}",
        wildcard in any::<bool>(),
    ) {
        // Build hosts that end with the suffix textually, with and without a boundary.
        let raw = if wildcard { format!("*.{suffix}") } else { suffix.clone() };
        let Ok(p) = DomainPattern::parse(&raw) else { return Ok(()) };
        for candidate in [format!("{prefix}{suffix}"), format!("{host_name}.{suffix}"), host_name.clone(), format!("{suffix}.{host_name}")] {
            let Ok(h @ Host::Name(_)) = normalize_host(&candidate) else { continue };
            let n = h.as_name().unwrap();
            let at_boundary = n == suffix || n.ends_with(&format!(".{suffix}"));
            if p.matches(&h, 443) {
                prop_assert!(at_boundary, "{} matched {}", raw, n);
                if wildcard {
                    prop_assert!(n != suffix, "{} matched its apex", raw);
                } else {
                    prop_assert_eq!(n, suffix.as_str());
                }
            } else if wildcard {
                prop_assert!(!(n.ends_with(&format!(".{suffix}"))), "{} missed {}", raw, n);
            } else {
                prop_assert!(n != suffix, "{} missed itself", raw);
            }
        }
    }

    #[test]
    fn any_u32_in_any_spelling_is_that_address(n in any::<u32>(), style in 0u8..6) {
        let ip = Ipv4Addr::from(n);
        let [a, b, c, d] = ip.octets();
        let spelled = match style {
            0 => format!("{n}"),
            1 => format!("0x{n:x}"),
            2 => format!("0{n:o}"),
            3 => format!("{a}.{}", n & 0xff_ffff),
            4 => format!("0x{a:x}.0{b:o}.{}", u16::from_be_bytes([c, d])),
            _ => format!("0{a:o}.0x{b:X}.{c}.0{d:o}."),
        };
        prop_assert_eq!(normalize_host(&spelled), Ok(Host::Ip(IpAddr::V4(ip))), "{}", spelled);
        prop_assert!(DomainPattern::parse(&ip.to_string()).unwrap().matches(&normalize_host(&spelled).unwrap(), 1));
    }

    #[test]
    fn ipv6_round_trips(segs in any::<[u16; 8]>()) {
        let ip = Ipv6Addr::from(segs);
        prop_assert_eq!(normalize_host(&format!("[{ip}]")), Ok(Host::Ip(IpAddr::V6(ip))));
        prop_assert_eq!(parse_authority(&format!("[{ip}]:443")), Ok((Host::Ip(IpAddr::V6(ip)), Some(443))));
    }

    #[test]
    fn parse_never_panics(raw in "\\PC{0,40}") {
        let _ = normalize_host(&raw);
        let _ = parse_authority(&raw);
        if let Ok(p) = DomainPattern::parse(&raw) {
            prop_assert_eq!(DomainPattern::parse(&p.to_string()), Ok(p));
        }
    }
}
