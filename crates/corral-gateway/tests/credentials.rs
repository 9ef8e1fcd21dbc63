//! The gateway fails closed on the credential paths: attacks by a hostile origin on loopback
//! (TLS, trusted through a test CA) against a jail client that trusts the run CA only. Each
//! attack has a control showing what the jail would get without the defence.
//!
//! - a token endpoint answering in a format corral did not ask for (form encoding, nested
//!   JSON, a non-JSON content type, a redirect, a camelCase token field) is refused with 502;
//! - an error answer quoting the percent-encoded refresh body comes back with placeholders;
//! - `Range` never reaches an origin with an injected value (no reflected secret in pieces);
//! - a secret reflected across a websocket frame and its continuation is scrubbed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use corral_audit::{AuditLog, Decision, Event};
use corral_gateway::signin::Signin;
use corral_gateway::{AuditSink, Gateway, GatewayConfig, JailTrust, Replacer};
use corral_http1::io::{BufConn, relay_body};
use corral_http1::{Framing, RequestHead, ResponseHead, parse_request_head, parse_response_head};
use corral_policy::domain::{DomainPattern, Host};
use corral_policy::plan::SecretPlan;
use corral_policy::signin::{SigninFormat, SigninPlan, parse_token_url};
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncWriteExt, DuplexStream};

const T: Duration = Duration::from_secs(10);
const AUTH: &str = "auth.credentials.test";
const API: &str = "api.credentials.test";
/// Google-style tokens: the refresh token's `//` always needs percent-encoding in a form.
const ACCESS: &str = "ya29.REALaccessREALaccessREALaccess0123456789";
const REFRESH: &str = "1//0gREALrefreshREALrefreshREALrefresh0123";
const NEW_ACCESS: &str = "ya29.NEWaccessNEWaccessNEWaccessNEWaccess01";
const NEW_REFRESH: &str = "1//0gNEWrefreshNEWrefreshNEWrefreshNEW0123";
const KEY: &str = "sk-REALkeyREALkeyREALkeyREALkey0123456789";

/// What a hostile origin answers to a request (head and body): the whole answer, raw.
type Handler = Arc<dyn Fn(&RequestHead, &[u8]) -> Vec<u8> + Send + Sync>;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The origin: TLS for AUTH and API with its own CA; every request head it got is kept.
struct Origin {
    addr: SocketAddr,
    roots: RootCertStore,
    seen: Arc<Mutex<Vec<RequestHead>>>,
}

async fn origin(handler: Handler) -> Origin {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![AUTH.into(), API.into()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, seen, handler) = (acceptor.clone(), seen2.clone(), handler.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut conn = BufConn::new(tls);
                while let Ok(Some(head)) = conn.read_head(T, T).await {
                    let req = parse_request_head(&head).unwrap();
                    let mut body = Vec::new();
                    let f = req.framing;
                    if relay_body(&mut conn, &mut body, (f, f), T, None)
                        .await
                        .is_err()
                    {
                        return;
                    }
                    seen.lock().unwrap().push(req.clone());
                    let answer = handler(&req, &body);
                    if conn.io.write_all(&answer).await.is_err() {
                        return;
                    }
                    let _ = conn.io.flush().await;
                    if answer.starts_with(b"HTTP/1.1 101") {
                        let _ = conn.io.shutdown().await;
                        return;
                    }
                }
            });
        }
    });
    Origin { addr, roots, seen }
}

/// An answer with `status`, `content_type` and `body` (framed by its length).
fn answer(status: &str, content_type: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn header<'a>(req: &'a RequestHead, name: &str) -> Option<&'a str> {
    req.headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| std::str::from_utf8(&h.value).unwrap())
}

struct Run {
    gw: Gateway,
    trust: JailTrust,
    audit: AuditLog,
    origin: Origin,
    _dir: tempfile::TempDir,
}

/// A run with a Gemini-style sign-in (token endpoint on AUTH, API on API) and an API key bound
/// to API, its origin answering with `handler`.
async fn run(handler: Handler) -> Run {
    let origin = origin(handler).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("oauth_creds.json");
    let creds = serde_json::json!({"access_token": ACCESS, "refresh_token": REFRESH,
        "scope": "openid", "token_type": "Bearer", "expiry_date": 1});
    std::fs::write(&file, serde_json::to_vec(&creds).unwrap()).unwrap();
    let (token_host, token_path) = parse_token_url(&format!("https://{AUTH}/token")).unwrap();
    let plan = SigninPlan {
        name: "gemini".into(),
        format: SigninFormat::Gemini,
        file,
        api_hosts: vec![DomainPattern::parse(API).unwrap()],
        token_host: Some(token_host),
        token_path: Some(token_path),
        api_key_hosts: vec![],
        providers: vec![],
    };
    let signin = Signin::load(plan).unwrap().unwrap();
    let audit = AuditLog::at(dir.path().join("audit.jsonl"));
    let key = SecretPlan {
        name: "API_KEY".into(),
        from_env: "CALLER_API_KEY".into(),
        hosts: vec![DomainPattern::parse(API).unwrap()],
    };
    let (gw, trust) = Gateway::with_run(
        vec![(key, KEY.into())],
        &Default::default(),
        vec![signin],
        &[],
        GatewayConfig {
            upstream_roots: Some(origin.roots.clone()),
            trust_dir: dir.path().join("trust"),
            system_bundle: None,
            audit: Some(AuditSink {
                log: audit.clone(),
                jail: "credentials-test".into(),
            }),
        },
    )
    .unwrap();
    Run {
        gw,
        trust,
        audit,
        origin,
        _dir: dir,
    }
}

type Jail = BufConn<tokio_rustls::client::TlsStream<DuplexStream>>;

/// The jail's TLS connection to `host` through the gateway (which dials the origin).
async fn jail(r: &Run, host: &str) -> Jail {
    let (client, server) = tokio::io::duplex(1 << 16);
    let (gw, addr, h) = (r.gw.clone(), r.origin.addr, Host::Name(host.into()));
    tokio::spawn(async move {
        let _ = gw.intercept(server, &h, 443, addr, "jail").await;
    });
    let mut roots = RootCertStore::empty();
    let b64: String = r
        .trust
        .ca_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    roots.add(CertificateDer::from(der)).unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from(host.to_string()).unwrap(), client)
        .await
        .unwrap();
    BufConn::new(tls)
}

/// Send `req`, read one answer: its head and its whole body.
async fn exchange(c: &mut Jail, req: &str) -> (ResponseHead, Vec<u8>) {
    c.io.write_all(req.as_bytes()).await.unwrap();
    c.io.flush().await.unwrap();
    let head = c.read_head(T, T).await.unwrap().unwrap();
    let resp = parse_response_head(&head).unwrap();
    let f = corral_http1::response_framing(&resp, "GET").unwrap();
    let mut body = Vec::new();
    relay_body(c, &mut body, (f, Framing::UntilClose), T, None)
        .await
        .unwrap();
    (resp, body)
}

/// The jail's placeholder refresh token (what its credential file holds).
fn jail_refresh(r: &Run) -> String {
    let pairs = r.gw.scrubber();
    let out = pairs.replace_all(REFRESH.as_bytes());
    String::from_utf8(out).unwrap()
}

/// A form-encoded refresh as the jail sends it, asking for `accept`.
fn form_refresh(r: &Run, accept: &str) -> String {
    let body = format!(
        "grant_type=refresh_token&refresh_token={}&client_id=c",
        String::from_utf8(pct(jail_refresh(r).as_bytes())).unwrap()
    );
    format!(
        "POST /token HTTP/1.1\r\nHost: {AUTH}\r\nAccept: {accept}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn pct(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for &b in s {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    out
}

/// Every spelling of `value` an answer could carry: raw, percent-encoded (both cases),
/// JSON-escaped with `\/`.
fn spellings(value: &str) -> Vec<Vec<u8>> {
    let upper = pct(value.as_bytes());
    vec![
        value.as_bytes().to_vec(),
        upper.clone(),
        String::from_utf8(upper)
            .unwrap()
            .to_lowercase()
            .into_bytes(),
        value.replace('/', "\\/").into_bytes(),
    ]
}

fn leaks(hay: &[u8], values: &[&str]) -> Vec<String> {
    let hay = String::from_utf8_lossy(hay).to_lowercase();
    values
        .iter()
        .flat_map(|v| spellings(v))
        .map(|s| String::from_utf8(s).unwrap().to_lowercase())
        .filter(|s| hay.contains(s.as_str()))
        .collect()
}

/// The whole answer the jail got, head and body, as bytes.
fn whole((resp, body): &(ResponseHead, Vec<u8>)) -> Vec<u8> {
    let mut all = resp.to_bytes();
    all.extend_from_slice(body);
    all
}

/// A token endpoint in the GitHub style: it answers form-encoded when asked for it, JSON
/// otherwise; it rotates both tokens on every refresh carrying the real refresh token.
fn honours_accept() -> Handler {
    Arc::new(|req, body| {
        let form = String::from_utf8_lossy(&pct(REFRESH.as_bytes())).into_owned();
        if !String::from_utf8_lossy(body).contains(&form) {
            return answer(
                "400 Bad Request",
                "application/json",
                r#"{"error":"invalid_grant"}"#,
            );
        }
        if header(req, "accept").is_some_and(|a| a.contains("x-www-form-urlencoded")) {
            let b = format!(
                "access_token={}&refresh_token={}&token_type=bearer&expires_in=3600",
                String::from_utf8(pct(NEW_ACCESS.as_bytes())).unwrap(),
                String::from_utf8(pct(NEW_REFRESH.as_bytes())).unwrap()
            );
            return answer("200 OK", "application/x-www-form-urlencoded", &b);
        }
        let b = serde_json::json!({"access_token": NEW_ACCESS, "refresh_token": NEW_REFRESH,
            "token_type": "Bearer", "expires_in": 3600});
        answer("200 OK", "application/json", &b.to_string())
    })
}

#[tokio::test]
async fn a_refresh_asking_for_form_encoding_gets_json_with_placeholders_only() {
    let r = run(honours_accept()).await;
    let mut c = jail(&r, AUTH).await;
    let req = form_refresh(&r, "application/x-www-form-urlencoded");
    let got = exchange(&mut c, &req).await;
    assert_eq!(got.0.status, 200, "{}", String::from_utf8_lossy(&got.1));
    let leaked = leaks(&whole(&got), &[NEW_ACCESS, NEW_REFRESH, ACCESS, REFRESH]);
    assert!(leaked.is_empty(), "the jail got {leaked:?}");
    let v: serde_json::Value = serde_json::from_slice(&got.1).unwrap();
    let (a, rt) = (
        v["access_token"].as_str().unwrap(),
        v["refresh_token"].as_str().unwrap(),
    );
    assert!(
        a.len() == NEW_ACCESS.len() && rt.len() == NEW_REFRESH.len(),
        "{v}"
    );
    // corral asked upstream for JSON, whatever the jail asked for.
    let seen = r.origin.seen.lock().unwrap().clone();
    let accepts: Vec<_> = seen.iter().map(|q| header(q, "accept")).collect();
    assert_eq!(accepts, vec![Some("application/json")]);

    // Control: the same request straight to this endpoint returns the new real tokens
    // form-encoded, which the answer scrubber alone (the path that relayed an answer it could
    // not parse) leaves as they are.
    let control = run(honours_accept()).await;
    let form_req = form_refresh(&control, "application/x-www-form-urlencoded").replace(
        &String::from_utf8(pct(jail_refresh(&control).as_bytes())).unwrap(),
        &String::from_utf8(pct(REFRESH.as_bytes())).unwrap(),
    );
    let body = form_req.split_once("\r\n\r\n").unwrap().1;
    let raw = honours_accept()(&head_of(&form_req), body.as_bytes());
    let relayed = control.gw.scrubber().replace_all(&raw);
    for token in [NEW_ACCESS, NEW_REFRESH] {
        let leaked = leaks(&relayed, &[token]);
        assert!(!leaked.is_empty(), "{}", String::from_utf8_lossy(&relayed));
    }
}

/// Token endpoints that answer what corral cannot parse and rewrite in full, whatever it asks.
fn hostile(kind: &'static str) -> Handler {
    Arc::new(move |_, _| {
        let nested = serde_json::json!({"access_token": NEW_ACCESS,
            "data": {"refresh_token": NEW_REFRESH}})
        .to_string();
        let camel = serde_json::json!({"access_token": NEW_ACCESS,
            "refreshToken": NEW_REFRESH})
        .to_string();
        let json = serde_json::json!({"access_token": NEW_ACCESS,
            "refresh_token": NEW_REFRESH})
        .to_string();
        let form = format!("access_token={NEW_ACCESS}&refresh_token={NEW_REFRESH}");
        match kind {
            "form" => answer("200 OK", "application/x-www-form-urlencoded", &form),
            "nested" => answer("200 OK", "application/json", &nested),
            "camel" => answer("200 OK", "application/json", &camel),
            "text" => answer("200 OK", "text/plain", &json),
            "no type" => format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{json}", json.len()).into_bytes(),
            "201" => answer("201 Created", "application/json", &json),
            "redirect" => format!(
                "HTTP/1.1 302 Found\r\nLocation: https://x.test/?{form}\r\nContent-Length: 0\r\n\r\n"
            )
            .into_bytes(),
            "error form" => answer("400 Bad Request", "application/x-www-form-urlencoded", &form),
            "error html" => answer("500 Oops", "text/html", &format!("<p>{json}</p>")),
            "error json" => answer(
                "400 Bad Request",
                "application/json",
                &serde_json::json!({"error": "invalid_grant", "refresh_token": NEW_REFRESH,
                    "access_token": NEW_ACCESS, "x-token": NEW_ACCESS}).to_string(),
            ),
            "header" => format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-New-Token: {NEW_REFRESH}x\r\nContent-Length: {}\r\n\r\n{json}",
                json.len()
            )
            .into_bytes(),
            _ => unreachable!(),
        }
    })
}

#[tokio::test]
async fn token_answers_corral_cannot_parse_in_full_are_refused_and_audited() {
    for (kind, status) in [
        ("form", 502),
        ("nested", 502),
        ("camel", 502),
        ("text", 502),
        ("no type", 502),
        ("201", 502),
        ("redirect", 502),
        ("error form", 502),
        ("error html", 502),
        ("error json", 400),
        ("header", 200),
    ] {
        let r = run(hostile(kind)).await;
        let mut c = jail(&r, AUTH).await;
        let got = exchange(&mut c, &form_refresh(&r, "*/*")).await;
        assert_eq!(
            got.0.status,
            status,
            "{kind}: {}",
            String::from_utf8_lossy(&got.1)
        );
        let leaked = leaks(&whole(&got), &[NEW_ACCESS, NEW_REFRESH, ACCESS, REFRESH]);
        assert!(leaked.is_empty(), "{kind}: the jail got {leaked:?}");
        if status == 502 {
            let text = String::from_utf8_lossy(&got.1);
            assert!(
                text.contains("corral credential gateway: "),
                "{kind}: {text}"
            );
            let (recs, _) = r.audit.read_all().unwrap();
            let denied = recs.iter().any(|rec| match &rec.event {
                Event::Net(n) => {
                    n.decision == Some(Decision::Deny) && n.rule.contains("token endpoint")
                }
                _ => false,
            });
            assert!(denied, "{kind}: no refusal in the audit log");
        }
        // Control: what the endpoint sent carries the new real tokens.
        let raw = hostile(kind)(&head_of(&form_refresh(&r, "*/*")), b"");
        assert!(
            !leaks(&raw, &[NEW_ACCESS, NEW_REFRESH]).is_empty(),
            "{kind}"
        );
    }
}

/// The parsed head of a request written out whole.
fn head_of(req: &str) -> RequestHead {
    let (head, _) = req.split_once("\r\n\r\n").unwrap();
    parse_request_head(format!("{head}\r\n\r\n").as_bytes()).unwrap()
}

#[tokio::test]
async fn an_error_quoting_the_percent_encoded_refresh_body_comes_back_with_placeholders() {
    let quoting: Handler = Arc::new(|_, body| {
        let quoted = String::from_utf8_lossy(body).into_owned();
        let b = serde_json::json!({"error": "invalid_request",
            "error_description": format!("could not use {quoted}")});
        answer("400 Bad Request", "application/json", &b.to_string())
    });
    let r = run(quoting.clone()).await;
    let mut c = jail(&r, AUTH).await;
    let got = exchange(&mut c, &form_refresh(&r, "application/json")).await;
    assert_eq!(got.0.status, 400);
    let text = String::from_utf8_lossy(&got.1).into_owned();
    assert!(leaks(&whole(&got), &[REFRESH]).is_empty(), "{text}");
    let ph = String::from_utf8(pct(jail_refresh(&r).as_bytes())).unwrap();
    assert!(text.contains(&ph), "{text}");

    // Control: the body corral sent upstream held the percent-encoded real token, and a
    // scrubber that knows only the raw value leaves the quoted one in place.
    let raw_only = Replacer::new([(REFRESH.as_bytes().to_vec(), jail_refresh(&r).into_bytes())]);
    let upstream_body = format!(
        "refresh_token={}",
        String::from_utf8(pct(REFRESH.as_bytes())).unwrap()
    );
    let req = parse_request_head(b"POST /token HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let quoted = quoting(&req, upstream_body.as_bytes());
    assert!(!leaks(&raw_only.replace_all(&quoted), &[REFRESH]).is_empty());
}

/// An origin that reflects the request's `Authorization` and honours `Range` on it.
fn ranged() -> Handler {
    Arc::new(|req, _| {
        let full = header(req, "authorization").unwrap_or("").to_string();
        match header(req, "range").and_then(|r| r.strip_prefix("bytes=")) {
            Some(range) => {
                let (a, b) = range.split_once('-').unwrap();
                let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
                let piece = &full[a.min(full.len())..(b + 1).min(full.len())];
                answer("206 Partial Content", "text/plain", piece)
            }
            None => answer("200 OK", "text/plain", &full),
        }
    })
}

#[tokio::test]
async fn a_reflected_key_cannot_be_fetched_in_pieces_with_range() {
    let r = run(ranged()).await;
    let ph = String::from_utf8(r.gw.scrubber().replace_all(KEY.as_bytes())).unwrap();
    let mut c = jail(&r, API).await;
    let mut pieces = String::new();
    for start in (0..ph.len() + 7).step_by(8) {
        let req = format!(
            "GET /echo HTTP/1.1\r\nHost: {API}\r\nAuthorization: Bearer {ph}\r\nRange: bytes={start}-{}\r\nIf-Range: \"x\"\r\n\r\n",
            start + 7
        );
        let (resp, body) = exchange(&mut c, &req).await;
        assert_eq!(resp.status, 200, "the origin was asked for a piece");
        assert!(leaks(&body, &[KEY]).is_empty());
        pieces.push_str(&String::from_utf8_lossy(&body));
    }
    assert!(!pieces.contains("REALkey"), "{pieces}");
    let seen = r.origin.seen.lock().unwrap().clone();
    assert!(
        seen.iter()
            .all(|q| header(q, "range").is_none() && header(q, "if-range").is_none())
    );
    assert!(
        seen.iter()
            .all(|q| header(q, "authorization") == Some(&format!("Bearer {KEY}")))
    );

    // Control: asked for pieces, this origin sends pieces of the real key, which the
    // whole-value scrubber does not recognise.
    let mut joined = Vec::new();
    for start in (0..KEY.len() + 7 + 7).step_by(8) {
        let head = format!(
            "GET /echo HTTP/1.1\r\nHost: {API}\r\nAuthorization: Bearer {KEY}\r\nRange: bytes={start}-{}\r\n\r\n",
            start + 7
        );
        let req = parse_request_head(head.as_bytes()).unwrap();
        let raw = ranged()(&req, b"");
        let body = &raw[raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4..];
        joined.extend_from_slice(&r.gw.scrubber().replace_all(body));
    }
    assert!(String::from_utf8_lossy(&joined).contains(KEY));
}

/// One websocket frame from the origin (unmasked), FIN as given.
fn ws_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![if fin { 0x80 } else { 0 } | opcode];
    if payload.len() < 126 {
        f.push(payload.len() as u8);
    } else {
        f.push(126);
        f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    }
    f.extend_from_slice(payload);
    f
}

/// Each frame in `bytes` (FIN, opcode, payload); the origin's frames here are never masked.
fn ws_frames(mut bytes: &[u8]) -> Vec<(bool, u8, Vec<u8>)> {
    let mut out = Vec::new();
    while bytes.len() >= 2 {
        assert_eq!(bytes[1] & 0x80, 0, "a masked frame from the gateway");
        let (n, len) = match bytes[1] & 0x7f {
            126 => (4, usize::from(u16::from_be_bytes([bytes[2], bytes[3]]))),
            127 => panic!("no frame here is that long"),
            l => (2, usize::from(l)),
        };
        out.push((
            bytes[0] & 0x80 != 0,
            bytes[0] & 0x0f,
            bytes[n..n + len].to_vec(),
        ));
        bytes = &bytes[n + len..];
    }
    assert!(bytes.is_empty(), "a cut frame");
    out
}

/// A websocket origin that reflects the upgrade's `Authorization` in one text message, split
/// at the offset its path names (`/ws/AT`) into a frame and its continuation.
fn reflecting_ws() -> Handler {
    Arc::new(|req, _| {
        let at: usize = req.target.trim_start_matches("/ws/").parse().unwrap();
        let message = format!("you sent {}", header(req, "authorization").unwrap_or(""));
        let (a, b) = message.as_bytes().split_at(at.min(message.len()));
        let mut out = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".to_vec();
        out.extend_from_slice(&ws_frame(false, 1, a));
        out.extend_from_slice(&ws_frame(true, 0, b));
        out
    })
}

#[tokio::test]
async fn a_key_reflected_across_a_websocket_frame_and_its_continuation_is_scrubbed() {
    use tokio::io::AsyncReadExt;
    let r = run(reflecting_ws()).await;
    let ph = String::from_utf8(r.gw.scrubber().replace_all(KEY.as_bytes())).unwrap();
    let message = format!("you sent Bearer {KEY}");
    for at in 0..=message.len() {
        let mut c = jail(&r, API).await;
        let req = format!(
            "GET /ws/{at} HTTP/1.1\r\nHost: {API}\r\nAuthorization: Bearer {ph}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        c.io.write_all(req.as_bytes()).await.unwrap();
        c.io.flush().await.unwrap();
        let head = c.read_head(T, T).await.unwrap().unwrap();
        assert_eq!(parse_response_head(&head).unwrap().status, 101);
        let mut rest = c.buf.to_vec();
        let _ = tokio::time::timeout(T, c.io.read_to_end(&mut rest)).await;
        assert!(leaks(&rest, &[KEY]).is_empty(), "at {at}: {rest:?}");
        let frames = ws_frames(&rest);
        assert!(
            frames.last().is_some_and(|f| f.0),
            "at {at}: no final frame"
        );
        let got: Vec<u8> = frames.into_iter().flat_map(|f| f.2).collect();
        assert_eq!(
            String::from_utf8(got).unwrap(),
            format!("you sent Bearer {ph}"),
            "at {at}"
        );

        // Control: each frame scrubbed on its own (as before) leaves the key whole in the two
        // pieces whenever the split falls inside it.
        let (a, b) = message.as_bytes().split_at(at);
        let per_frame = [
            r.gw.scrubber().replace_all(a),
            r.gw.scrubber().replace_all(b),
        ]
        .concat();
        let inside = at > message.len() - KEY.len() && at < message.len();
        assert_eq!(
            String::from_utf8_lossy(&per_frame).contains(KEY),
            inside,
            "control at {at}"
        );
    }
}
