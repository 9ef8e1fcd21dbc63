use super::*;
use crate::domain::{Host, normalize_host};
use proptest::prelude::*;
use std::net::{Ipv4Addr, Ipv6Addr};

fn c(s: &str) -> AddrClass {
    classify(s.parse().unwrap_or_else(|e| panic!("{s}: {e}")))
}

#[test]
fn ipv4_classes() {
    use AddrClass::*;
    for (ip, class) in [
        ("0.0.0.0", Unspecified),
        ("0.1.2.3", Reserved),
        ("127.0.0.1", Loopback),
        ("127.255.255.254", Loopback),
        ("10.0.0.1", Private),
        ("172.16.0.1", Private),
        ("172.31.255.255", Private),
        ("172.32.0.1", Public),
        ("192.168.1.1", Private),
        ("169.254.1.1", LinkLocal),
        ("169.254.169.254", Metadata),
        ("169.254.170.2", Metadata),
        ("168.63.129.16", Metadata),
        ("100.100.100.200", Metadata),
        ("192.0.0.192", Metadata),
        ("100.64.0.1", Cgnat),
        ("100.127.255.255", Cgnat),
        ("100.128.0.1", Public),
        ("192.0.0.8", Reserved),
        ("192.0.2.1", Reserved),
        ("198.51.100.1", Reserved),
        ("203.0.113.1", Reserved),
        ("198.18.0.1", Reserved),
        ("198.19.255.255", Reserved),
        ("192.88.99.1", Reserved),
        ("224.0.0.1", Multicast),
        ("239.255.255.250", Multicast),
        ("240.0.0.1", Reserved),
        ("255.255.255.255", Broadcast),
        ("8.8.8.8", Public),
        ("1.1.1.1", Public),
        ("93.184.216.34", Public),
    ] {
        assert_eq!(c(ip), class, "{ip}");
    }
}

#[test]
fn ipv6_classes() {
    use AddrClass::*;
    for (ip, class) in [
        ("::", Unspecified),
        ("::1", Loopback),
        ("fe80::1", LinkLocal),
        ("fc00::1", UniqueLocal),
        ("fd12:3456::1", UniqueLocal),
        ("fd00:ec2::254", Metadata),
        ("fd00:ec2::23", Metadata),
        ("fec0::1", Private),
        ("ff02::1", Multicast),
        ("2001:db8::1", Reserved),
        ("3fff::1", Reserved),
        ("2001:2::1", Reserved),
        ("100::1", Reserved),
        ("5f00::1", Reserved),
        ("4000::1", Reserved),
        ("2606:4700:4700::1111", Public),
        ("2a00:1450:4001::200e", Public),
    ] {
        assert_eq!(c(ip), class, "{ip}");
    }
}

#[test]
fn embedded_ipv4_is_unwrapped() {
    use AddrClass::*;
    for (ip, class) in [
        ("::ffff:127.0.0.1", Loopback),
        ("::ffff:169.254.169.254", Metadata),
        ("::ffff:8.8.8.8", Public),
        ("::ffff:0:10.0.0.1", Private),
        ("::127.0.0.1", Loopback),
        ("::10.0.0.1", Private),
        ("::8.8.8.8", Public),
        ("64:ff9b::127.0.0.1", Loopback),
        ("64:ff9b::169.254.169.254", Metadata),
        ("64:ff9b::8.8.8.8", Public),
        ("64:ff9b:1::10.0.0.1", Private),
        ("64:ff9b:1::8.8.8.8", Reserved),
        ("2002:7f00:1::", Loopback),
        ("2002:a9fe:a9fe::1", Metadata),
        ("2002:0808:0808::1", Public),
        // Teredo: client = !last32. !0x80ffff fe = 127.0.0.1
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", Loopback),
        ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", Public),
    ] {
        assert_eq!(c(ip), class, "{ip}");
    }
    // ::1 is loopback, not 0.0.0.1 (what Ipv6Addr::to_ipv4 would make of it).
    assert_eq!(unwrap_v4("::1".parse().unwrap()), None);
    assert_eq!(unwrap_v4("::".parse().unwrap()), None);
}

#[test]
fn hosts_in_any_spelling_classify_as_their_address() {
    for spelled in [
        "127.1",
        "2130706433",
        "0x7f000001",
        "0177.0.0.1",
        "[::ffff:127.0.0.1]",
        "[::1]",
        "[64:ff9b::7f00:1]",
    ] {
        let Host::Ip(ip) = normalize_host(spelled).unwrap() else {
            panic!("{spelled} is a name")
        };
        assert_eq!(classify(ip), AddrClass::Loopback, "{spelled}");
    }
    let Host::Ip(ip) = normalize_host("0xa9fea9fe").unwrap() else {
        panic!()
    };
    assert_eq!(classify(ip), AddrClass::Metadata);
}

#[test]
fn check_destination_allows_public_and_listed() {
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let nets: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()];
    assert_eq!(check_destination(ip("8.8.8.8"), &[]), Ok(()));
    assert_eq!(check_destination(ip("2606:4700::1"), &[]), Ok(()));
    assert_eq!(
        check_destination(ip("127.0.0.1"), &[]),
        Err(AddrClass::Loopback)
    );
    assert_eq!(
        check_destination(ip("10.1.2.3"), &[]),
        Err(AddrClass::Private)
    );
    assert_eq!(check_destination(ip("10.1.2.3"), &nets), Ok(()));
    assert_eq!(check_destination(ip("::ffff:10.1.2.3"), &nets), Ok(()));
    assert_eq!(check_destination(ip("64:ff9b::10.1.2.3"), &nets), Ok(()));
    assert_eq!(
        check_destination(ip("192.168.1.1"), &nets),
        Err(AddrClass::Private)
    );
    assert_eq!(
        check_destination(ip("::ffff:192.168.1.1"), &nets),
        Err(AddrClass::Private)
    );
    assert_eq!(check_destination(ip("fd12::1"), &nets), Ok(()));
    assert_eq!(
        check_destination(ip("fc00::1"), &nets),
        Err(AddrClass::UniqueLocal)
    );
    assert_eq!(
        check_destination(ip("169.254.169.254"), &nets),
        Err(AddrClass::Metadata)
    );
    let meta: Vec<IpNet> = vec!["169.254.169.254/32".parse().unwrap()];
    assert_eq!(check_destination(ip("169.254.169.254"), &meta), Ok(()));
    assert_eq!(AddrClass::Cgnat.to_string(), "cgnat");
    assert_eq!(
        serde_json::to_string(&AddrClass::LinkLocal).unwrap(),
        "\"link-local\""
    );
}

proptest! {
    #[test]
    fn embedded_forms_classify_as_the_ipv4(n in any::<u32>()) {
        let v4 = Ipv4Addr::from(n);
        let want = classify(IpAddr::V4(v4));
        let mapped = v4.to_ipv6_mapped();
        let nat64 = Ipv6Addr::from((u128::from(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0))) | n as u128);
        let sixtofour = Ipv6Addr::from((0x2002u128 << 112) | ((n as u128) << 80) | 0x1234);
        for ip in [mapped, nat64, sixtofour] {
            prop_assert_eq!(classify(IpAddr::V6(ip)), want, "{} for {}", ip, v4);
            prop_assert_eq!(unwrap_v4(ip), Some(v4));
        }
        let teredo = Ipv6Addr::from((0x2001_0000u128 << 96) | ((0x0808_0808u128) << 64) | (!n) as u128);
        prop_assert_eq!(classify(IpAddr::V6(teredo)), want, "{}", teredo);
    }

    #[test]
    fn private_never_passes_without_a_listed_net(n in any::<u32>()) {
        let ip = IpAddr::V4(Ipv4Addr::from(n));
        match check_destination(ip, &[]) {
            Ok(()) => prop_assert_eq!(classify(ip), AddrClass::Public),
            Err(class) => prop_assert_eq!(classify(ip), class),
        }
        prop_assert_eq!(check_destination(ip, &["0.0.0.0/0".parse().unwrap()]), Ok(()));
    }

    #[test]
    fn spelled_u32_classifies_as_its_address(n in any::<u32>(), style in 0u8..4) {
        let ip = Ipv4Addr::from(n);
        let spelled = match style {
            0 => format!("{n}"),
            1 => format!("0x{n:x}"),
            2 => format!("0{n:o}"),
            _ => format!("{}.{}", ip.octets()[0], n & 0xff_ffff),
        };
        let Host::Ip(got) = normalize_host(&spelled).unwrap() else { panic!("{spelled} is a name") };
        prop_assert_eq!(classify(got), classify(IpAddr::V4(ip)));
    }
}

#[test]
fn public_prefixes_whole() {
    let p = public_prefixes();
    let s = |v: &[IpNet]| v.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    similar_asserts::assert_eq!(s(&p.within), ["0.0.0.0/0", "2000::/3"]);
    similar_asserts::assert_eq!(
        s(&p.except),
        [
            "0.0.0.0/8",
            "10.0.0.0/8",
            "100.64.0.0/10",
            "127.0.0.0/8",
            "168.63.129.16/32",
            "169.254.0.0/16",
            "172.16.0.0/12",
            "192.0.0.0/24",
            "192.0.2.0/24",
            "192.88.99.0/24",
            "192.168.0.0/16",
            "198.18.0.0/15",
            "198.51.100.0/24",
            "203.0.113.0/24",
            "224.0.0.0/4",
            "240.0.0.0/4",
            "2001::/32",
            "2001:2::/48",
            "2001:10::/28",
            "2001:20::/28",
            "2001:db8::/32",
            "2002::/16",
            "3fff::/20",
        ]
    );
}

fn prefix_public(p: &PublicPrefixes, ip: IpAddr) -> bool {
    p.within.iter().any(|n| n.contains(&ip)) && !p.except.iter().any(|n| n.contains(&ip))
}

proptest! {
    /// What the prefixes let through, the classifier calls public: never looser.
    #[test]
    fn public_prefixes_never_looser_v4(n in any::<u32>()) {
        let ip = IpAddr::V4(Ipv4Addr::from(n));
        let p = public_prefixes();
        prop_assert!(!prefix_public(&p, ip) || classify(ip).is_public(), "{ip}");
    }

    #[test]
    fn public_prefixes_never_looser_v6(n in any::<u128>(), pick in 0usize..7) {
        // Biased towards the interesting prefixes: random 128-bit values rarely hit them.
        let bases: [(u128, u32); 7] = [
            (0, 0),
            (0x2002 << 112, 16),
            (0x2001 << 112, 32),
            (0xfd00_0ec2 << 96, 32),
            (0x64_ff9b << 96, 96),
            (0xffff << 32, 96),
            (0, 96),
        ];
        let (base, len) = bases[pick];
        let ip = if len == 0 { n } else { base | (n & (u128::MAX >> len)) };
        let ip = IpAddr::V6(Ipv6Addr::from(ip));
        let p = public_prefixes();
        prop_assert!(!prefix_public(&p, ip) || classify(ip).is_public(), "{ip}");
    }
}
