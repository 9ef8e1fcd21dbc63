//! The egress proxy: plain HTTP forwarding, CONNECT tunnels and SOCKS5 on one listener.
//!
//! Per request: parse exactly (`corral-http1`) -> normalize the host (`corral_policy::domain`) ->
//! deny list -> allow list (`Rules::check_name`) -> resolve (the proxy's [`Resolver`]) -> check
//! EVERY resolved address (`corral_policy::addr::check_destination`) -> connect to one of exactly
//! those addresses, never by name. A kept-alive client connection is pinned to the first host it
//! was allowed to reach. Every decision and every closed upstream connection is one audit line.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use corral_audit::{AuditLog, Decision, Event, NetEvent, NetPhase, Record};
use corral_policy::addr::check_destination;
use corral_policy::domain::{Host, normalize_host, parse_authority};
use corral_policy::plan::OnDeny;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::ask::{Asks, HELD_BYTES, NotHeld, Outcome};
use crate::bounds::{Budget, Notice, Refusals, out_of_descriptors, reason};
use crate::http::exchange::{
    Done, ExchangeError, Flow, HeadRefusal, Moved, Outgoing, Requests, exchange, identity_only,
    serve_requests,
};
use crate::http::io::{BufConn, error_response};
use crate::http::{self, Framing, RequestHead, Version, parse_response_head};
use crate::open::{Dest, OpenConns, Owed};
use crate::rules::{Allowed, Denial, Kind, Resolver, Rules, SystemResolver, host_display};

/// Resource bounds.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Time a client has to send a complete request head (slow-loris bound).
    pub header_timeout: Duration,
    /// Time without a byte in either direction before a tunnel, a kept-alive connection or a
    /// pending response is closed.
    pub idle_timeout: Duration,
    /// Time to resolve and connect to a destination.
    pub connect_timeout: Duration,
    /// Concurrent client connections of this proxy (one proxy per jail); beyond it new
    /// connections are refused.
    pub max_connections: usize,
    /// Bytes of buffers this proxy holds for its jail's connections, twice: request heads
    /// being read (slow clients' partial heads) at most this much, and tunnel data a writer has
    /// not taken yet about as much. A head that would pass it is refused with 503; past it,
    /// tunnels read 1 KiB at a time instead of 64 ([`ProxyConfig::buffer_budget_for`]).
    pub buffer_budget: usize,
}

impl ProxyConfig {
    /// The buffer budget for a jail whose policy allows `memory` bytes: 1/256 of it, at least
    /// 4 MiB and at most 32 MiB (16 MiB for the 4g default, and without a memory limit).
    pub fn buffer_budget_for(memory: Option<u64>) -> usize {
        const MIB: u64 = 1024 * 1024;
        memory.map_or(16 * MIB, |m| (m / 256).clamp(4 * MIB, 32 * MIB)) as usize
    }
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            header_timeout: Duration::from_secs(15),
            idle_timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(10),
            max_connections: 4096,
            buffer_budget: ProxyConfig::buffer_budget_for(None),
        }
    }
}

/// One line of the end-of-run summary: a blocked destination and how often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub method: String,
    pub target: String,
    pub rule: String,
    pub fix: String,
    pub count: u64,
}

impl Blocked {
    /// `corral: blocked CONNECT github.com:443 ×3 (not in network.allow) — allow with: ...`
    /// What the jail chose is escaped as `corral log` escapes it ([`corral_audit::printable`]).
    pub fn summary_line(&self) -> String {
        use corral_audit::printable as p;
        format!(
            "corral: blocked {} {} ×{} ({}) — {}",
            p(&self.method),
            p(&self.target),
            self.count,
            p(&self.rule),
            p(&self.fix)
        )
    }

    /// An allowed destination that could not be reached:
    /// `corral: failed CONNECT x.org:443 ×2 (cannot resolve x.org: ...)`.
    pub fn failed_line(&self) -> String {
        format!(
            "corral: failed {} {} ×{} ({})",
            self.method, self.target, self.count, self.rule
        )
    }
}

/// (method, target, rule) -> (fix, count).
type BlockedMap = BTreeMap<(String, String, String), (String, u64)>;

/// A summary map's lines, most frequent first.
fn summary_of(map: &Mutex<BlockedMap>) -> Vec<Blocked> {
    let map = map.lock().unwrap_or_else(|e| e.into_inner());
    let mut out: Vec<Blocked> = map
        .iter()
        .map(|((method, target, rule), (fix, count))| Blocked {
            method: method.clone(),
            target: target.clone(),
            rule: rule.clone(),
            fix: fix.clone(),
            count: *count,
        })
        .collect();
    out.sort_by_key(|b| std::cmp::Reverse(b.count));
    out
}

/// Count `[method, target, rule, fix]` into a summary map. The jail chooses the destinations
/// (random names, for one), so the distinct ones kept are bounded ([`BLOCKED_KEPT`]); the rest
/// share one line (`more than N distinct ones {what}`, `see them all with: {command}`), and
/// the audit log still has every one.
fn tally(map: &mut BlockedMap, line: [&str; 4], [what, command]: [&str; 2]) {
    let [method, target, rule, fix] = line;
    let mut key = (method.to_string(), target.to_string(), rule.to_string());
    let mut fix = fix.to_string();
    if map.len() >= BLOCKED_KEPT && !map.contains_key(&key) {
        key = (
            "...".into(),
            "other destinations".into(),
            format!("more than {BLOCKED_KEPT} distinct ones {what}"),
        );
        fix = format!("see them all with: {command}");
    }
    let e = map.entry(key).or_insert_with(|| (fix, 0));
    e.1 += 1;
}

/// Distinct blocked destinations the end-of-run summary keeps apart (corral's memory must not
/// grow with what the jail tries); the rest share one line.
pub const BLOCKED_KEPT: usize = 1000;

/// The proxy of one jail.
pub struct Proxy {
    rules: RwLock<Arc<Rules>>,
    audit: AuditLog,
    jail: String,
    resolver: Arc<dyn Resolver>,
    config: ProxyConfig,
    slots: Arc<Semaphore>,
    blocked: Mutex<BlockedMap>,
    /// Allowed requests that could not be served (resolution, connection), for the summary.
    failed: Mutex<BlockedMap>,
    /// Client connections finished so far (the memory trimmer looks at it).
    closed: AtomicU64,
    /// Whether the memory trimmer runs (started by the first `serve`).
    trimming: AtomicBool,
    /// Request heads being read, and tunnel data not yet written, held now (each bounded by
    /// [`ProxyConfig::buffer_budget`]).
    buffers: Arc<Budget>,
    pending: Arc<Budget>,
    /// Connections refused for want of a descriptor, requests refused because their record
    /// could not be written, heads refused over the budget: one stderr line per interval each.
    fd_refused: Notice,
    audit_refused: Notice,
    heads_refused: Notice,
    /// The credential gateway: CONNECTs to secret-bound hosts are handed to it, plain-HTTP
    /// heads are rewritten by it (crates/corral-gateway).
    gateway: Option<corral_gateway::Gateway>,
    /// `network.on_deny = "ask"`: the seconds a held connection waits; 0 refuses at once.
    ask_timeout: AtomicU32,
    /// The questions pending (the run's control socket lists and answers them).
    asks: Arc<Asks>,
    /// The upstream connections open, each owing its close record (open.rs).
    open: Arc<OpenConns>,
    /// Connections refused before any decision, counted into the audit log (bounds.rs).
    refusals: Arc<Refusals>,
    /// Whether the task writing `refusals` runs (started by the first `serve`).
    recording: AtomicBool,
}

/// The name of the proxy's listener in its `refused` records.
const LISTENER: &str = "the proxy";

/// The proxy's decision of each request in a connection the gateway intercepted for a host
/// decided by method and path ([`Rules::check_request`]).
struct PathGate<'a> {
    proxy: &'a Proxy,
    peer: &'a str,
    host: &'a Host,
    port: u16,
    kind: Kind,
    address: SocketAddr,
}

impl corral_gateway::RequestGate for PathGate<'_> {
    fn decide(&self, method: &str, target: &str) -> Result<String, corral_gateway::Refusal> {
        let dest = (self.host, self.port, self.kind);
        self.proxy
            .decide_request(self.peer, dest, Some(self.address), method, target)
            .map_err(|(status, message)| corral_gateway::Refusal { status, message })
    }
}

/// Why a request was not served, for the answer and the log.
enum Refusal {
    /// A policy decision (logged as deny, answered 403 unless `status` says otherwise).
    Denied(Denial),
    /// The request was allowed but could not be served (resolution, connect, upstream).
    Failed { rule: String, status: u16 },
}

/// One direction of a tunnel. Idle, it holds no buffer: data is read into a buffer on the poll
/// function's stack and written straight on; only bytes the writer cannot take yet are copied to
/// the heap, and freed once written. 1,000 idle tunnels thus cost sockets and tasks, not buffers.
/// Those copies are counted in the proxy's buffer budget, if any: past it, reads shrink to
/// [`TUNNEL_READ_TIGHT`], so what a jail that stops reading makes corral hold stays small.
struct Direction {
    pending: Option<(Box<[u8]>, usize)>,
    read_done: bool,
    shut_down: bool,
    bytes: u64,
    budget: Option<Arc<Budget>>,
}

impl Direction {
    fn new(budget: Option<Arc<Budget>>) -> Direction {
        Direction {
            pending: None,
            read_done: false,
            shut_down: false,
            bytes: 0,
            budget,
        }
    }

    /// Keep `data` until the writer takes it (counted in the budget).
    fn hold(&mut self, data: &[u8]) {
        if let Some(b) = &self.budget {
            b.charge(data.len());
        }
        self.pending = Some((data.to_vec().into_boxed_slice(), 0));
    }

    /// The pending data is written (or dropped): give its bytes back.
    fn release(&mut self) {
        if let Some((buf, _)) = self.pending.take()
            && let Some(b) = &self.budget
        {
            b.give(buf.len());
        }
    }

    /// How much to read at once: less when the budget is spent.
    fn read_size(&self) -> usize {
        match &self.budget {
            Some(b) if b.used().saturating_add(TUNNEL_READ) > b.limit() => TUNNEL_READ_TIGHT,
            _ => TUNNEL_READ,
        }
    }
}

impl Drop for Direction {
    fn drop(&mut self) {
        self.release();
    }
}

const TUNNEL_READ: usize = 64 * 1024;
/// A tunnel's read size once the proxy's buffer budget is spent.
const TUNNEL_READ_TIGHT: usize = 1024;

fn poll_direction<R, W>(
    cx: &mut Context<'_>,
    mut r: Pin<&mut R>,
    mut w: Pin<&mut W>,
    d: &mut Direction,
) -> Poll<io::Result<()>>
where
    R: AsyncRead + ?Sized,
    W: AsyncWrite + ?Sized,
{
    // Bound the work done in one poll so the other direction and other tasks get their turn.
    for _ in 0..32 {
        if let Some((buf, pos)) = d.pending.as_mut() {
            while *pos < buf.len() {
                match w.as_mut().poll_write(cx, &buf[*pos..]) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(n)) => *pos += n,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            d.release();
        }
        if d.read_done {
            if !d.shut_down {
                match w.as_mut().poll_shutdown(cx) {
                    Poll::Ready(_) => d.shut_down = true,
                    Poll::Pending => return Poll::Pending,
                }
            }
            return Poll::Ready(Ok(()));
        }
        let mut stack = [0u8; TUNNEL_READ];
        let size = d.read_size();
        let mut rb = ReadBuf::new(&mut stack[..size]);
        match r.as_mut().poll_read(cx, &mut rb) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => {}
        }
        let n = rb.filled().len();
        if n == 0 {
            d.read_done = true;
            continue;
        }
        d.bytes += n as u64;
        let mut pos = 0;
        while pos < n {
            match w.as_mut().poll_write(cx, &stack[pos..n]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(k)) => pos += k,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    d.hold(&stack[pos..n]);
                    return Poll::Pending;
                }
            }
        }
    }
    cx.waker().wake_by_ref();
    Poll::Pending
}

/// Relay bytes both ways until both sides close, either fails, or nothing moves for `idle`.
/// Resolves to (bytes a->b, bytes b->a). Data a writer cannot take yet is counted in `budget`.
pub(crate) fn tunnel<A, B>(a: A, b: B, idle: Duration, budget: Option<Arc<Budget>>) -> Relay<A, B>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    Relay {
        a,
        b,
        up: Direction::new(budget.clone()),
        down: Direction::new(budget),
        timer: None,
        idle,
    }
}

/// The future of [`tunnel`], written out by hand so an idle tunnel holds exactly this: the two
/// streams, two small `Direction`s and its idle timer (created at the first poll).
pub(crate) struct Relay<A, B> {
    a: A,
    b: B,
    up: Direction,
    down: Direction,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    idle: Duration,
}

impl<A, B> Future for Relay<A, B>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    type Output = (u64, u64);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<(u64, u64)> {
        let r = self.get_mut();
        let moved = r.up.bytes + r.down.bytes;
        let r1 = poll_direction(cx, Pin::new(&mut r.a), Pin::new(&mut r.b), &mut r.up);
        let r2 = poll_direction(cx, Pin::new(&mut r.b), Pin::new(&mut r.a), &mut r.down);
        match (r1, r2) {
            (Poll::Ready(Err(_)), _) | (_, Poll::Ready(Err(_))) => {
                return Poll::Ready((r.up.bytes, r.down.bytes));
            }
            (Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => {
                return Poll::Ready((r.up.bytes, r.down.bytes));
            }
            _ => {}
        }
        let idle = r.idle;
        let timer = r
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        if r.up.bytes + r.down.bytes != moved {
            timer.as_mut().reset(tokio::time::Instant::now() + idle);
        }
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready((r.up.bytes, r.down.bytes));
        }
        Poll::Pending
    }
}

/// The upstream side of a kept-alive client connection: pinned to one host.
struct Pinned {
    host: Host,
    port: u16,
    up: Option<Upstream>,
}

struct Upstream {
    conn: BufConn<TcpStream>,
    bytes_up: u64,
    bytes_down: u64,
    /// Its close record (written when the connection is dropped, with the counts last set).
    owed: Owed,
}

/// The proxy's steps in the shared request loop (`corral_http1::exchange`, the loop the
/// credential gateway runs too): plain-HTTP requests on one client connection, pinned to one
/// host; a CONNECT on a fresh connection is handed back.
struct PlainHttp<'a> {
    proxy: &'a Proxy,
    peer: &'a str,
    pinned: Option<Pinned>,
    /// A captured port-80 connection's destination: origin-form targets are taken as for it.
    captured: Option<(Host, u16)>,
}

impl<S> Requests<S> for PlainHttp<'_>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    /// A CONNECT: the caller decides its tunnel.
    type Handoff = RequestHead;

    async fn refuse_head(&mut self, client: &mut BufConn<S>, r: HeadRefusal) {
        let proxy = self.proxy;
        if r.over_budget {
            let limit = proxy.buffers.limit();
            proxy.refusals.hit(LISTENER, reason::HEADS);
            proxy.heads_refused.hit(|n| {
                format!("corral proxy: {n} request(s) refused in the last 10 s: the jail's partial request heads passed {limit} bytes")
            });
        } else {
            // A head that could not be read (malformed, too large, too slow): one record each,
            // as for any malformed request (the jail paces these: each costs it a connection).
            proxy.log_unreadable(self.peer, &r.why);
        }
        let body = format!("corral: {}\n", r.why);
        proxy.reply_and_close(&mut client.io, r.status, &body).await;
    }

    async fn request(
        &mut self,
        client: &mut BufConn<S>,
        mut req: RequestHead,
    ) -> Flow<RequestHead> {
        let (proxy, peer) = (self.proxy, self.peer);
        if let Some((host, port)) = &self.captured
            && req.target.starts_with('/')
        {
            req.target = format!("http://{}{}", authority_string(host, *port), req.target);
        }
        if req.method == "CONNECT" {
            if self.pinned.is_none() {
                return Flow::Handoff(req);
            }
            let why = "CONNECT on a connection already used for plain HTTP";
            proxy.log_bad(peer, "CONNECT", &req.target, why);
            let body = format!("corral: {why}; open a new connection\n");
            proxy.reply_and_close(&mut client.io, 400, &body).await;
            return Flow::Close;
        }
        match Box::pin(proxy.forward_one(client, req, peer, &mut self.pinned)).await {
            true => Flow::Continue,
            false => Flow::Close,
        }
    }
}

/// What the gateway's step gives a plain-HTTP request: its rewrite (audited once sent) and the
/// scrubber of a secret-bound host's answer.
type PlainRewrite<'a> = (
    Option<(&'a corral_gateway::Gateway, corral_gateway::RewriteReport)>,
    Option<http::io::Replacer>,
);

/// An established tunnel, handed out of the phase that decided it (whose state is then freed).
struct Tunnel<S> {
    client: S,
    up: TcpStream,
    meta: TunnelMeta,
}

/// What the close line of a tunnel says besides the byte counts.
struct TunnelMeta {
    method: &'static str,
    host: String,
    port: u16,
    address: SocketAddr,
    started: Instant,
    /// Bytes the client sent before the tunnel was established, already written upstream.
    early: u64,
}

/// The task of an established tunnel: the relay, then its close line; the connection's slot is
/// released when it ends.
struct TunnelTask<S> {
    relay: RecordedRelay<S, TcpStream>,
    proxy: Arc<Proxy>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Future for TunnelTask<S> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let t = self.get_mut();
        if Pin::new(&mut t.relay).poll(cx).is_pending() {
            return Poll::Pending;
        }
        t.proxy.closed.fetch_add(1, Ordering::Relaxed);
        Poll::Ready(())
    }
}

/// A relay whose close record is owed (open.rs): it keeps the record's counters current, and
/// when the proxy shuts down it ends at its next poll (both sockets closed). Its record is
/// written when it ends, either way.
pub(crate) struct RecordedRelay<A, B> {
    relay: Relay<A, B>,
    /// Its close record; `None` once written.
    owed: Option<Owed>,
    /// Bytes the client sent before the relay started (already written upstream).
    early: u64,
}

impl<A, B> RecordedRelay<A, B>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    pub(crate) fn new(relay: Relay<A, B>, owed: Owed, early: u64) -> Self {
        RecordedRelay {
            relay,
            owed: Some(owed),
            early,
        }
    }
}

impl<A, B> Future for RecordedRelay<A, B>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let t = self.get_mut();
        let done = Pin::new(&mut t.relay).poll(cx);
        let (up, down) = match done {
            Poll::Ready(bytes) => bytes,
            Poll::Pending => (t.relay.up.bytes, t.relay.down.bytes),
        };
        let Some(owed) = t.owed.take() else {
            return Poll::Ready(());
        };
        if done.is_pending() && !owed.stopped(cx) {
            owed.set_bytes(up + t.early, down);
            t.owed = Some(owed);
            return Poll::Pending;
        }
        owed.close(up + t.early, down);
        Poll::Ready(())
    }
}

/// Bytes taken from a [`Budget`], given back when dropped.
struct ReservedBudget<'a>(&'a Budget, usize);

impl Drop for ReservedBudget<'_> {
    fn drop(&mut self) {
        self.0.give(self.1);
    }
}

/// Ends when the client closes its side or fails; what it sends meanwhile is kept in its
/// buffer, up to [`HELD_BYTES`] (beyond, it is not read and this waits forever).
async fn client_gone<S: AsyncRead + Unpin>(client: &mut BufConn<S>) {
    use tokio::io::AsyncReadExt as _;
    loop {
        let room = HELD_BYTES.saturating_sub(client.buf.len());
        if room == 0 {
            return std::future::pending().await;
        }
        match (&mut client.io)
            .take(room as u64)
            .read_buf(&mut client.buf)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// DST.ADDR of a SOCKS5 request of address type `atyp`, read by `deadline`: the host, or why
/// it is not one; `None` when the client went away or was too slow, or named an unknown
/// address type (answered REP=8).
async fn read_socks_address<S>(
    client: &mut BufConn<S>,
    atyp: u8,
    deadline: Instant,
) -> Option<Result<Host, String>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let t = deadline;
    let host = match atyp {
        1 => {
            let b = client.read_exact_by(4, t).await.ok()?;
            Ok(Host::Ip(IpAddr::from([b[0], b[1], b[2], b[3]])))
        }
        4 => {
            let b = client.read_exact_by(16, t).await.ok()?;
            let mut a = [0u8; 16];
            a.copy_from_slice(&b);
            Ok(Host::Ip(IpAddr::from(a)))
        }
        3 => {
            let len = client.read_exact_by(1, t).await.ok()?;
            let name = client.read_exact_by(len[0] as usize, t).await.ok()?;
            match std::str::from_utf8(&name) {
                Ok(n) if !n.contains(['%', '@', '/', ':', '[', ']']) => {
                    normalize_host(n).map_err(|e| e.to_string())
                }
                _ => Err(format!(
                    "invalid SOCKS5 host name {:?}",
                    String::from_utf8_lossy(&name)
                )),
            }
        }
        _ => {
            let _ = client.io.write_all(&[5, 8, 0, 1, 0, 0, 0, 0, 0, 0]).await;
            return None;
        }
    };
    Some(host)
}

/// Split an absolute-form `http://authority/path` target.
fn split_absolute(target: &str) -> Result<(&str, String), &'static str> {
    let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err("https URLs go through CONNECT, not plain forwarding");
    }
    if !lower.starts_with("http://") {
        return Err("not a proxy request: the request target must be an absolute http:// URL");
    }
    let rest = &target[7..];
    if rest.contains('#') {
        return Err("fragment in request target");
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    check_authority_chars(authority)?;
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    Ok((authority, path))
}

fn check_authority_chars(authority: &str) -> Result<(), &'static str> {
    if authority.is_empty() {
        return Err("empty authority");
    }
    if authority.contains('@') {
        return Err("credentials in the authority are not accepted");
    }
    if authority.contains(['%', '/', '\\']) {
        return Err("invalid character in the authority (zone id or escape)");
    }
    Ok(())
}

/// Whether the client's Host header (if any) names the same host and port as the target.
fn host_header_agrees(
    req: &RequestHead,
    host: &Host,
    port: u16,
    default_port: u16,
) -> Result<(), String> {
    match http::single_header(&req.headers, "host", "multiple Host headers") {
        Err(e) => Err(e.to_string()),
        Ok(None) => Ok(()),
        Ok(Some(v)) => {
            let raw = std::str::from_utf8(v).map_err(|_| "non-ASCII Host header".to_string())?;
            check_authority_chars(raw).map_err(|e| format!("Host header: {e}"))?;
            let (h, p) = parse_authority(raw).map_err(|e| format!("Host header: {e}"))?;
            if &h == host && p.unwrap_or(default_port) == port {
                Ok(())
            } else {
                Err(format!(
                    "Host header names {raw}, the request target names {}:{port}",
                    host_display(host)
                ))
            }
        }
    }
}

fn authority_string(host: &Host, port: u16) -> String {
    format!("{}:{port}", host_display(host))
}

impl Proxy {
    pub fn new(rules: Rules, audit: AuditLog, jail: impl Into<String>) -> Self {
        let config = ProxyConfig::default();
        let jail = jail.into();
        Proxy {
            rules: RwLock::new(Arc::new(rules)),
            resolver: Arc::new(SystemResolver),
            slots: Arc::new(Semaphore::new(config.max_connections)),
            buffers: Arc::new(Budget::new(config.buffer_budget)),
            pending: Arc::new(Budget::new(config.buffer_budget)),
            config,
            blocked: Mutex::new(BTreeMap::new()),
            failed: Mutex::new(BTreeMap::new()),
            closed: AtomicU64::new(0),
            trimming: AtomicBool::new(false),
            fd_refused: Notice::new(),
            audit_refused: Notice::new(),
            heads_refused: Notice::new(),
            gateway: None,
            ask_timeout: AtomicU32::new(0),
            asks: Arc::new(Asks::default()),
            open: Arc::new(OpenConns::new(audit.clone(), &jail)),
            refusals: Arc::new(Refusals::new(audit.clone(), jail.clone())),
            recording: AtomicBool::new(false),
            audit,
            jail,
        }
    }

    /// Serve `[secrets]` through `gateway`: allowed CONNECTs to the hosts it binds are
    /// terminated and re-encrypted by it, plain-HTTP requests get their placeholders swapped.
    pub fn with_gateway(mut self, gateway: corral_gateway::Gateway) -> Self {
        self.gateway = Some(gateway);
        self
    }

    /// Use `resolver` instead of the system resolver (tests, a pinned resolver).
    pub fn with_resolver(mut self, resolver: Arc<dyn Resolver>) -> Self {
        self.resolver = resolver;
        self
    }

    pub fn with_config(mut self, config: ProxyConfig) -> Self {
        self.slots = Arc::new(Semaphore::new(config.max_connections));
        self.buffers = Arc::new(Budget::new(config.buffer_budget));
        self.pending = Arc::new(Budget::new(config.buffer_budget));
        self.config = config;
        self
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replace the rules (policy reload). Established tunnels keep running; every later decision,
    /// including the next request on a kept-alive connection, uses the new rules.
    pub fn set_rules(&self, rules: Rules) {
        *self.rules.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(rules);
    }

    /// What to do with a request the allow list does not name (`network.on_deny`); a policy
    /// reload may change it.
    pub fn set_on_deny(&self, on: OnDeny) {
        let secs = match on {
            OnDeny::Refuse => 0,
            OnDeny::Ask { timeout } => timeout.max(1),
        };
        self.ask_timeout.store(secs, Ordering::Relaxed);
    }

    /// The questions pending with `network.on_deny = "ask"`.
    pub fn asks(&self) -> &Arc<Asks> {
        &self.asks
    }

    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    pub fn jail(&self) -> &str {
        &self.jail
    }

    /// Blocked destinations so far, for the end-of-run summary (most frequent first).
    pub fn blocked_summary(&self) -> Vec<Blocked> {
        summary_of(&self.blocked)
    }

    /// Allowed destinations that could not be reached so far, with the reason (most frequent
    /// first): the jail saw them fail, and only corral knows why.
    pub fn failed_summary(&self) -> Vec<Blocked> {
        summary_of(&self.failed)
    }

    /// Count one allowed request that could not be served into [`Proxy::failed_summary`].
    fn note_failed(&self, method: &str, target: &str, reason: &str) {
        let mut map = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        tally(
            &mut map,
            [method, target, reason, ""],
            ["failed", "corral log"],
        );
    }

    /// Write one record; `false` when it could not be written (the caller refuses what it
    /// would have recorded; the failure is counted by the log and said on stderr, at most
    /// once per interval).
    #[must_use]
    fn log(&self, ev: NetEvent) -> bool {
        match self.audit.write(&Record::now(&self.jail, Event::Net(ev))) {
            Ok(()) => true,
            Err(e) => {
                self.audit_refused.hit(|n| {
                    format!(
                        "corral proxy: cannot write the audit log ({e}): {n} record(s) lost in the last 10 s; what they would record is refused"
                    )
                });
                false
            }
        }
    }

    /// Write a record decided beside the proxy with its rules (the stub resolver's); `false`
    /// when it could not be written (the caller refuses what it records).
    #[must_use]
    pub fn record(&self, ev: NetEvent) -> bool {
        self.log(ev)
    }

    /// The answer to a request allowed but not recorded.
    const UNRECORDED: &str = "corral: the audit log cannot be written, so this request is refused (see corral's stderr)\n";

    /// The connections refused for want of a descriptor (the proxy's own listener and the
    /// stub's capture listeners count here).
    pub fn refused_for_descriptors(&self) -> &Notice {
        &self.fd_refused
    }

    /// Connections refused before any decision (counted into the audit log's `refused`
    /// records; [`Refusals::totals`] for the run's `exit` record).
    pub fn refusals(&self) -> &Arc<Refusals> {
        &self.refusals
    }

    /// The connections owing their close record, for the bridges that relay beside the proxy
    /// (`host_ports`).
    pub(crate) fn open_conns(&self) -> &Arc<OpenConns> {
        &self.open
    }

    /// Upstream connections open now, each owing its close record.
    pub fn open_connections(&self) -> usize {
        self.open.open_count()
    }

    /// End the proxy's work for the run: every open connection is ended and its close record
    /// written (bytes each way, duration); one still running after `deadline` is recorded from
    /// its counters. Then the refusals not yet recorded are. Connections that arrive later are
    /// refused. Returns how many close records were written past the deadline.
    pub async fn shutdown(&self, deadline: Duration) -> usize {
        let late = self.open.shutdown(deadline).await;
        self.refusals.flush();
        late
    }

    /// End-of-run lines for the bounds that were hit (descriptors, head budget); empty when
    /// none was. Records that could not be written are the audit log's to say
    /// ([`corral_audit::AuditLog::failures`]).
    pub fn bounds_summary(&self) -> Vec<String> {
        let mut out = Vec::new();
        let fds = self.fd_refused.total();
        if fds > 0 {
            out.push(format!(
                "corral: {fds} connection(s) refused: corral was out of file descriptors (raise the hard limit: ulimit -Hn)"
            ));
        }
        let heads = self.heads_refused.total();
        if heads > 0 {
            out.push(format!(
                "corral: {heads} request(s) refused with 503: the jail's partial request heads passed {} bytes",
                self.buffers.limit()
            ));
        }
        out
    }

    /// Bytes of request heads and pending tunnel data held now (tests, benchmarks).
    pub fn buffered_bytes(&self) -> usize {
        self.buffers.used() + self.pending.used()
    }

    #[allow(clippy::too_many_arguments)]
    #[must_use]
    fn log_decision(
        &self,
        client: &str,
        method: &str,
        host: &str,
        port: u16,
        address: Option<SocketAddr>,
        decision: Decision,
        rule: &str,
    ) -> bool {
        self.log(NetEvent {
            phase: NetPhase::Decision,
            client: client.into(),
            method: method.into(),
            host: host.into(),
            port,
            address: address.map(|a| a.ip().to_string()),
            decision: Some(decision),
            rule: rule.into(),
            ..Default::default()
        })
    }

    fn log_denial(&self, client: &str, method: &str, host: &str, port: u16, d: &Denial) {
        // Refused either way; a record that could not be written is counted by the log.
        let _ = self.log_decision(client, method, host, port, None, Decision::Deny, &d.rule);
        self.note_blocked(method, &format!("{host}:{port}"), &d.rule, &d.fix);
    }

    /// Count one refusal into the end-of-run summary ([`Proxy::blocked_summary`]). The proxy's
    /// own denials come here; so do those decided beside it with its rules (the stub
    /// resolver's refused names, connections captured to addresses it never handed out), whose
    /// callers write their own audit record.
    ///
    /// The jail chooses the destinations (random names, for one), so the distinct ones kept are
    /// bounded ([`BLOCKED_KEPT`]); the rest are counted in one line, and the audit log still
    /// has every one.
    pub fn note_blocked(&self, method: &str, target: &str, rule: &str, fix: &str) {
        let mut map = self.blocked.lock().unwrap_or_else(|e| e.into_inner());
        let line = [method, target, rule, fix];
        tally(&mut map, line, ["were blocked", "corral log --blocked"]);
    }

    #[allow(clippy::too_many_arguments)]
    fn log_close(
        &self,
        client: &str,
        method: &str,
        host: &str,
        port: u16,
        address: SocketAddr,
        up: u64,
        down: u64,
        started: Instant,
    ) {
        // The connection is over: a close line that cannot be written is counted by the log.
        let _ = self.log(NetEvent {
            phase: NetPhase::Close,
            client: client.into(),
            method: method.into(),
            host: host.into(),
            port,
            address: Some(address.ip().to_string()),
            decision: None,
            rule: String::new(),
            bytes_up: up,
            bytes_down: down,
            duration_ms: started.elapsed().as_millis() as u64,
            ..Default::default()
        });
    }

    /// Accept on `listener` (any thread's or namespace's socket) until the runtime stops.
    pub async fn serve(self: Arc<Self>, listener: std::net::TcpListener) -> io::Result<()> {
        let mut listener = crate::bounds::Acceptor::new(
            listener,
            "the proxy",
            crate::bounds::REFUSED_503,
            &self.fd_refused,
        )?
        .recorded(self.refusals.clone());
        self.start_trimmer();
        self.start_recorder();
        loop {
            // Out of descriptors: the waiting client gets a 503; never exit.
            let (stream, peer) = listener.accept().await;
            let _ = stream.set_nodelay(true);
            self.clone().spawn_client(stream, peer.to_string());
        }
    }

    /// Accept on a unix listener (the bridge from a jail, or `--listen unix:PATH`).
    pub async fn serve_unix(
        self: Arc<Self>,
        listener: std::os::unix::net::UnixListener,
    ) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::UnixListener::from_std(listener)?;
        self.start_trimmer();
        self.start_recorder();
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    self.fd_refused
                        .hit(|n| format!("corral proxy: accept: {e} ({n} in the last 10 s)"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            self.clone().spawn_client(stream, "unix".into());
        }
    }

    /// Write the refusals counted, once per interval ([`Refusals::run`]). Started once per
    /// proxy; ends with it.
    pub fn start_recorder(&self) {
        if self.recording.swap(true, Ordering::Relaxed) {
            return;
        }
        tokio::spawn(Refusals::run(Arc::downgrade(&self.refusals)));
    }

    /// Give the memory that finished connections freed back to the system: every 10 s, if a
    /// connection ended since the last look, `malloc_trim(0)`. glibc otherwise keeps freed
    /// chunks in its arenas, so one burst of connections would set the proxy's footprint for
    /// good. Started once per proxy; ends with it. No-op on other C libraries.
    fn start_trimmer(self: &Arc<Self>) {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            if self.trimming.swap(true, Ordering::Relaxed) {
                return;
            }
            let weak = Arc::downgrade(self);
            tokio::spawn(async move {
                let mut seen = 0;
                let mut tick = tokio::time::interval(Duration::from_secs(10));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(closed) = weak.upgrade().map(|p| p.closed.load(Ordering::Relaxed))
                    else {
                        return;
                    };
                    if closed != seen {
                        seen = closed;
                        // SAFETY: malloc_trim only hands the allocator's free pages back to
                        // the kernel; it takes the arenas' locks itself.
                        unsafe {
                            libc::malloc_trim(0);
                        }
                    }
                }
            });
        }
    }

    fn spawn_client<S>(self: Arc<Self>, stream: S, client: String)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match self.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(async move {
                    // At shutdown the phases that decide are dropped: a connection they opened
                    // upstream is recorded as its guard goes (open.rs).
                    let decided = tokio::select! {
                        t = self.clone().handle(stream, &client) => t,
                        () = self.open.stopping() => None,
                    };
                    let Some(t) = decided else {
                        self.closed.fetch_add(1, Ordering::Relaxed);
                        return;
                    };
                    // A task of its own, holding only the tunnel: this one, with the state of
                    // the phases that decided it, ends here.
                    if let Some(task) = self.run_tunnel(t, client, permit) {
                        tokio::spawn(task);
                    }
                });
            }
            Err(_) => {
                self.refusals.hit(LISTENER, reason::CONNECTIONS);
                tokio::spawn(async move {
                    let mut stream = stream;
                    let body = format!(
                        "corral proxy: too many connections from this jail (limit {})\n",
                        self.config.max_connections
                    );
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        stream.write_all(&error_response(503, &body)),
                    )
                    .await;
                });
            }
        }
    }

    /// Serve one client connection (HTTP or SOCKS5, told apart by the first byte).
    ///
    /// The phases that decide (parsing, resolving, forwarding) are boxed futures that end by
    /// handing back an established tunnel, so their state and read buffer are freed before the
    /// tunnel runs: what an idle tunnel keeps is its task and two sockets, no buffer.
    async fn handle<S>(self: Arc<Self>, stream: S, client: &str) -> Option<Tunnel<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let mut conn = BufConn::new(stream);
        match conn.fill(self.config.header_timeout).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        if conn.buf[0] == 0x05 {
            Box::pin(self.socks(conn, client)).await
        } else {
            Box::pin(self.http(conn, client)).await
        }
    }

    /// Run one connection's opening phase as [`Proxy::serve`] would (an HTTP request or a
    /// SOCKS5 handshake, told apart by the first byte) on any byte stream, and drop the tunnel
    /// it may establish: `true` when one was. For the fuzz targets (`fuzz/`), which drive it
    /// over an in-memory stream.
    #[doc(hidden)]
    pub async fn handshake<S>(self: Arc<Self>, stream: S, client: &str) -> bool
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        self.handle(stream, client).await.is_some()
    }

    async fn reply_and_close<S: AsyncWrite + Unpin>(&self, io: &mut S, status: u16, body: &str) {
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            io.write_all(&error_response(status, body)),
        )
        .await;
        let _ = io.shutdown().await;
    }

    fn denial_body(method: &str, target: &str, d: &Denial) -> String {
        format!(
            "corral: blocked {method} {target} ({})\n{}\nOr permanently, in the project's corral.toml: corral allow HOST[:PORT]\n",
            d.rule, d.fix
        )
    }

    async fn http<S>(&self, client: BufConn<S>, peer: &str) -> Option<Tunnel<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        self.http_pinned(client, peer, None).await
    }

    /// Plain HTTP requests, on a connection pinned from the start to `captured` (a captured
    /// port-80 connection: origin-form requests are taken as requests for that host, and the
    /// `Host` header must name it) or to the first host allowed. The loop is the one the
    /// credential gateway runs too (`corral_http1::exchange`); a CONNECT ends it.
    async fn http_pinned<S>(
        &self,
        mut client: BufConn<S>,
        peer: &str,
        captured: Option<(Host, u16)>,
    ) -> Option<Tunnel<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let mut steps = PlainHttp {
            proxy: self,
            peer,
            pinned: captured.clone().map(|(host, port)| Pinned {
                host,
                port,
                up: None,
            }),
            captured,
        };
        let t = http::io::Timeouts {
            head: self.config.header_timeout,
            idle: self.config.idle_timeout,
        };
        let connect = serve_requests(&mut client, &mut steps, t, &self.buffers).await;
        if let Some(mut p) = steps.pinned.take() {
            self.drop_upstream(&mut p);
        }
        Box::pin(self.connect(client, connect?, peer)).await
    }

    /// Close the pinned upstream connection, if any (its `close` line is logged).
    fn drop_upstream(&self, p: &mut Pinned) {
        if let Some(up) = p.up.take() {
            up.owed.close(up.bytes_up, up.bytes_down);
        }
    }

    /// The request cannot be completed: the upstream connection is closed (so the origin never
    /// completes a half-sent request), the client gets `status` and `body`, then a close.
    /// Returns `false`: the client connection does not continue.
    async fn abandon<S: AsyncWrite + Unpin>(
        &self,
        io: &mut S,
        p: &mut Pinned,
        status: u16,
        body: &str,
    ) -> bool {
        self.drop_upstream(p);
        self.reply_and_close(io, status, body).await;
        false
    }

    /// An allowed connection dialled while the proxy shuts down: closed at once (its close
    /// line logged), the client answered 503, the refusal counted.
    async fn refuse_ending<S: AsyncWrite + Unpin>(
        &self,
        io: &mut S,
        peer: &str,
        method: &str,
        (shown, port): (&str, u16),
        address: SocketAddr,
    ) {
        self.refusals.hit(LISTENER, reason::ENDING);
        self.log_close(peer, method, shown, port, address, 0, 0, Instant::now());
        let body = "corral: the run is ending; no new connection\n";
        self.reply_and_close(io, 503, body).await;
    }

    /// Owe the close record of a connection the gateway intercepts; `None` once the proxy
    /// shuts down, with the refusal counted and the connection's close record written (the
    /// caller drops the connection).
    fn owe_intercepted(&self, dest: Dest<'_>) -> Option<crate::open::Owed> {
        let owed = self.open.register(dest);
        if owed.is_none() {
            self.refusals.hit(LISTENER, reason::ENDING);
            let Dest {
                peer,
                method,
                host,
                port,
                address,
                started,
            } = dest;
            self.log_close(peer, method, host, port, address, 0, 0, started);
        }
        owed
    }

    /// A request head that could not be read: logged as a denial of no known method or
    /// destination (`?`), and summarised as `blocked unreadable request`.
    fn log_unreadable(&self, peer: &str, why: &str) {
        let rule = format!("malformed: {why}");
        // Refused either way; a record that could not be written is counted by the log.
        let _ = self.log_decision(peer, "?", "?", 0, None, Decision::Deny, &rule);
        self.note_blocked("unreadable", "request", &rule, "fix the client's request");
    }

    /// A malformed-but-parsed request that names a target: logged as a denial.
    fn log_bad(&self, peer: &str, method: &str, target: &str, why: &str) {
        self.log_denial(
            peer,
            method,
            target,
            0,
            &Denial {
                rule: format!("malformed: {why}"),
                fix: "fix the client's request".into(),
                status: 400,
            },
        );
    }

    /// Resolve, check every address, connect to a checked one (directly or through the upstream
    /// proxy). Never connects by name.
    async fn dial(
        &self,
        rules: &Rules,
        host: &Host,
        port: u16,
    ) -> Result<(TcpStream, SocketAddr), Refusal> {
        let shown = host_display(host);
        let ips: Vec<IpAddr> = match host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => {
                match tokio::time::timeout(
                    self.config.connect_timeout,
                    self.resolver.resolve(name, port),
                )
                .await
                {
                    Ok(Ok(ips)) if !ips.is_empty() => ips,
                    Ok(Ok(_)) => {
                        return Err(Refusal::Failed {
                            rule: format!("{name} has no addresses"),
                            status: 502,
                        });
                    }
                    Ok(Err(e)) => {
                        return Err(Refusal::Failed {
                            rule: format!("cannot resolve {name}: {e}"),
                            status: 502,
                        });
                    }
                    Err(_) => {
                        return Err(Refusal::Failed {
                            rule: format!("resolving {name} timed out"),
                            status: 504,
                        });
                    }
                }
            }
        };
        for ip in &ips {
            if let Err(class) = check_destination(*ip, &rules.allow_cidrs) {
                let cidr = match ip {
                    IpAddr::V4(_) => format!("{ip}/32"),
                    IpAddr::V6(_) => format!("{ip}/128"),
                };
                let class = class.as_str();
                return Err(Refusal::Denied(Denial {
                    rule: format!("{shown} resolves to {ip} ({class}), not in network.allow_cidrs"),
                    fix: format!("allow with: network.allow_cidrs = [\"{cidr}\"] in corral.toml"),
                    status: 403,
                }));
            }
        }
        if let Some(upstream) = &rules.upstream {
            return self.dial_upstream(upstream, host, port, ips[0]).await;
        }
        let mut last_err = None;
        for ip in ips {
            let addr = SocketAddr::new(ip, port);
            match tokio::time::timeout(self.config.connect_timeout, TcpStream::connect(addr)).await
            {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok((s, addr));
                }
                Ok(Err(e)) if out_of_descriptors(&e) => {
                    self.fd_refused.hit(|n| {
                        format!("corral proxy: out of file descriptors: {n} connection(s) refused in the last 10 s (503: no descriptor to reach the destination)")
                    });
                    return Err(Refusal::Failed {
                        rule: format!("connect to {addr}: corral is out of file descriptors"),
                        status: 503,
                    });
                }
                Ok(Err(e)) => last_err = Some(format!("connect to {addr}: {e}")),
                Err(_) => last_err = Some(format!("connect to {addr} timed out")),
            }
        }
        Err(Refusal::Failed {
            rule: last_err.unwrap_or_else(|| "no address".into()),
            status: 502,
        })
    }

    /// A CONNECT tunnel to `host:port` through the upstream proxy. The decision (including the
    /// address check) was made locally; the upstream proxy is trusted configuration.
    async fn dial_upstream(
        &self,
        upstream: &crate::rules::Upstream,
        host: &Host,
        port: u16,
        checked: IpAddr,
    ) -> Result<(TcpStream, SocketAddr), Refusal> {
        let failed = |why: String| Refusal::Failed {
            rule: format!("upstream proxy {}:{}: {why}", upstream.host, upstream.port),
            status: 502,
        };
        let t = self.config.connect_timeout;
        let stream = tokio::time::timeout(
            t,
            TcpStream::connect((upstream.host.as_str(), upstream.port)),
        )
        .await
        .map_err(|_| failed("connect timed out".into()))?
        .map_err(|e| failed(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let mut conn = BufConn::new(stream);
        let auth = authority_string(host, port);
        conn.io
            .write_all(format!("CONNECT {auth} HTTP/1.1\r\nHost: {auth}\r\n\r\n").as_bytes())
            .await
            .map_err(|e| failed(e.to_string()))?;
        let head = conn
            .read_head_within(t, t, &self.buffers)
            .await
            .map_err(|e| failed(e.to_string()))?
            .ok_or_else(|| failed("closed the connection".into()))?;
        let resp = parse_response_head(&head).map_err(|e| failed(e.to_string()))?;
        if !(200..300).contains(&resp.status) {
            return Err(failed(format!(
                "answered {} to CONNECT {auth}",
                resp.status
            )));
        }
        if !conn.buf.is_empty() {
            return Err(failed("sent data before the tunnel was used".into()));
        }
        Ok((conn.io, SocketAddr::new(checked, port)))
    }

    /// Decide and dial a CONNECT. An established plain tunnel is handed back (the caller runs
    /// it once this phase's state is freed); refusals and gateway-intercepted tunnels are
    /// finished here.
    async fn connect<S>(
        &self,
        mut client: BufConn<S>,
        req: RequestHead,
        peer: &str,
    ) -> Option<Tunnel<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let target = req.target.clone();
        let parsed = check_authority_chars(&target)
            .map_err(str::to_string)
            .and_then(|()| parse_authority(&target).map_err(|e| e.to_string()));
        let (host, port) = match parsed {
            Ok((h, Some(p))) => (h, p),
            Ok((_, None)) => {
                self.log_bad(peer, "CONNECT", &target, "CONNECT target without a port");
                self.reply_and_close(&mut client.io, 400, "corral: CONNECT needs HOST:PORT\n")
                    .await;
                return None;
            }
            Err(e) => {
                self.log_bad(peer, "CONNECT", &target, &e);
                self.reply_and_close(
                    &mut client.io,
                    400,
                    &format!("corral: invalid CONNECT target {target:?}: {e}\n"),
                )
                .await;
                return None;
            }
        };
        let shown = host_display(&host);
        if req.framing != Framing::None {
            self.log_bad(peer, "CONNECT", &target, "CONNECT with a body");
            self.reply_and_close(&mut client.io, 400, "corral: CONNECT with a body\n")
                .await;
            return None;
        }
        if let Err(why) = host_header_agrees(&req, &host, port, 443) {
            let d = Denial {
                rule: why.clone(),
                fix: "send a Host header that matches the request target".into(),
                status: 400,
            };
            self.log_denial(peer, "CONNECT", &shown, port, &d);
            self.reply_and_close(&mut client.io, 400, &format!("corral: {why}\n"))
                .await;
            return None;
        }
        self.tunnel_decided(client, host, port, peer, "CONNECT", Kind::Connect, true)
            .await
    }

    /// A connection a jail process made directly to an address the stub resolver handed out
    /// for `host` (corral-net's `netcap.rs`, `network.dns = "stub"`): decided, resolved,
    /// checked, dialled and audited exactly as `CONNECT host:port`, as method `CAPTURE`,
    /// without the CONNECT exchange: a denial or a failure closes the connection. Port 80 goes
    /// through the plain-HTTP path instead, each request pinned to `host` (its `Host` header
    /// must name it), answered and audited as proxied requests are.
    pub async fn capture<S>(self: Arc<Self>, stream: S, client: String, host: Host, port: u16)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            self.refusals.hit("the stub's capture", reason::CONNECTIONS);
            return;
        };
        let stopping = self.open.clone();
        let decide = async {
            if port == 80 {
                // Plain HTTP: the proxy's own HTTP path, every request's Host pinned to the name.
                Box::pin(self.http_pinned(BufConn::new(stream), &client, Some((host, port)))).await
            } else {
                Box::pin(self.tunnel_decided(
                    BufConn::new(stream),
                    host,
                    port,
                    &client,
                    "CAPTURE",
                    Kind::Connect,
                    false,
                ))
                .await
            }
        };
        let decided = tokio::select! {
            t = decide => t,
            () = stopping.stopping() => None,
        };
        match decided.and_then(|t| self.clone().run_tunnel(t, client, permit)) {
            Some(task) => task.await,
            None => {
                self.closed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Relay a decided tunnel until it ends, then log its close line (see [`TunnelTask`]);
    /// `None` when the proxy shuts down meanwhile (the tunnel is closed, its line logged).
    fn run_tunnel<S>(
        self: Arc<Self>,
        t: Tunnel<S>,
        peer: String,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Option<TunnelTask<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let m = &t.meta;
        let dest = Dest {
            peer: &peer,
            method: m.method,
            host: &m.host,
            port: m.port,
            address: m.address,
            started: m.started,
        };
        let Some(owed) = self.open.register(dest) else {
            self.log_close(
                &peer, m.method, &m.host, m.port, m.address, m.early, 0, m.started,
            );
            return None;
        };
        let relay = tunnel(
            t.client,
            t.up,
            self.config.idle_timeout,
            Some(self.pending.clone()),
        );
        Some(TunnelTask {
            relay: RecordedRelay::new(relay, owed, t.meta.early),
            proxy: self,
            _permit: permit,
        })
    }

    /// The decision and tunnel of a CONNECT (answered when `answer`) or a captured connection.
    #[allow(clippy::too_many_arguments)]
    async fn tunnel_decided<S>(
        &self,
        mut client: BufConn<S>,
        host: Host,
        port: u16,
        peer: &str,
        method: &'static str,
        kind: Kind,
        answer: bool,
    ) -> Option<Tunnel<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let shown = host_display(&host);
        let (rules, decided) =
            Box::pin(self.decide_asking(&mut client, (&host, port, kind), method, peer)).await?;
        let decided = decided.and_then(|a| self.interceptable(&host, a));
        let (rule, per_request) = match decided {
            Ok(x) => x,
            Err(d) => {
                self.log_denial(peer, method, &shown, port, &d);
                if answer {
                    let body = Self::denial_body(method, &authority_string(&host, port), &d);
                    self.reply_and_close(&mut client.io, d.status, &body).await;
                }
                return None;
            }
        };
        let (mut up, address) = match Box::pin(self.dial(&rules, &host, port)).await {
            Ok(x) => x,
            Err(r) if answer => {
                self.refuse(&mut client.io, peer, method, &host, port, r)
                    .await;
                return None;
            }
            Err(r) => {
                // No channel to answer on: the refusal is logged and the connection closed.
                let mut sink = tokio::io::sink();
                self.refuse(&mut sink, peer, method, &host, port, r).await;
                return None;
            }
        };
        if !self.log_decision(
            peer,
            method,
            &shown,
            port,
            Some(address),
            Decision::Allow,
            &rule,
        ) {
            // Fail closed: no tunnel the log does not show.
            if answer {
                self.reply_and_close(&mut client.io, 503, Self::UNRECORDED)
                    .await;
            }
            return None;
        }
        let started = Instant::now();
        if answer
            && client
                .io
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .is_err()
        {
            // The client went away: the connection dialled for it is closed, and recorded.
            self.log_close(peer, method, &shown, port, address, 0, 0, started);
            return None;
        }
        // A host decided by method and path: TLS terminated with the run's CA, each request
        // decided (and, for a secret-bound one, its placeholder swapped after).
        if per_request {
            let dest = (&host, port, address, kind);
            Box::pin(self.intercept_paths(client, up, dest, peer, method, started)).await;
            return None;
        }
        // A secret-bound name (never an IP literal): the gateway terminates TLS and swaps the
        // placeholder, over the connection dialled above to the checked address.
        if self.gateway.as_ref().is_some_and(|g| g.binds(&host, port)) {
            let dest = (&host, port, address);
            Box::pin(self.intercept(client, up, dest, peer, method, started)).await;
            return None;
        }
        // Bytes the client sent after the CONNECT head (a TLS hello, say) go first.
        let BufConn { io, buf } = client;
        let early = buf.len() as u64;
        if early > 0 && up.write_all(&buf).await.is_err() {
            self.log_close(peer, method, &shown, port, address, 0, 0, started);
            return None;
        }
        Some(Tunnel {
            client: io,
            up,
            meta: TunnelMeta {
                method,
                host: shown,
                port,
                address,
                started,
                early,
            },
        })
    }

    /// Hand an allowed connection to a secret-bound `host:port` to the gateway (TLS terminated,
    /// placeholders swapped; failures are in the audit log, the gateway writes them), then log
    /// its close line. `client`'s buffered bytes (a TLS hello sent early) go first.
    async fn intercept<S>(
        &self,
        client: BufConn<S>,
        up: TcpStream,
        (host, port, address): (&Host, u16, SocketAddr),
        peer: &str,
        method: &str,
        started: Instant,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Some(gw) = self.gateway.as_ref() else {
            return;
        };
        // The proxy's deadlines, and its budget for the jail's request heads: a head read
        // inside the tunnel is counted with every other one the jail makes corral hold.
        let gw = gw
            .clone()
            .with_timeouts(http::io::Timeouts {
                head: self.config.header_timeout,
                idle: self.config.idle_timeout,
            })
            .with_budget(self.buffers.clone());
        let stream = corral_gateway::Prefixed::new(client.buf.to_vec(), client.io);
        // The gateway's counts (of the requests and answers) come only when it returns: cut
        // at shutdown, the record has the bytes on the wire to the destination instead.
        let shown = host_display(host);
        let dest = Dest {
            peer,
            method,
            host: &shown,
            port,
            address,
            started,
        };
        let Some(owed) = self.owe_intercepted(dest) else {
            return;
        };
        let up = owed.counted(up);
        let (bytes_up, bytes_down) = gw
            .intercept_over(stream, up, host, port, address, peer)
            .await
            .map_or((0, 0), |s| (s.bytes_up, s.bytes_down));
        owed.close(bytes_up, bytes_down);
    }

    /// The rule of a host allowed whole, or for a host decided by method and path the rule
    /// set and `true`, when the gateway can terminate its TLS; else the denial: such a host is
    /// never an opaque tunnel.
    fn interceptable(&self, host: &Host, a: Allowed) -> Result<(String, bool), Denial> {
        match a {
            Allowed::Host(rule) => Ok((rule, false)),
            Allowed::Paths(set) if self.gateway.as_ref().is_some_and(|g| g.can_intercept(host)) => {
                Ok((format!("{set} (each request decided)"), true))
            }
            Allowed::Paths(set) => Err(Denial {
                rule: format!(
                    "{set}: deciding its requests needs the run's CA, and this run's CA cannot sign for {}",
                    host_display(host)
                ),
                fix: "path rules added while the jail runs take effect at the next run".into(),
                status: 403,
            }),
        }
    }

    /// [`Proxy::intercept`] for a host decided by method and path: every request goes through
    /// [`PathGate`] before it is forwarded.
    async fn intercept_paths<S>(
        &self,
        client: BufConn<S>,
        up: TcpStream,
        (host, port, address, kind): (&Host, u16, SocketAddr, Kind),
        peer: &str,
        method: &str,
        started: Instant,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Some(gw) = self.gateway.as_ref() else {
            return;
        };
        let gw = gw
            .clone()
            .with_timeouts(http::io::Timeouts {
                head: self.config.header_timeout,
                idle: self.config.idle_timeout,
            })
            .with_budget(self.buffers.clone());
        let gate = PathGate {
            proxy: self,
            peer,
            host,
            port,
            kind,
            address,
        };
        let stream = corral_gateway::Prefixed::new(client.buf.to_vec(), client.io);
        // The gateway's counts (of the requests and answers) come only when it returns: cut
        // at shutdown, the record has the bytes on the wire to the destination instead.
        let shown = host_display(host);
        let dest = Dest {
            peer,
            method,
            host: &shown,
            port,
            address,
            started,
        };
        let Some(owed) = self.owe_intercepted(dest) else {
            return;
        };
        let up = owed.counted(up);
        let (bytes_up, bytes_down) = gw
            .intercept_gated(stream, up, host, port, address, peer, &gate)
            .await
            .map_or((0, 0), |s| (s.bytes_up, s.bytes_down));
        owed.close(bytes_up, bytes_down);
    }

    /// One audit record for a request decided by method and path; `false` when it could not
    /// be written.
    #[allow(clippy::too_many_arguments)]
    #[must_use]
    fn log_request(
        &self,
        client: &str,
        method: &str,
        (host, port): (&str, u16),
        path: &str,
        address: Option<SocketAddr>,
        decision: Decision,
        rule: &str,
    ) -> bool {
        self.log(NetEvent {
            phase: NetPhase::Decision,
            client: client.into(),
            method: method.into(),
            host: host.into(),
            port,
            path: Some(path.into()),
            address: address.map(|a| a.ip().to_string()),
            decision: Some(decision),
            rule: rule.into(),
            ..Default::default()
        })
    }

    /// Decide one request to a host decided by method and path: the normalised target to
    /// send, recorded; or the refusal (recorded, counted in the summary, and its answer).
    fn decide_request(
        &self,
        peer: &str,
        (host, port, kind): (&Host, u16, Kind),
        address: Option<SocketAddr>,
        method: &str,
        target: &str,
    ) -> Result<String, (u16, String)> {
        let shown = host_display(host);
        match self
            .rules()
            .check_request((host, port, kind), method, target)
        {
            Ok((n, rule)) => {
                let allow = Decision::Allow;
                if self.log_request(
                    peer,
                    method,
                    (&shown, port),
                    &n.path(),
                    address,
                    allow,
                    &rule,
                ) {
                    Ok(n.target())
                } else {
                    Err((503, Self::UNRECORDED.to_string()))
                }
            }
            Err(d) => {
                let path = target.split(['?', '#']).next().unwrap_or(target);
                let deny = Decision::Deny;
                let _ =
                    self.log_request(peer, method, (&shown, port), path, address, deny, &d.rule);
                let authority = authority_string(host, port);
                self.note_blocked(method, &format!("{authority}{path}"), &d.rule, &d.fix);
                let body = format!(
                    "corral: blocked {method} {authority}{path}: {}\n{}\n",
                    d.rule, d.fix
                );
                Err((d.status, body))
            }
        }
    }

    /// The name-level decision with the rules in force; with `network.on_deny = "ask"`, a
    /// request only the allow list refuses is held until `corral watch` answers (see
    /// `ask.rs`), then decided again with the rules then in force. `None` when the client went
    /// away while held (recorded).
    async fn decide_asking<S>(
        &self,
        client: &mut BufConn<S>,
        (host, port, kind): (&Host, u16, Kind),
        method: &str,
        peer: &str,
    ) -> Option<(Arc<Rules>, Result<Allowed, Denial>)>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let rules = self.rules();
        let d = match rules.check_name(host, port, kind) {
            Ok(a) => return Some((rules, Ok(a))),
            Err(d) => d,
        };
        let secs = self.ask_timeout.load(Ordering::Relaxed);
        if secs == 0 || !Self::askable(&rules, host, port, &d) {
            return Some((rules, Err(d)));
        }
        match self
            .held(client, (host, port, kind), method, peer, &d, secs)
            .await
        {
            Some(Ok(())) => {}
            Some(Err(why)) => {
                let d = Denial {
                    rule: format!("{}; {why}", d.rule),
                    ..d
                };
                return Some((rules, Err(d)));
            }
            None => {
                let gone = Denial {
                    rule: format!("{}; the client went away while asked", d.rule),
                    ..d
                };
                self.log_denial(peer, method, &host_display(host), port, &gone);
                return None;
            }
        }
        let rules = self.rules();
        let decided = rules.check_name(host, port, kind);
        Some((rules, decided))
    }

    /// Whether a denial may become a question: the allow list alone refused (no deny rule
    /// names the destination), and an address literal passes the address checks.
    fn askable(rules: &Rules, host: &Host, port: u16, d: &Denial) -> bool {
        let denied = rules.deny.iter().any(|p| p.matches(host, port));
        let address_ok = match host {
            Host::Name(_) => true,
            Host::Ip(ip) => check_destination(*ip, &rules.allow_cidrs).is_ok(),
        };
        d.status == 403 && !denied && address_ok
    }

    /// Hold the connection on its question: `Ok` when the answer allows it, `Err(why)` when it
    /// is refused (answer, timeout, bounds), `None` when the client went away. Bytes the client
    /// sends meanwhile are kept (up to [`HELD_BYTES`], counted in the head budget).
    async fn held<S>(
        &self,
        client: &mut BufConn<S>,
        dest: (&Host, u16, Kind),
        method: &str,
        peer: &str,
        d: &Denial,
        secs: u32,
    ) -> Option<Result<(), String>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        if !self.buffers.take(HELD_BYTES) {
            return Some(Err(
                "not asked: the proxy's budget for held connections is spent".into(),
            ));
        }
        let _budget = ReservedBudget(&self.buffers, HELD_BYTES);
        let timeout = Duration::from_secs(secs.into());
        let mut hold = match self.asks.hold(dest, method, &d.rule, timeout) {
            Ok(h) => h,
            Err(NotHeld::Full) => {
                let max = crate::ask::MAX_HELD;
                return Some(Err(format!(
                    "not asked: {max} connections wait for an answer already"
                )));
            }
            Err(NotHeld::Refused) => return Some(Err("refused in corral watch".into())),
        };
        if hold.first {
            let (host, port, _) = dest;
            let _ = self.log(NetEvent {
                phase: NetPhase::Ask,
                client: peer.into(),
                method: method.into(),
                host: host_display(host),
                port,
                rule: d.rule.clone(),
                ..Default::default()
            });
        }
        let outcome = tokio::select! {
            o = hold.wait() => o,
            () = client_gone(client) => return None,
        };
        Some(match outcome {
            Outcome::Allowed => Ok(()),
            Outcome::Refused => Err("refused in corral watch".into()),
            Outcome::TimedOut => Err(format!("asked, no answer within {secs} s")),
        })
    }

    async fn refuse<S: AsyncWrite + Unpin>(
        &self,
        io: &mut S,
        peer: &str,
        method: &str,
        host: &Host,
        port: u16,
        r: Refusal,
    ) {
        let shown = host_display(host);
        match r {
            Refusal::Denied(d) => {
                self.log_denial(peer, method, &shown, port, &d);
                let body = Self::denial_body(method, &authority_string(host, port), &d);
                self.reply_and_close(io, d.status, &body).await;
            }
            Refusal::Failed { rule, status } => {
                let _ = self.log_decision(
                    peer,
                    method,
                    &shown,
                    port,
                    None,
                    Decision::Allow,
                    &format!("allowed, but {rule}"),
                );
                self.note_failed(method, &format!("{shown}:{port}"), &rule);
                self.reply_and_close(
                    io,
                    status,
                    &format!(
                        "corral: {method} {}: {rule}\n",
                        authority_string(host, port)
                    ),
                )
                .await;
            }
        }
    }

    /// Forward one plain-HTTP request and its response. Returns whether the client connection
    /// stays open for another request.
    async fn forward_one<S>(
        &self,
        client: &mut BufConn<S>,
        mut req: RequestHead,
        peer: &str,
        pinned: &mut Option<Pinned>,
    ) -> bool
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Some((host, port, mut path)) = self.plain_target(client, &req, peer, pinned).await
        else {
            return false;
        };
        let shown = host_display(&host);
        let method = std::mem::take(&mut req.method);
        let p = pinned.get_or_insert_with(|| Pinned {
            host: host.clone(),
            port,
            up: None,
        });
        if !self
            .open_pinned(client, p, (&method, &mut path), peer)
            .await
        {
            return false;
        }
        let Some(address) = p.up.as_ref().map(|u| u.owed.address()) else {
            return false;
        };
        // The gateway's step: placeholders swapped (or refused), answers of a secret-bound
        // host scrubbed of every real value and asked for uncompressed, so they can be.
        let mut headers = std::mem::take(&mut req.headers);
        let Some((rewritten, mut scrub)) = self
            .gateway_step(client, (&method, &path), &mut headers, (&host, port), peer)
            .await
        else {
            return false;
        };
        let client_close = req.version == Version::Http10
            || http::connection_tokens(&headers)
                .iter()
                .any(|t| t == "close");
        let expect_continue = http::header_values(&headers, "expect")
            .any(|v| v.eq_ignore_ascii_case(b"100-continue"));
        let host_header = match (&host, port) {
            (_, 80) => shown.clone(),
            _ => authority_string(&host, port),
        };
        let head = http::serialize_request(&method, &path, &host_header, &headers, req.framing);
        let out = Outgoing {
            head: &head,
            method: &method,
            framing: req.framing,
            version: req.version,
            expect_continue,
            client_close,
            upgrade: false,
            idle: self.config.idle_timeout,
            budget: &self.buffers,
        };
        let sent = || {
            if let Some((gw, report)) = &rewritten {
                gw.plain_sent(report, (&method, &path), (&host, port), peer, address);
            }
        };
        let Some(up) = p.up.as_mut() else {
            return false;
        };
        let mut moved = Moved::default();
        let done = exchange(client, &mut up.conn, out, scrub.as_mut(), sent, &mut moved).await;
        up.bytes_up += moved.up;
        up.bytes_down += moved.down;
        up.owed.set_bytes(up.bytes_up, up.bytes_down);
        self.exchanged(client, peer, p, done, (&method, &shown))
            .await
    }

    /// The host, port and origin-form path of a plain-HTTP request, checked (absolute-form
    /// `http://` target, `Host` agreeing with it, the connection's pinned host); `None` when
    /// refused (answered and logged).
    async fn plain_target<S>(
        &self,
        client: &mut BufConn<S>,
        req: &RequestHead,
        peer: &str,
        pinned: &Option<Pinned>,
    ) -> Option<(Host, u16, String)>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let method = &req.method;
        let (authority, path) = match split_absolute(&req.target) {
            Ok(x) => x,
            Err(why) => {
                self.log_bad(peer, method, &req.target, why);
                self.reply_and_close(&mut client.io, 400, &format!("corral: {why}\n"))
                    .await;
                return None;
            }
        };
        let (host, port) = match parse_authority(authority) {
            Ok((h, p)) => (h, p.unwrap_or(80)),
            Err(e) => {
                self.log_bad(peer, method, authority, &e.to_string());
                let body = format!("corral: invalid host in {:?}: {e}\n", req.target);
                self.reply_and_close(&mut client.io, 400, &body).await;
                return None;
            }
        };
        let shown = host_display(&host);
        if let Err(why) = host_header_agrees(req, &host, port, 80) {
            let d = Denial {
                rule: why.clone(),
                fix: "send a Host header that matches the request target".into(),
                status: 400,
            };
            self.log_denial(peer, method, &shown, port, &d);
            self.reply_and_close(&mut client.io, 400, &format!("corral: {why}\n"))
                .await;
            return None;
        }
        if let Some(p) = pinned.as_ref()
            && (p.host != host || p.port != port)
        {
            let d = Denial {
                rule: format!("connection pinned to {}", authority_string(&p.host, p.port)),
                fix: "open a new connection for another host".into(),
                status: 403,
            };
            self.log_denial(peer, method, &shown, port, &d);
            let body = Self::denial_body(method, &authority_string(&host, port), &d);
            self.reply_and_close(&mut client.io, 403, &body).await;
            return None;
        }
        Some((host, port, path))
    }

    /// Decide a request to the pinned host with the rules in force, dial it if the connection
    /// has no upstream yet, and record the decision; `false` when refused (answered, logged).
    async fn open_pinned<S>(
        &self,
        client: &mut BufConn<S>,
        p: &mut Pinned,
        (method, path): (&str, &mut String),
        peer: &str,
    ) -> bool
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let (host, port) = (p.host.clone(), p.port);
        let shown = host_display(&host);
        let dest = (&host, port, Kind::Http);
        let Some((rules, decided)) = Box::pin(self.decide_asking(client, dest, method, peer)).await
        else {
            return false;
        };
        let rule = match decided {
            Ok(Allowed::Host(r)) => r,
            // Decided by method and path: the normalised path decided on is the one sent.
            Ok(Allowed::Paths(set)) => {
                let dest = (&host, port, Kind::Http);
                match self.decide_request(peer, dest, None, method, path) {
                    Ok(target) => *path = target,
                    Err((status, body)) => {
                        self.reply_and_close(&mut client.io, status, &body).await;
                        return false;
                    }
                }
                format!("{set} (each request decided)")
            }
            Err(d) => {
                self.log_denial(peer, method, &shown, port, &d);
                let body = Self::denial_body(method, &authority_string(&host, port), &d);
                self.reply_and_close(&mut client.io, d.status, &body).await;
                return false;
            }
        };
        if p.up.is_none() {
            match Box::pin(self.dial(&rules, &host, port)).await {
                Ok((s, address)) => {
                    let dest = Dest {
                        peer,
                        method,
                        host: &shown,
                        port,
                        address,
                        started: Instant::now(),
                    };
                    let Some(owed) = self.open.register(dest) else {
                        self.refuse_ending(&mut client.io, peer, method, (&shown, port), address)
                            .await;
                        return false;
                    };
                    p.up = Some(Upstream {
                        conn: BufConn::new(s),
                        bytes_up: 0,
                        bytes_down: 0,
                        owed,
                    });
                }
                Err(r) => {
                    self.refuse(&mut client.io, peer, method, &host, port, r)
                        .await;
                    return false;
                }
            }
        }
        let address = p.up.as_ref().map(|u| u.owed.address());
        let allowed = Decision::Allow;
        if !self.log_decision(peer, method, &shown, port, address, allowed, &rule) {
            // Fail closed: nothing is sent that the log does not show.
            return self.abandon(&mut client.io, p, 503, Self::UNRECORDED).await;
        }
        true
    }

    /// The credential gateway's step for a plain-HTTP request: placeholders swapped (audited
    /// as injected once sent), and for a secret-bound host the scrubber its answer goes
    /// through; `None` when the gateway refuses the request (answered, audited by it).
    async fn gateway_step<S>(
        &self,
        client: &mut BufConn<S>,
        (method, path): (&str, &str),
        headers: &mut Vec<http::Header>,
        (host, port): (&Host, u16),
        peer: &str,
    ) -> Option<PlainRewrite<'_>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Some(gw) = &self.gateway else {
            return Some((None, None));
        };
        match gw.rewrite_plain_headers(method, path, headers, host, port, peer) {
            Ok(report) => {
                let scrub = gw.binds(host, port).then(|| {
                    identity_only(headers);
                    gw.scrubber()
                });
                Some((Some((gw, report)), scrub))
            }
            Err(r) => {
                let body = format!("{}\n", r.message);
                self.reply_and_close(&mut client.io, r.status, &body).await;
                None
            }
        }
    }

    /// After an exchange: whether the client connection goes on. A failed exchange drops the
    /// upstream connection (the origin never completes a half-sent request) and answers what
    /// still can be.
    async fn exchanged<S>(
        &self,
        client: &mut BufConn<S>,
        peer: &str,
        p: &mut Pinned,
        done: Result<Done, ExchangeError>,
        (method, shown): (&str, &str),
    ) -> bool
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        match done {
            Ok(Done::Replied {
                origin_close,
                close,
            }) => {
                if origin_close {
                    self.drop_upstream(p);
                }
                if close {
                    let _ = client.io.shutdown().await;
                }
                !close
            }
            Ok(Done::Upgraded) => {
                // Not asked for (`upgrade: false`): the exchange refuses a 101 itself.
                self.abandon(&mut client.io, p, 502, "corral: unexpected upgrade\n")
                    .await
            }
            Err(e) => match e.answer(shown) {
                Some((status, why)) => {
                    let body = format!("corral: {why}\n");
                    if let ExchangeError::RequestBody(_) = e {
                        self.log_bad(peer, method, shown, &body);
                    }
                    self.abandon(&mut client.io, p, status, &body).await
                }
                None => {
                    // A truncated response or a client gone: close both.
                    self.drop_upstream(p);
                    let _ = client.io.shutdown().await;
                    false
                }
            },
        }
    }

    async fn socks<S>(&self, mut client: BufConn<S>, peer: &str) -> Option<Tunnel<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let (host, port) = self.socks_request(&mut client, peer).await?;
        let shown = host_display(&host);
        let reply = |code: u8| [5, code, 0, 1, 0, 0, 0, 0, 0, 0];
        let dest = (&host, port, Kind::Socks);
        let (rules, decided) =
            Box::pin(self.decide_asking(&mut client, dest, "SOCKS5", peer)).await?;
        let decided = decided.and_then(|a| self.interceptable(&host, a));
        let (rule, per_request) = match decided {
            Ok(x) => x,
            Err(d) => {
                self.log_denial(peer, "SOCKS5", &shown, port, &d);
                let _ = client.io.write_all(&reply(2)).await;
                return None;
            }
        };
        let (mut up, address) = match Box::pin(self.dial(&rules, &host, port)).await {
            Ok(x) => x,
            Err(Refusal::Denied(d)) => {
                self.log_denial(peer, "SOCKS5", &shown, port, &d);
                let _ = client.io.write_all(&reply(2)).await;
                return None;
            }
            Err(Refusal::Failed { rule, .. }) => {
                let why = format!("allowed, but {rule}");
                let _ =
                    self.log_decision(peer, "SOCKS5", &shown, port, None, Decision::Allow, &why);
                self.note_failed("SOCKS5", &format!("{shown}:{port}"), &rule);
                let _ = client.io.write_all(&reply(4)).await;
                return None;
            }
        };
        let allowed = Decision::Allow;
        if !self.log_decision(peer, "SOCKS5", &shown, port, Some(address), allowed, &rule) {
            // Fail closed: REP=1, general failure.
            let _ = client.io.write_all(&reply(1)).await;
            return None;
        }
        let started = Instant::now();
        if client.io.write_all(&reply(0)).await.is_err() {
            self.log_close(peer, "SOCKS5", &shown, port, address, 0, 0, started);
            return None;
        }
        // A host decided by method and path, as a CONNECT to it: never an opaque tunnel.
        if per_request {
            let dest = (&host, port, address, Kind::Socks);
            Box::pin(self.intercept_paths(client, up, dest, peer, "SOCKS5", started)).await;
            return None;
        }
        // A secret-bound name goes through the gateway, as a CONNECT to it does: never an
        // opaque tunnel that would skip the swap.
        if self.gateway.as_ref().is_some_and(|g| g.binds(&host, port)) {
            let dest = (&host, port, address);
            Box::pin(self.intercept(client, up, dest, peer, "SOCKS5", started)).await;
            return None;
        }
        let BufConn { io, buf } = client;
        let early = buf.len() as u64;
        if early > 0 && up.write_all(&buf).await.is_err() {
            self.log_close(peer, "SOCKS5", &shown, port, address, 0, 0, started);
            return None;
        }
        let meta = TunnelMeta {
            method: "SOCKS5",
            host: shown,
            port,
            address,
            started,
            early,
        };
        Some(Tunnel {
            client: io,
            up,
            meta,
        })
    }

    /// The SOCKS5 greeting and CONNECT request: the destination, or `None` when the client
    /// went away, was too slow, or asked for something refused (answered and logged).
    async fn socks_request<S>(&self, client: &mut BufConn<S>, peer: &str) -> Option<(Host, u16)>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        // One deadline for the whole handshake, as for an HTTP head: a client dribbling one
        // byte at a time cannot hold a connection longer than that.
        let t = Instant::now() + self.config.header_timeout;
        // Greeting: VER NMETHODS METHODS...
        let hdr = client.read_exact_by(2, t).await.ok()?;
        let methods = client.read_exact_by(hdr[1] as usize, t).await.ok()?;
        if !methods.contains(&0) {
            self.log_bad(
                peer,
                "SOCKS5",
                "?",
                "no acceptable authentication method (only none)",
            );
            let _ = client.io.write_all(&[5, 0xff]).await;
            return None;
        }
        client.io.write_all(&[5, 0]).await.ok()?;
        // Request: VER CMD RSV ATYP DST.ADDR DST.PORT
        let req = client.read_exact_by(4, t).await.ok()?;
        let reply = |code: u8| [5, code, 0, 1, 0, 0, 0, 0, 0, 0];
        if req[0] != 5 || req[2] != 0 {
            self.log_bad(peer, "SOCKS5", "?", "invalid SOCKS5 request header");
            return None;
        }
        if !matches!(req[3], 1 | 3 | 4) {
            let why = format!("unknown SOCKS5 address type {}", req[3]);
            self.log_bad(peer, "SOCKS5", "?", &why);
        }
        let host = read_socks_address(client, req[3], t).await?;
        let port = client.read_exact_by(2, t).await.ok()?;
        let port = u16::from_be_bytes([port[0], port[1]]);
        let host = match host {
            Ok(h) => h,
            Err(why) => {
                self.log_bad(peer, "SOCKS5", "?", &why);
                let _ = client.io.write_all(&reply(1)).await;
                return None;
            }
        };
        if req[1] != 1 {
            let d = Denial {
                rule: "only SOCKS5 CONNECT is supported".into(),
                fix: "use CONNECT".into(),
                status: 400,
            };
            self.log_denial(peer, "SOCKS5", &host_display(&host), port, &d);
            let _ = client.io.write_all(&reply(7)).await;
            return None;
        }
        Some((host, port))
    }
}
