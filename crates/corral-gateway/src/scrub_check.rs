//! A property of the gateway's answer path, for the crate's proptest and the `gateway_scrub`
//! fuzz target: origin answers built from the run's real values (its secret, a sign-in's access
//! and refresh tokens, and the new tokens a refresh brings) in every encoding corral produces
//! or scrubs, mixed with arbitrary bytes, split, framed and typed in arbitrary ways, go through
//! the gateway's own scrubbing and rewriting code; no real value, in any of those encodings,
//! may come out where the jail reads it.
//!
//! Not a stable interface: it exists for the tests and the fuzzer.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use corral_http1::io::{BufConn, Replacer, relay_body};
use corral_http1::{Framing, Header, ResponseHead, Version};
use corral_policy::domain::DomainPattern;
use corral_policy::plan::SecretPlan;
use corral_policy::signin::{SigninFormat, SigninPlan, parse_token_url};

use crate::encodings::forms;
use crate::signin::{FileAccess, Refreshing, Signin};
use crate::signin_serve::{oauth_error, scrub_json};
use crate::ws::FrameScrubber;
use crate::{Gateway, GatewayConfig};

const KEY: &str = "sk-test-REALkeyREALkeyREALkey01234";
const ACCESS: &str = "ya29.REALaccessREALaccessREAL0123";
const REFRESH: &str = "1//0gREALrefresh+REALrefresh/REAL=";

/// A run to check answers against: a gateway with a secret and a sign-in.
pub struct World {
    gw: Gateway,
    /// The control: a scrubber that knows the raw values only (as before it knew their
    /// encodings), which [`check`] must catch.
    raw_only: bool,
}

impl World {
    /// A gateway whose trust files and sign-in file go into `dir` (it must exist).
    pub fn new(dir: &Path) -> World {
        World::build(dir, false)
    }

    /// The control world: its scrubber replaces the raw values only.
    pub fn raw_only(dir: &Path) -> World {
        World::build(dir, true)
    }

    fn build(dir: &Path, raw_only: bool) -> World {
        let file = dir.join("oauth_creds.json");
        let creds = serde_json::json!({"access_token": ACCESS, "refresh_token": REFRESH});
        std::fs::write(&file, creds.to_string()).expect("writing the test credential file");
        let (token_host, token_path) =
            parse_token_url("https://auth.check.test/token").expect("a token URL");
        let plan = SigninPlan {
            name: "check".into(),
            format: SigninFormat::Gemini,
            file,
            api_hosts: vec![DomainPattern::parse("api.check.test").expect("a pattern")],
            token_host: Some(token_host),
            token_path: Some(token_path),
            api_key_hosts: vec![],
            providers: vec![],
        };
        let signin = Signin::load(plan).expect("loading").expect("a sign-in");
        let key = SecretPlan {
            name: "KEY".into(),
            from_env: "KEY".into(),
            hosts: vec![DomainPattern::parse("api.check.test").expect("a pattern")],
        };
        let config = GatewayConfig {
            upstream_roots: Some(rustls::RootCertStore::empty()),
            trust_dir: dir.join("trust"),
            system_bundle: None,
            audit: None,
        };
        let (gw, _) = Gateway::with_run(
            vec![(key, KEY.into())],
            &BTreeMap::new(),
            vec![signin],
            &[],
            config,
        )
        .expect("a gateway");
        World { gw, raw_only }
    }

    /// The answer scrubber, with the tokens of `signin` too when given (a refresh's new ones).
    fn scrubber(&self, signin: Option<&Signin>) -> Replacer {
        if self.raw_only {
            let full = self.gw.scrubber();
            let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = [KEY, ACCESS, REFRESH]
                .iter()
                .map(|v| (v.as_bytes().to_vec(), full.replace_all(v.as_bytes())))
                .collect();
            pairs.extend(signin.map(Signin::scrub_pairs).unwrap_or_default());
            return Replacer::new(pairs);
        }
        let mut r = self.gw.scrubber();
        if let Some(s) = signin {
            crate::serve::add_signin_pairs(&mut r, s);
        }
        r
    }
}

/// Reads the input from the front; zero once it is used up.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn take(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (a, rest) = self.0.split_at(n);
        self.0 = rest;
        a.to_vec()
    }
}

/// What one input drives: the way the answer travels, its pieces, how it is split.
struct Case {
    mode: u8,
    body: Vec<u8>,
    splits: Vec<usize>,
    /// Where the websocket message is cut into frames, and the frames' options.
    cuts: Vec<usize>,
    masked: bool,
    ping: bool,
    /// New tokens a token answer brings.
    new_access: String,
    new_refresh: String,
}

/// Pieces: a real value in one of its forms, or arbitrary bytes.
fn pieces(input: &mut Input<'_>, values: &[&str]) -> Vec<u8> {
    let mut body = Vec::new();
    let count = input.byte() % 8;
    for _ in 0..count {
        let b = input.byte();
        if b < 0x80 {
            let v = values[usize::from(b) % values.len()];
            let f = forms(v.as_bytes());
            body.extend_from_slice(&f[usize::from(input.byte()) % f.len()]);
        } else {
            let n = usize::from(b & 0x0f);
            body.extend(input.take(n));
        }
    }
    body
}

fn case(data: &[u8]) -> Case {
    let mut input = Input(data);
    let mode = input.byte() % 6;
    let tag = input.take(4);
    let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    let new_access = format!("ya29.NEWaccess{hex}NEWaccess");
    let new_refresh = format!("1//0gNEW/refresh+{hex}/NEW");
    let values = [
        KEY,
        ACCESS,
        REFRESH,
        new_access.as_str(),
        new_refresh.as_str(),
    ];
    let body = pieces(&mut input, &values);
    let flags = input.byte();
    let n = usize::from(input.byte() % 8);
    let splits = (0..n).map(|_| 1 + usize::from(input.byte() % 23)).collect();
    let n = usize::from(input.byte() % 4);
    let cuts = (0..n).map(|_| usize::from(input.byte())).collect();
    Case {
        mode,
        body,
        splits,
        cuts,
        masked: flags & 1 != 0,
        ping: flags & 2 != 0,
        new_access,
        new_refresh,
    }
}

/// `data` in pieces of the case's sizes (the rest whole).
fn split<'a>(data: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    for &n in sizes {
        let (a, b) = rest.split_at(n.min(rest.len()));
        out.push(a);
        rest = b;
    }
    out.push(rest);
    out
}

/// Drive the gateway's answer path with the answer `data` describes; panics when a real value
/// reaches the jail. Returns which path was driven (for coverage checks).
pub fn check(world: &World, data: &[u8]) -> &'static str {
    let c = case(data);
    let (path, outputs) = match c.mode {
        0 => ("stream", vec![stream(world, &c)]),
        1 => ("relay", vec![relay(world, &c)]),
        2 => ("head", head(world, &c)),
        3 => ("websocket", websocket(world, &c)),
        4 => ("token answer", token(world, &c)),
        _ => ("token error", error(world, &c)),
    };
    // The values the jail must never read: the run's, and the new tokens once corral took
    // them (a refresh that was refused took nothing; the new values were never corral's).
    let mut reals = vec![KEY.to_string(), ACCESS.into(), REFRESH.into()];
    if c.mode == 4 {
        reals.extend([c.new_access.clone(), c.new_refresh.clone()]);
    }
    for out in &outputs {
        for real in &reals {
            for form in forms(real.as_bytes()) {
                assert!(
                    !crate::contains(out, &form),
                    "{path}: a real value reached the jail as {:?} in {:?}",
                    String::from_utf8_lossy(&form),
                    String::from_utf8_lossy(out)
                );
            }
        }
    }
    path
}

fn stream(world: &World, c: &Case) -> Vec<u8> {
    let mut r = world.scrubber(None);
    let mut out = Vec::new();
    for piece in split(&c.body, &c.splits) {
        r.feed(piece, &mut out);
    }
    r.finish(&mut out);
    out
}

/// A chunked answer (chunks of the case's sizes) relayed as the gateway relays bodies.
fn relay(world: &World, c: &Case) -> Vec<u8> {
    let mut wire = Vec::new();
    for piece in split(&c.body, &c.splits) {
        if !piece.is_empty() {
            wire.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            wire.extend_from_slice(piece);
            wire.extend_from_slice(b"\r\n");
        }
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mut src = BufConn::new(wire.as_slice());
        let mut out = Vec::new();
        let mut scrub = world.scrubber(None);
        let both = (Framing::Chunked, Framing::UntilClose);
        relay_body(
            &mut src,
            &mut out,
            both,
            Duration::from_secs(5),
            Some(&mut scrub),
        )
        .await
        .expect("a well-formed chunked body");
        out
    })
}

fn head(world: &World, c: &Case) -> Vec<Vec<u8>> {
    let mut resp = ResponseHead {
        version: Version::Http11,
        status: 200,
        reason: c.body.clone(),
        headers: vec![Header {
            name: "X-Echo".into(),
            value: c.body.clone(),
        }],
    };
    corral_http1::exchange::scrub_head(&mut resp, &world.scrubber(None));
    vec![resp.reason, resp.headers.remove(0).value]
}

/// One text message, cut into a frame and continuations, a ping among them if asked, each
/// frame masked if asked, the stream split in the case's sizes: the data message and each
/// control payload as the jail's websocket reads them.
fn websocket(world: &World, c: &Case) -> Vec<Vec<u8>> {
    let mut cuts: Vec<usize> = c.cuts.iter().map(|&k| k.min(c.body.len())).collect();
    cuts.sort_unstable();
    let mut parts = Vec::new();
    let mut at = 0;
    for k in cuts.into_iter().chain([c.body.len()]) {
        parts.push(&c.body[at..k]);
        at = k;
    }
    let key = c.masked.then_some([0x5a, 0x01, 0xc3, 0x7e]);
    let mut wire = Vec::new();
    let last = parts.len() - 1;
    for (i, p) in parts.iter().enumerate() {
        let opcode = if i == 0 { 1 } else { 0 };
        crate::ws::write_frame(i == last, opcode, key, p, &mut wire);
        if c.ping && i == 0 {
            crate::ws::write_frame(true, 9, key, &c.body[..c.body.len().min(125)], &mut wire);
        }
    }
    let mut s = FrameScrubber::new(world.scrubber(None));
    let mut out = Vec::new();
    for piece in split(&wire, &c.splits) {
        s.feed(piece, &mut out);
    }
    s.finish(&mut out);
    let (mut message, mut controls) = (Vec::new(), Vec::new());
    let mut rest = out.as_slice();
    while !rest.is_empty() {
        let (n, head) = crate::ws::parse_head(rest)
            .ok()
            .flatten()
            .expect("a whole frame from the gateway");
        let mut p = rest[n..n + head.len as usize].to_vec();
        if let Some(k) = head.mask {
            crate::ws::apply_mask(&mut p, k, 0);
        }
        if head.opcode >= 8 {
            controls.push(p);
        } else {
            message.extend_from_slice(&p);
        }
        rest = &rest[n + head.len as usize..];
    }
    controls.push(message);
    controls
}

/// The new tokens in a 200 JSON answer, the pieces in another field: what the jail reads of it
/// (its bytes, and each string its parser gets).
fn token(world: &World, c: &Case) -> Vec<Vec<u8>> {
    // A copy of the run's sign-in: each case refreshes its own (a refresh rotates the tokens).
    let run = &world.gw.inner.signin[0];
    let signin = Signin::from_tokens(run.plan().clone(), run.tokens(), FileAccess::Local)
        .expect("the run's tokens");
    let answer = serde_json::json!({
        "access_token": c.new_access, "refresh_token": c.new_refresh,
        "expires_in": 3600, "note": String::from_utf8_lossy(&c.body),
    });
    let Ok((out, _)) = signin.take_response(&Refreshing::of(None), answer.to_string().as_bytes())
    else {
        return Vec::new();
    };
    jail_reads(&scrub_json(&out, &world.scrubber(Some(&signin))))
}

/// An OAuth error quoting the pieces: what the jail reads of it.
fn error(world: &World, c: &Case) -> Vec<Vec<u8>> {
    let answer = serde_json::json!({"error": "invalid_grant",
        "error_description": String::from_utf8_lossy(&c.body)});
    let Ok(out) = oauth_error(answer.to_string().as_bytes()) else {
        return Vec::new();
    };
    jail_reads(&scrub_json(&out, &world.scrubber(None)))
}

/// A JSON answer's bytes and every string in it, as a JSON parser hands them over.
fn jail_reads(json: &[u8]) -> Vec<Vec<u8>> {
    fn strings(v: &serde_json::Value, out: &mut Vec<Vec<u8>>) {
        match v {
            serde_json::Value::String(s) => out.push(s.clone().into_bytes()),
            serde_json::Value::Array(items) => items.iter().for_each(|i| strings(i, out)),
            serde_json::Value::Object(map) => map.iter().for_each(|(k, v)| {
                out.push(k.clone().into_bytes());
                strings(v, out);
            }),
            _ => {}
        }
    }
    let mut out = vec![json.to_vec()];
    let v: serde_json::Value = serde_json::from_slice(json).expect("corral wrote JSON");
    strings(&v, &mut out);
    out
}
