//! The egress proxy: plain HTTP forwarding, CONNECT tunnels and SOCKS5 on one listener.
//!
//! Per request: parse exactly (`corral-http1`) -> normalize the host (`corral_policy::domain`) ->
//! deny list -> allow list (`Rules::check_name`) -> resolve (the proxy's [`Resolver`]) -> check
//! EVERY resolved address (`corral_policy::addr::check_destination`) -> connect to one of exactly
//! those addresses, never by name. A kept-alive client connection is pinned to the first host it
//! was allowed to reach. Every decision and every closed upstream connection is one audit line.
//!
//! One `impl Proxy`, split by concern: this file holds the proxy, its configuration, its
//! construction and the accept loop (a connection is HTTP or SOCKS5 by its first byte);
//! `decide.rs` the rules and asking, `dial.rs` resolving, checking and connecting, `plain.rs` plain
//! HTTP, `connect.rs` CONNECT and captured tunnels, `socks.rs` SOCKS5, `intercept.rs` the
//! credential gateway and path-ruled hosts, `relay.rs` the tunnel byte relay, `tally.rs` the audit
//! records and summaries. Each file takes this one's imports (`use super::*`).

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

mod connect;
mod decide;
mod dial;
mod intercept;
mod plain;
mod relay;
mod socks;
mod tally;

use connect::{Tunnel, TunnelMeta};
use decide::Refusal;
use plain::{PlainRewrite, authority_string, check_authority_chars, host_header_agrees};
pub(crate) use relay::{RecordedRelay, tunnel};
use tally::BlockedMap;
pub use tally::{BLOCKED_KEPT, Blocked};

/// Where a connection goes, as the proxy shows and checked it: the host (a name normalised, or
/// an address literal) and the port. The address it was dialled at travels beside it once known:
/// optional in a decision record, required in a close record ([`Dest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Destination<'a> {
    pub(crate) host: &'a str,
    pub(crate) port: u16,
}

impl<'a> Destination<'a> {
    pub(crate) fn new(host: &'a str, port: u16) -> Destination<'a> {
        Destination { host, port }
    }
}

/// `host:port`, as the summaries show it.
impl std::fmt::Display for Destination<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

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
}
