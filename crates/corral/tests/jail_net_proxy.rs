//! Network mode `proxy` from inside the native jail: `curl` reaches an allowed origin through
//! corral's proxy with the proxy variables corral sets; a host not allowed gets the 403 with the
//! fix and is summarized at the end of the run; a direct TCP connection and a DNS lookup fail.
//! (Origins are on the host's loopback, opened with an IP pattern and `allow_cidrs`.)

mod jail_support;

use jail_support::*;

#[test]
fn curl_in_the_jail_reaches_only_what_the_policy_allows() {
    let w = World::new();
    let port = origin();
    let policy = w.outside.join("net.toml");
    write(
        &policy,
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [\"127.0.0.1:{port}\"]\nallow_cidrs = [\"127.0.0.1/32\"]\n\
             [limits]\nenforce = \"best-effort\"\n"
        ),
    );
    let script = format!(
        r#"
echo "PROXYVAR $http_proxy $HTTPS_PROXY NODE=$NODE_USE_ENV_PROXY"
# NO_PROXY names 127.0.0.1; --noproxy '' makes curl use the proxy for it anyway.
echo "ALLOWED $(curl -s --max-time 10 --noproxy '' http://127.0.0.1:{port}/through-proxy)"
echo "DENIED $(curl -s --max-time 10 -o /dev/null -w '%{{http_code}}' http://github.com/)"
echo "DENIED-TLS $(curl -s --max-time 10 -o /dev/null -w '%{{http_connect}}' https://github.com/ 2>&1; echo rc=$?)"
echo "DIRECT $(curl -s --max-time 5 --noproxy '*' http://127.0.0.1:{port}/direct; echo rc=$?)"
python3 - <<'PY'
import socket
try:
    socket.getaddrinfo("example.org", 443)
    print("DNS resolved")
except OSError as e:
    print("DNS failed", type(e).__name__)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.sendto(b"x", ("192.0.2.1", 53))
    print("UDP sent")
except OSError as e:
    print("UDP failed", e.errno)
PY
echo END
"#
    );
    let out = w.sh_policy(&policy, &script);
    let o = out.both();
    assert!(out.stdout.contains("PROXYVAR http://127.0.0.1:3128"), "{o}");
    assert!(out.stdout.contains("NODE=1"), "{o}");
    assert!(
        out.stdout.contains("ALLOWED ORIGIN-OK /through-proxy"),
        "{o}"
    );
    assert!(out.stdout.contains("DENIED 403"), "{o}");
    // CONNECT refused: curl reports 403 from the proxy and fails.
    assert!(out.stdout.contains("DENIED-TLS 403"), "{o}");
    assert!(!out.stdout.contains("ORIGIN-OK /direct"), "{o}");
    assert!(out.stdout.contains("DNS failed"), "{o}");
    assert!(out.stdout.contains("UDP failed"), "{o}");
    // The end-of-run summary, one line per blocked destination.
    assert!(
        out.stderr.contains(
            "corral: blocked GET github.com:80 ×1 (not in network.allow) — allow with: corral run --allow github.com"
        ),
        "{o}"
    );
    assert!(
        out.stderr.contains(
            "corral: blocked CONNECT github.com:443 ×1 (not in network.allow) — allow with: corral run --allow github.com"
        ),
        "{o}"
    );
    // Each decision is in the project's audit log.
    let net: Vec<_> = w
        .audit_records()
        .into_iter()
        .filter(|r| r["kind"] == "net" && r["phase"] == "decision")
        .collect();
    assert!(
        net.iter()
            .any(|r| r["decision"] == "allow" && r["host"] == "127.0.0.1" && r["port"] == port),
        "{net:?}"
    );
    assert_eq!(
        net.iter().filter(|r| r["decision"] == "deny").count(),
        2,
        "{net:?}"
    );
}
