//! Fuzz the executor's request parsing (`POST /execute` and `POST /v1/exec` bodies) and the
//! output encoders next to it.
//!
//! Properties: nothing panics; an accepted request is valid (a non-empty program, no NUL in any
//! argument, `cwd`, env name or value, no `=` in an env name, `timeout_ms` not 0, `cwd` never
//! `""` or `"."`); a `/v1/exec` request re-serialized by the client (`to_v1_json`) parses back
//! to the same request, and its body is also a valid `/execute` body with the same command; an
//! `/execute` request re-sent as `/v1/exec` parses to the same request; the seed's response
//! (`legacy_response`) is JSON giving back the exit code and the output (lossy UTF-8) with
//! every escape in `\u` form and no raw control byte; `Utf8Chunker` turns any split of a
//! stream into the same text as `String::from_utf8_lossy` of the whole.
#![no_main]

use corral_exec::ExecRequest;
use corral_exec::proto::{Utf8Chunker, legacy_response};
use libfuzzer_sys::fuzz_target;

fn check_valid(req: &ExecRequest) {
    assert!(!req.command.is_empty() && !req.command[0].is_empty());
    assert!(req.command.iter().all(|a| !a.contains('\0')));
    if let Some(cwd) = &req.cwd {
        assert!(!cwd.contains('\0'));
        assert!(!cwd.is_empty() && cwd != ".");
    }
    for (k, v) in &req.env {
        assert!(!k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0'));
    }
    assert_ne!(req.timeout_ms, Some(0));
}

fn requests(body: &[u8]) {
    if let Ok(req) = ExecRequest::parse_v1(body) {
        check_valid(&req);
        let again = ExecRequest::parse_v1(&req.to_v1_json()).expect("the client's body parses");
        assert_eq!(again, req);
        let legacy = ExecRequest::parse_legacy(body).expect("a /v1/exec body is an /execute one");
        assert_eq!(legacy.command, req.command);
    }
    if let Ok(req) = ExecRequest::parse_legacy(body) {
        check_valid(&req);
        assert_eq!(req, ExecRequest::new(req.command.clone()));
        let v1 = ExecRequest::parse_v1(&req.to_v1_json()).expect("re-sent as /v1/exec");
        assert_eq!(v1, req);
    }
}

fn legacy(data: &[u8]) {
    let code = data.first().map_or(0, |&b| i32::from(b as i8) * 1000);
    let resp = legacy_response(code, data);
    assert_eq!(resp.last(), Some(&b'\n'));
    for (i, &b) in resp[..resp.len() - 1].iter().enumerate() {
        assert!(b >= 0x20, "raw control byte {b:#x} in the response");
        if b == b'\\' {
            assert_eq!(resp.get(i + 1), Some(&b'u'), "an escape not in \\u form");
        }
    }
    let v: serde_json::Value = serde_json::from_slice(&resp).expect("the response is JSON");
    assert_eq!(v["exitCode"], serde_json::json!(code));
    assert_eq!(v["output"].as_str(), Some(&*String::from_utf8_lossy(data)));
}

fn chunker(data: &[u8]) {
    let Some((&step, rest)) = data.split_first() else {
        return;
    };
    let step = usize::from(step % 7) + 1;
    let mut c = Utf8Chunker::default();
    let mut out = String::new();
    for (i, piece) in rest.chunks(step).enumerate() {
        // Uneven pieces: every other one is split once more.
        if i % 2 == 1 && piece.len() > 1 {
            out.push_str(&c.push(&piece[..1]));
            out.push_str(&c.push(&piece[1..]));
        } else {
            out.push_str(&c.push(piece));
        }
    }
    out.push_str(&c.finish());
    assert_eq!(out, String::from_utf8_lossy(rest));
}

fuzz_target!(|data: &[u8]| {
    requests(data);
    legacy(data);
    chunker(data);
});
