//! Fuzz the proxy's strict HTTP/1.1 request parser.
//!
//! Properties: nothing panics; a head that parses is re-serialized canonically and parses back
//! to the same request (no field or framing changes meaning); the form the proxy forwards
//! (origin-form, hop-by-hop headers stripped, framing re-declared) parses back with the same
//! framing and carries no Transfer-Encoding/Content-Length conflict; chunk-size lines and
//! response heads never panic.
#![no_main]

use corral_net::http::{
    self, Framing, find_head_end, parse_chunk_size, parse_request_head, parse_response_head,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = parse_chunk_size(data);
    let _ = parse_response_head(data);
    let Ok(Some(end)) = find_head_end(data) else {
        return;
    };
    let Ok(req) = parse_request_head(&data[..end]) else {
        return;
    };
    // Canonical re-serialization parses back to the same request.
    let mut canon =
        format!("{} {} {}\r\n", req.method, req.target, req.version.as_str()).into_bytes();
    for h in &req.headers {
        canon.extend_from_slice(h.name.as_bytes());
        canon.extend_from_slice(b": ");
        canon.extend_from_slice(&h.value);
        canon.extend_from_slice(b"\r\n");
    }
    canon.extend_from_slice(b"\r\n");
    assert_eq!(find_head_end(&canon), Ok(Some(canon.len())));
    assert_eq!(parse_request_head(&canon).as_ref(), Ok(&req));
    // The forwarded form keeps the framing and nothing hop-by-hop.
    let fwd = http::serialize_request(&req.method, "/", "example.org", &req.headers, req.framing);
    let again = parse_request_head(&fwd).expect("the forwarded form parses");
    let want = match req.framing {
        Framing::None if req.method != "GET" && req.method != "HEAD" => Framing::Length(0),
        f => f,
    };
    assert_eq!(again.framing, want);
    assert_eq!(http::header_values(&again.headers, "host").count(), 1);
    for h in &again.headers {
        let n = h.name.to_ascii_lowercase();
        assert!(
            ![
                "connection",
                "proxy-authorization",
                "te",
                "upgrade",
                "keep-alive",
                "trailer"
            ]
            .contains(&n.as_str()),
            "{n} forwarded"
        );
    }
});
