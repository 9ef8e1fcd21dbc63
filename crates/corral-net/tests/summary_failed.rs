//! The end-of-run summary names what the jail saw fail, not only what the policy denied: an
//! allowed host that could not be resolved or reached gets a `corral: failed ...` line with the
//! reason. Real loopback proxy, the static resolver of the tests.

mod common;

use common::*;
use corral_net::ProxyConfig;

#[test]
fn allowed_destinations_that_fail_are_in_the_summary_with_their_reason() {
    // A port nobody listens on (bound, then closed).
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let h = start(
        rules(
            &["unknown.test", &format!("origin.test:{closed}")],
            &["127.0.0.0/8"],
        ),
        ProxyConfig::default(),
    );
    let connect = |target: &str| {
        let resp = exchange(
            h.addr,
            format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes(),
        );
        status_of(&resp)
    };
    // Allowed, but the resolver knows no such name: twice.
    assert_eq!(connect("unknown.test:443"), 502);
    assert_eq!(connect("unknown.test:443"), 502);
    // Allowed, resolved, refused by the destination.
    assert_eq!(connect(&format!("origin.test:{closed}")), 502);
    // Denied: the usual blocked line, first.
    assert_eq!(connect("github.com:443"), 403);

    assert_eq!(
        h.handle.summary(),
        vec![
            "corral: blocked CONNECT github.com:443 ×1 (not in network.allow) — allow with: \
             corral run --allow github.com"
                .to_string(),
            "corral: failed CONNECT unknown.test:443 ×2 (cannot resolve unknown.test: \
             unknown.test: no such host)"
                .to_string(),
            format!(
                "corral: failed CONNECT origin.test:{closed} ×1 (connect to 127.0.0.1:{closed}: \
                 Connection refused (os error 111))"
            ),
        ]
    );
}
