//! Fuzz the jail's DNS stub (`corral_net::netcap::stub_reply`), the function that answers the
//! bytes a jailed process sends to its resolver.
//!
//! The input is read as DNS over TCP: messages, each after a two-byte length, answered in turn
//! by one stub (one address pool, four names at most, so a flood reaches the full-pool path).
//!
//! Properties: nothing panics; fewer than 12 bytes, or a response (QR set), gets no answer; any
//! answer is a response with the query's ID, opcode and RD bit, one question at most, no
//! authority or additional records, and is exactly the header, the question echoed, and one A
//! record when an address is given; an address is given only for an A query of a name the
//! rules allow (and deny does not name), lies in the pool, stays the same for that name and
//! differs between names; the name recorded for the audit log is printable ASCII (the jail
//! cannot forge a log row or drive a terminal).
#![no_main]

use std::collections::HashMap;
use std::net::Ipv4Addr;

use corral_net::Rules;
use corral_net::netcap::{StubPool, stub_reply};
use corral_policy::domain::{DomainPattern, Host};
use libfuzzer_sys::fuzz_target;

fn rules() -> Rules {
    let p = |v: &[&str]| v.iter().map(|s| DomainPattern::parse(s).unwrap()).collect();
    Rules {
        allow: p(&["example.org", "*.example.com", "a.b", "10.1.2.3"]),
        deny: p(&["bad.example.com"]),
        ..Default::default()
    }
}

fn check(query: &[u8], rules: &Rules, pool: &StubPool, given: &mut HashMap<String, Ipv4Addr>) {
    let (reply, asked) = stub_reply(query, rules, pool);
    let Some(reply) = reply else {
        assert!(asked.is_none());
        assert!(
            query.len() < 12 || query[2] & 0x80 != 0,
            "a query got no answer"
        );
        return;
    };
    assert!(
        query.len() >= 12 && query[2] & 0x80 == 0,
        "a response was answered"
    );
    assert!(reply.len() >= 12);
    assert_eq!(reply[..2], query[..2], "the ID");
    assert_eq!(reply[2] & 0x80, 0x80, "QR");
    assert_eq!(reply[2] & 0x78, query[2] & 0x78, "the opcode");
    assert_eq!(reply[2] & 1, query[2] & 1, "RD");
    let count = |i: usize| u16::from_be_bytes([reply[i], reply[i + 1]]);
    let (qd, an) = (count(4), count(6));
    assert!(qd <= 1 && an <= qd && count(8) == 0 && count(10) == 0);
    let rcode = reply[3] & 0xf;
    let Some(q) = asked else {
        assert_eq!((qd, an), (0, 0));
        assert_eq!(reply.len(), 12);
        assert_ne!(rcode, 0);
        return;
    };
    assert_eq!(qd, 1);
    let question_len = reply.len() - 12 - if an == 1 { 16 } else { 0 };
    assert_eq!(reply[12..12 + question_len], query[12..12 + question_len]);
    assert!(
        q.name.bytes().all(|b| (0x20..0x7f).contains(&b)),
        "unprintable name {:?}",
        q.name
    );
    assert_eq!(q.address.is_some(), an == 1);
    let Some(addr) = q.address else { return };
    assert_eq!(rcode, 0);
    assert!(q.allowed && q.qtype == 1);
    assert_eq!(reply[reply.len() - 4..], addr.octets());
    assert_eq!(reply[12 + question_len..reply.len() - 4][..2], [0xc0, 0x0c]);
    let a = u32::from(addr);
    assert!(
        (0xc612_0002..0xc613_ffff).contains(&a),
        "{addr} outside the pool"
    );
    assert_eq!(pool.name_for(addr.into()).as_deref(), Some(q.name.as_str()));
    let host = Host::Name(q.name.clone());
    assert!(
        rules.allow.iter().any(|p| p.matches(&host, 443)),
        "{} not allowed",
        q.name
    );
    assert!(
        !rules.deny.iter().any(|p| p.matches(&host, 443)),
        "{} denied",
        q.name
    );
    if let Some(before) = given.insert(q.name.clone(), addr) {
        assert_eq!(before, addr, "{} changed address", q.name);
    }
    let mut seen: Vec<_> = given.values().collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), given.len(), "two names share an address");
}

fuzz_target!(|data: &[u8]| {
    let rules = rules();
    let pool = StubPool::with_capacity(
        Ipv4Addr::new(198, 18, 0, 0),
        15,
        Ipv4Addr::new(198, 18, 0, 1),
        4,
    );
    let mut given = HashMap::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let n = usize::from(u16::from_be_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let (msg, tail) = rest[2..].split_at(n);
        check(msg, &rules, &pool, &mut given);
        rest = tail;
    }
});
