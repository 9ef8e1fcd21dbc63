//! Test fixtures: a loopback origin server, an echo server, a proxy harness and a small client.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use corral_audit::{AuditLog, Event, NetEvent};
use corral_net::http::{self, Framing};
use corral_net::{Listener, Proxy, ProxyConfig, ProxyHandle, Rules, StaticResolver};
use corral_policy::domain::DomainPattern;

/// An HTTP/1.1 origin on 127.0.0.1 with keep-alive. `GET /big?N` answers N bytes; `GET
/// /chunked` a chunked body; a request with a body answers `got N bytes`; anything else
/// `hello PATH`. It records every complete request it received.
pub struct Origin {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<String>>>,
    pub connections: Arc<AtomicUsize>,
}

impl Origin {
    pub fn start() -> Origin {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (r, c) = (requests.clone(), connections.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                c.fetch_add(1, Ordering::SeqCst);
                let r = r.clone();
                std::thread::spawn(move || origin_conn(s, r));
            }
        });
        Origin {
            addr,
            requests,
            connections,
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn seen(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

fn read_more(s: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut tmp = [0u8; 65536];
    match s.read(&mut tmp) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&tmp[..n]);
            true
        }
    }
}

fn read_line(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
            let line = buf[..i].to_vec();
            buf.drain(..i + 2);
            return Some(line);
        }
        if !read_more(s, buf) {
            return None;
        }
    }
}

fn read_n(s: &mut TcpStream, buf: &mut Vec<u8>, n: usize) -> Option<Vec<u8>> {
    while buf.len() < n {
        if !read_more(s, buf) {
            return None;
        }
    }
    Some(buf.drain(..n).collect())
}

/// Read a chunked body; `None` if it is cut or malformed.
fn read_chunked(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = read_line(s, buf)?;
        let size = http::parse_chunk_size(&line).ok()? as usize;
        if size == 0 {
            loop {
                if read_line(s, buf)?.is_empty() {
                    return Some(body);
                }
            }
        }
        body.extend(read_n(s, buf, size)?);
        if read_n(s, buf, 2)? != b"\r\n" {
            return None;
        }
    }
}

fn origin_conn(mut s: TcpStream, requests: Arc<Mutex<Vec<String>>>) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = Vec::new();
    loop {
        let end = loop {
            match http::find_head_end(&buf) {
                Ok(Some(e)) => break e,
                Ok(None) => {
                    if !read_more(&mut s, &mut buf) {
                        return;
                    }
                }
                Err(_) => return,
            }
        };
        let head: Vec<u8> = buf.drain(..end).collect();
        let Ok(req) = http::parse_request_head(&head) else {
            return;
        };
        let body = match req.framing {
            Framing::Length(n) => match read_n(&mut s, &mut buf, n as usize) {
                Some(b) => Some(b),
                None => return,
            },
            Framing::Chunked => match read_chunked(&mut s, &mut buf) {
                Some(b) => Some(b),
                None => return,
            },
            _ => None,
        };
        let host = http::header_values(&req.headers, "host")
            .next()
            .map(|h| String::from_utf8_lossy(h).into_owned())
            .unwrap_or_default();
        let names: Vec<String> = req
            .headers
            .iter()
            .map(|h| h.name.to_ascii_lowercase())
            .collect();
        requests.lock().unwrap().push(format!(
            "{} {} host={host} headers={}",
            req.method,
            req.target,
            names.join(",")
        ));
        let close = http::connection_tokens(&req.headers)
            .iter()
            .any(|t| t == "close");
        let conn = if close { "Connection: close\r\n" } else { "" };
        if let Some(n) = req.target.strip_prefix("/big?") {
            let n: usize = n.parse().unwrap();
            let _ = s.write_all(
                format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n{conn}\r\n").as_bytes(),
            );
            let block = vec![b'x'; 65536];
            let mut left = n;
            while left > 0 {
                let k = left.min(block.len());
                if s.write_all(&block[..k]).is_err() {
                    return;
                }
                left -= k;
            }
        } else if req.target == "/chunked" {
            let _ = s.write_all(
                format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n{conn}\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
                    .as_bytes(),
            );
        } else {
            let text = match body {
                Some(b) => format!("got {} bytes", b.len()),
                None => format!("hello {}", req.target),
            };
            let _ = s.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nX-Origin: yes\r\n{conn}\r\n{text}",
                    text.len()
                )
                .as_bytes(),
            );
        }
        if close {
            return;
        }
    }
}

/// A TCP echo server on 127.0.0.1.
pub fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut r = s.try_clone().unwrap();
                let _ = std::io::copy(&mut r, &mut s);
            });
        }
    });
    addr
}

pub struct Harness {
    pub addr: SocketAddr,
    pub handle: ProxyHandle,
    pub log: AuditLog,
    pub dir: tempfile::TempDir,
}

pub fn rules(allow: &[&str], cidrs: &[&str]) -> Rules {
    Rules {
        allow: allow
            .iter()
            .map(|p| DomainPattern::parse(p).unwrap())
            .collect(),
        allow_paths: Vec::new(),
        deny: Vec::new(),
        allow_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        upstream: None,
    }
}

/// The names the tests use, all resolved by the proxy's static resolver.
pub fn resolver() -> StaticResolver {
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    StaticResolver::new()
        .with("origin.test", &[lo])
        .with("other.test", &[lo])
        .with("a.origin.test", &[lo])
        .with("ten.test", &["10.1.2.3".parse().unwrap()])
        .with("meta.test", &["169.254.169.254".parse().unwrap()])
        .with("mixed.test", &["93.184.216.34".parse().unwrap(), lo])
        .with("v6lo.test", &["::1".parse().unwrap()])
        .with("mapped.test", &["::ffff:127.0.0.1".parse().unwrap()])
}

pub fn start(rules: Rules, config: ProxyConfig) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::at(dir.path().join("audit.jsonl"));
    let proxy = Proxy::new(rules, log.clone(), "testjail")
        .with_resolver(Arc::new(resolver()))
        .with_config(config);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let handle = corral_net::spawn(Arc::new(proxy), vec![Listener::Proxy(l)]).unwrap();
    Harness {
        addr,
        handle,
        log,
        dir,
    }
}

/// Rules that allow `origin.test` (any port named) and open loopback for the test origin.
pub fn start_default(origin_port: u16) -> Harness {
    start(
        rules(
            &["origin.test", &format!("origin.test:{origin_port}")],
            &["127.0.0.0/8"],
        ),
        ProxyConfig::default(),
    )
}

impl Harness {
    pub fn net_events(&self) -> Vec<NetEvent> {
        let (records, bad) = self.log.read_all().unwrap();
        assert_eq!(bad, 0);
        records
            .into_iter()
            .filter_map(|r| match r.event {
                Event::Net(n) => Some(n),
                _ => None,
            })
            .collect()
    }

    pub fn decisions(&self) -> Vec<(String, String, u16, String, String)> {
        self.net_events()
            .into_iter()
            .filter(|e| e.phase == corral_audit::NetPhase::Decision)
            .map(|e| {
                let d = match e.decision {
                    Some(corral_audit::Decision::Allow) => "allow",
                    Some(corral_audit::Decision::Deny) => "deny",
                    None => "-",
                };
                (e.method, e.host, e.port, d.to_string(), e.rule)
            })
            .collect()
    }

    /// Wait until the log holds at least `n` events (writes happen on the proxy's thread).
    pub fn wait_events(&self, n: usize) -> Vec<NetEvent> {
        for _ in 0..200 {
            let ev = self.net_events();
            if ev.len() >= n {
                return ev;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.net_events()
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }
}

/// Send raw bytes on a fresh connection, close the sending side, and read everything until the
/// proxy closes it.
pub fn exchange(addr: SocketAddr, raw: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(raw);
    let _ = s.shutdown(Shutdown::Write);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

pub fn status_of(resp: &str) -> u16 {
    resp.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0)
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub struct Client {
    pub s: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Client { s, buf: Vec::new() }
    }

    pub fn send(&mut self, raw: &[u8]) {
        self.s.write_all(raw).unwrap();
    }

    /// Read one response (Content-Length, chunked, or until close); `None` if the connection
    /// closed before a head.
    pub fn response(&mut self) -> Option<Response> {
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if !read_more(&mut self.s, &mut self.buf) {
                return None;
            }
        };
        let head: Vec<u8> = self.buf.drain(..end).collect();
        let parsed = http::parse_response_head(&head).unwrap();
        let framing = http::response_framing(&parsed, "GET").unwrap();
        let body = match framing {
            Framing::None => Vec::new(),
            Framing::Length(n) => read_n(&mut self.s, &mut self.buf, n as usize)?,
            Framing::Chunked => read_chunked(&mut self.s, &mut self.buf)?,
            Framing::UntilClose => {
                while read_more(&mut self.s, &mut self.buf) {}
                std::mem::take(&mut self.buf)
            }
        };
        Some(Response {
            status: parsed.status,
            head: String::from_utf8_lossy(&head).into_owned(),
            body,
        })
    }

    pub fn request(&mut self, raw: &str) -> Option<Response> {
        self.send(raw.as_bytes());
        self.response()
    }

    /// Whether the proxy closed the connection (EOF within the timeout).
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.s.read(&mut b), Ok(0))
    }

    pub fn shutdown_write(&self) {
        let _ = self.s.shutdown(Shutdown::Write);
    }
}
