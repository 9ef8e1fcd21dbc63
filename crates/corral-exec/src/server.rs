//! `corral serve`: the HTTP server (hyper 1, HTTP/1.1) over TCP or a unix socket.
//!
//! Every request goes through the same gate, in this order: route, bearer token (constant-time
//! compare), body size (413), body parse (400), program allowlist (403), the request's variables
//! against [`crate::reqenv`]'s allow-list (403), working directory confinement (400), a concurrency slot (429), the command's start record in the audit log
//! (503 when it cannot be written: fail closed), then the spawner. Refusals and finished
//! commands alike are written to the audit log too; an end record that cannot be written is
//! counted ([`AuditLog::failures`]).

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use corral_audit::{AuditLog, Decision, Event as AuditEvent, ExecEvent, ExecPhase, Record};
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};

use crate::confine::{ProjectRoot, WorkDir};
use crate::proto::{self, Event, ExecRequest, MAX_BODY, RequestError};
use crate::spawn::{SpawnSpec, Spawner};
use crate::supervise::{Bounds, EndCause, Outcome, Sink, supervise};

/// How a server is set up: the executor part of a Plan, plus what only the server needs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Commands run here (or below) and nowhere else.
    pub root: PathBuf,
    /// The bearer token clients must send; `None` only with the explicit `--no-auth`.
    pub token: Option<String>,
    /// Program allowlist (names or absolute paths); empty means any program.
    pub allow: Vec<String>,
    /// Timeout when a request names none, and the largest one a request may ask for.
    pub timeout: Duration,
    /// Between SIGTERM and SIGKILL when a command is ended.
    pub kill_grace: Duration,
    /// Bytes of output kept per command.
    pub max_output: u64,
    /// Commands running at once; beyond it requests get 429.
    pub max_concurrent: usize,
    /// Where every command is recorded; `None` records nothing (tests only).
    pub audit: Option<AuditLog>,
    /// The jail id the audit records carry.
    pub jail_id: String,
}

impl ServerConfig {
    /// Defaults from SPEC section 3: 10 minutes, 64 MiB of output, 8 commands at once.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            token: None,
            allow: Vec::new(),
            timeout: Duration::from_secs(600),
            kill_grace: Duration::from_secs(2),
            max_output: 64 * 1024 * 1024,
            max_concurrent: 8,
            audit: None,
            jail_id: corral_audit::new_jail_id(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("listen address {addr:?} is neither HOST:PORT, unix:/PATH nor fd:N")]
    BadAddress { addr: String },
    #[error(
        "cannot listen on fd:{fd}: {reason} (fd:N takes a listening socket the parent process \
         passed down open, as with socket activation)"
    )]
    BadFd { fd: i32, reason: String },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Root(#[from] crate::confine::ConfineError),
}

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(String),
    Unix(PathBuf),
    /// A listening socket (unix or TCP) inherited open at this descriptor number (socket
    /// activation: `corral run` binds the executor's socket itself and starts the server only
    /// when the first client connects; that connection waits in the backlog).
    Fd(i32),
}

impl ListenAddr {
    pub fn parse(s: &str) -> Result<Self, ServeError> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(ServeError::BadAddress { addr: s.into() });
            }
            return Ok(ListenAddr::Unix(PathBuf::from(p)));
        }
        if let Some(n) = s.strip_prefix("fd:") {
            return match n.parse::<i32>() {
                Ok(fd) if fd >= 0 => Ok(ListenAddr::Fd(fd)),
                _ => Err(ServeError::BadAddress { addr: s.into() }),
            };
        }
        let s2 = s.strip_prefix("http://").unwrap_or(s);
        if s2
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            Ok(ListenAddr::Tcp(s2.to_string()))
        } else {
            Err(ServeError::BadAddress { addr: s.into() })
        }
    }
}

enum Listener {
    Tcp(TcpListener),
    /// The socket's path, and whether the server created it (and so removes it at the end).
    Unix(UnixListener, PathBuf, bool),
}

/// A bound server, ready to run.
pub struct Server {
    listener: Listener,
    state: Arc<ServerState>,
}

/// What every connection of the server shares: its configuration, the project, the spawner,
/// the slots for concurrent commands and the shutdown signal.
struct ServerState {
    cfg: ServerConfig,
    root: ProjectRoot,
    spawner: Arc<dyn Spawner>,
    slots: Arc<Semaphore>,
    shutdown: watch::Receiver<bool>,
    shutdown_tx: watch::Sender<bool>,
}

impl Server {
    /// Bind `addr`. A unix socket is created mode 0600; a stale socket file at the path is
    /// replaced.
    pub async fn bind(
        addr: &ListenAddr,
        cfg: ServerConfig,
        spawner: Arc<dyn Spawner>,
    ) -> Result<Self, ServeError> {
        let root = ProjectRoot::open(&cfg.root)?;
        let listener = match addr {
            ListenAddr::Tcp(a) => {
                Listener::Tcp(
                    TcpListener::bind(a)
                        .await
                        .map_err(|source| ServeError::Listen {
                            addr: a.clone(),
                            source,
                        })?,
                )
            }
            ListenAddr::Unix(p) => {
                let err = |source| ServeError::Listen {
                    addr: format!("unix:{}", p.display()),
                    source,
                };
                if let Ok(md) = std::fs::symlink_metadata(p) {
                    use std::os::unix::fs::FileTypeExt;
                    if md.file_type().is_socket() {
                        std::fs::remove_file(p).map_err(err)?;
                    }
                }
                let l = UnixListener::bind(p).map_err(err)?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
                Listener::Unix(l, p.clone(), true)
            }
            ListenAddr::Fd(fd) => inherited_listener(*fd)?,
        };
        let (shutdown_tx, shutdown) = watch::channel(false);
        let slots = Arc::new(Semaphore::new(cfg.max_concurrent.max(1)));
        Ok(Self {
            listener,
            state: Arc::new(ServerState {
                cfg,
                root,
                spawner,
                slots,
                shutdown,
                shutdown_tx,
            }),
        })
    }

    /// The bound address (`127.0.0.1:PORT` or `unix:/PATH`), e.g. after binding port 0.
    pub fn local_addr(&self) -> String {
        match &self.listener {
            Listener::Tcp(l) => l
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into()),
            Listener::Unix(_, p, _) => format!("unix:{}", p.display()),
        }
    }

    /// Serve until `stop` resolves; then kill every running command's process group (SIGTERM,
    /// SIGKILL after the grace period) and return once they are all gone.
    ///
    /// The process becomes a child subreaper, so processes a command leaves behind are
    /// re-parented to the server, which reaps them when it kills their group.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        let _ = nix::sys::prctl::set_child_subreaper(true);
        let state = self.state;
        let connections = hyper_util::server::graceful::GracefulShutdown::new();
        tokio::pin!(stop);
        loop {
            let accepted = tokio::select! {
                _ = &mut stop => break,
                a = accept(&self.listener) => a,
            };
            let Some(io) = accepted else { continue };
            let st = state.clone();
            let svc = hyper::service::service_fn(move |req| {
                let st = st.clone();
                async move { Ok::<_, Infallible>(handle(st, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(io, svc);
            let conn = connections.watch(conn);
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
        // Kill every running command, wait until they are all gone (each holds a slot until
        // its final event is queued), then let the connections deliver those final events.
        let _ = state.shutdown_tx.send(true);
        let n = state.cfg.max_concurrent.max(1) as u32;
        let wait = state.cfg.kill_grace + Duration::from_secs(3);
        let _ = tokio::time::timeout(wait, state.slots.acquire_many(n)).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), connections.shutdown()).await;
        if let Listener::Unix(_, p, true) = &self.listener {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Take over the listening socket inherited at `fd`: it must be open, a socket, listening, and
/// unix or TCP. It is made close-on-exec at once, so no command the server runs inherits it.
fn inherited_listener(fd: i32) -> Result<Listener, ServeError> {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    use nix::sys::socket::{AddressFamily, SockaddrLike, SockaddrStorage, getsockname, sockopt};
    use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};
    let bad = |reason: String| ServeError::BadFd { fd, reason };
    if fd <= 2 {
        return Err(bad("descriptors 0-2 are stdio, not a listener".into()));
    }
    // SAFETY: only borrowed for the checks below; F_GETFD on a closed descriptor fails with
    // EBADF instead of touching anything.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    fcntl(borrowed, FcntlArg::F_GETFD).map_err(|e| bad(format!("not an open descriptor ({e})")))?;
    let listening = nix::sys::socket::getsockopt(&borrowed, sockopt::AcceptConn)
        .map_err(|e| bad(format!("not a socket ({e})")))?;
    if !listening {
        return Err(bad("the socket is not listening".into()));
    }
    let addr: SockaddrStorage =
        getsockname(fd).map_err(|e| bad(format!("cannot read its address ({e})")))?;
    fcntl(borrowed, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
        .map_err(|e| bad(format!("cannot make it close-on-exec ({e})")))?;
    // SAFETY: the descriptor is open (checked above), was passed down to this process for the
    // server alone, and nothing else in the process owns it; ownership moves here exactly once
    // (the one `bind` of this address).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let io = |e: std::io::Error| bad(e.to_string());
    match addr.family() {
        Some(AddressFamily::Unix) => {
            let path = addr
                .as_unix_addr()
                .and_then(|u| u.path())
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from(format!("(fd {fd})")));
            let std = std::os::unix::net::UnixListener::from(owned);
            std.set_nonblocking(true).map_err(io)?;
            Ok(Listener::Unix(
                UnixListener::from_std(std).map_err(io)?,
                path,
                false,
            ))
        }
        Some(AddressFamily::Inet | AddressFamily::Inet6) => {
            let std = std::net::TcpListener::from(owned);
            std.set_nonblocking(true).map_err(io)?;
            Ok(Listener::Tcp(TcpListener::from_std(std).map_err(io)?))
        }
        other => Err(bad(format!(
            "a socket of family {other:?}, not unix or TCP"
        ))),
    }
}

/// An accepted connection of either kind.
enum Conn {
    Tcp(TokioIo<tokio::net::TcpStream>),
    Unix(TokioIo<tokio::net::UnixStream>),
}

async fn accept(l: &Listener) -> Option<Conn> {
    let r = match l {
        Listener::Tcp(l) => l.accept().await.map(|(s, _)| {
            let _ = s.set_nodelay(true);
            Conn::Tcp(TokioIo::new(s))
        }),
        Listener::Unix(l, _, _) => l.accept().await.map(|(s, _)| Conn::Unix(TokioIo::new(s))),
    };
    match r {
        Ok(c) => Some(c),
        Err(e) => {
            // EMFILE and friends: back off instead of spinning.
            eprintln!("corral serve: accept failed: {e}");
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}

impl hyper::rt::Read for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
            Conn::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// The response body of both endpoints.
pub enum RespBody {
    Full(Full<Bytes>),
    /// `/v1/exec`: one frame per event, as the command produces them.
    Stream(mpsc::Receiver<Bytes>),
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            RespBody::Full(f) => Pin::new(f).poll_frame(cx),
            RespBody::Stream(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    /// Seed 003's `POST /execute`.
    Legacy,
    /// `POST /v1/exec`.
    V1,
}

/// A refusal: status, message, and the exit status a client should report.
struct Refusal {
    status: StatusCode,
    message: String,
    exit: i32,
}

impl Refusal {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            exit: 125,
        }
    }

    fn respond(self, ep: Endpoint) -> Response<RespBody> {
        let body = match ep {
            // Seed 003's shape, so its execute.sh prints the reason and exits non-zero.
            Endpoint::Legacy => proto::legacy_response(
                self.exit,
                format!("corral serve: {}", self.message).as_bytes(),
            ),
            Endpoint::V1 => Event::Error {
                error: self.message,
                exit: Some(self.exit),
            }
            .to_line(),
        };
        let mut r = Response::new(RespBody::Full(Full::new(Bytes::from(body))));
        *r.status_mut() = self.status;
        let ct = match ep {
            Endpoint::Legacy => "application/json",
            Endpoint::V1 => "application/x-ndjson",
        };
        r.headers_mut()
            .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(ct));
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"corral\""),
            );
        }
        r
    }
}

async fn handle(st: Arc<ServerState>, req: Request<Incoming>) -> Response<RespBody> {
    let ep = match req.uri().path() {
        "/execute" => Endpoint::Legacy,
        "/v1/exec" => Endpoint::V1,
        p => {
            return Refusal::new(
                StatusCode::NOT_FOUND,
                format!("no such endpoint {p}; use POST /v1/exec or POST /execute"),
            )
            .respond(Endpoint::V1);
        }
    };
    if req.method() != Method::POST {
        let mut r = Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!(
                "{} {} is not supported; use POST",
                req.method(),
                req.uri().path()
            ),
        )
        .respond(ep);
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
        return r;
    }
    match admit(&st, ep, req).await {
        Ok((request, workdir, permit)) => match ep {
            Endpoint::Legacy => run_legacy(st, request, workdir, permit).await,
            Endpoint::V1 => run_v1(st, request, workdir, permit),
        },
        Err(refusal) => refusal.respond(ep),
    }
}

/// Everything before the command starts: auth, body, allowlist, cwd, a slot.
async fn admit(
    st: &Arc<ServerState>,
    ep: Endpoint,
    req: Request<Incoming>,
) -> Result<(ExecRequest, WorkDir, OwnedSemaphorePermit), Refusal> {
    if let Some(token) = &st.cfg.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !constant_time_eq(given.as_bytes(), token.as_bytes()) {
            return Err(Refusal::new(
                StatusCode::UNAUTHORIZED,
                "missing or wrong bearer token (send Authorization: Bearer <token from CORRAL_EXECUTOR_TOKEN_FILE>)",
            ));
        }
    }
    let too_large = || {
        Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body exceeds {MAX_BODY} bytes (1 MiB plus a 16 MiB stdin)"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Err(e) => {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("could not read the request body: {e}"),
            ));
        }
    };
    let parsed = match ep {
        Endpoint::Legacy => ExecRequest::parse_legacy(&body),
        Endpoint::V1 => ExecRequest::parse_v1(&body),
    };
    let request = parsed.map_err(|e: RequestError| {
        Refusal::new(StatusCode::BAD_REQUEST, format!("bad request: {e}"))
    })?;
    let cwd_text = request.cwd.clone().unwrap_or_else(|| ".".into());

    if !allowed(&st.cfg.allow, &request.command[0]) {
        let reason = format!(
            "program {:?} is not in executor.allow ({}); add it to [executor] allow in corral.toml",
            request.command[0],
            st.cfg.allow.join(", ")
        );
        policy_refusal(st, &request, &cwd_text, &reason);
        return Err(Refusal {
            status: StatusCode::FORBIDDEN,
            message: reason,
            exit: 126,
        });
    }
    if let Err(refusal) = crate::reqenv::check(&request.env) {
        let reason = refusal.to_string();
        policy_refusal(st, &request, &cwd_text, &reason);
        return Err(Refusal {
            status: StatusCode::FORBIDDEN,
            message: reason,
            exit: 126,
        });
    }
    let workdir = match st.root.resolve(request.cwd.as_deref()) {
        Ok(w) => w,
        Err(e) => {
            let reason = e.to_string();
            audit_refusal(st, &request, &cwd_text, &reason);
            return Err(Refusal::new(StatusCode::BAD_REQUEST, reason));
        }
    };
    let permit = match st.slots.clone().try_acquire_owned() {
        Ok(p) => p,
        Err(_) => {
            let reason = format!(
                "executor busy: {} commands already running (executor.max_concurrent); retry later",
                st.cfg.max_concurrent
            );
            audit_refusal(st, &request, &cwd_text, &reason);
            return Err(Refusal::new(StatusCode::TOO_MANY_REQUESTS, reason));
        }
    };
    if *st.shutdown.borrow() {
        return Err(Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "executor is shutting down",
        ));
    }
    audit_start(st, &request, &workdir)?;
    Ok((request, workdir, permit))
}

/// Whether `program` may run under `allow` (empty: anything). A bare name matches a name entry,
/// or an absolute entry that is where PATH finds it; a path matches an identical entry.
fn allowed(allow: &[String], program: &str) -> bool {
    if allow.is_empty() {
        return true;
    }
    if allow.iter().any(|a| a == program) {
        return true;
    }
    if program.contains('/') {
        return false;
    }
    match which(program) {
        Some(found) => allow.iter().any(|a| Path::new(a) == found),
        None => false,
    }
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Compare without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

fn bounds(st: &ServerState, req: &ExecRequest) -> Bounds {
    let limit = st.cfg.timeout;
    let timeout = req
        .timeout_ms
        .map(|ms| Duration::from_millis(ms).min(limit))
        .unwrap_or(limit);
    Bounds {
        timeout,
        kill_grace: st.cfg.kill_grace,
        max_output: st.cfg.max_output,
    }
}

fn spawn_for(
    st: &ServerState,
    req: &ExecRequest,
    workdir: &WorkDir,
    merge: bool,
) -> Result<crate::spawn::Spawned, crate::spawn::SpawnError> {
    st.spawner.spawn(SpawnSpec {
        argv: &req.command,
        workdir,
        env: &req.env,
        stdin: req.stdin.is_some(),
        merge_output: merge,
    })
}

async fn run_legacy(
    st: Arc<ServerState>,
    req: ExecRequest,
    workdir: WorkDir,
    permit: OwnedSemaphorePermit,
) -> Response<RespBody> {
    let started = Instant::now();
    let spawned = match spawn_for(&st, &req, &workdir, true) {
        Ok(s) => s,
        Err(e) => {
            audit_done(&st, &req, &workdir, started, Err(&e));
            drop(permit);
            // Seed 003's server answers 200 with the error text as output.
            return json_ok(proto::legacy_response(
                e.exit_code(),
                e.to_string().as_bytes(),
            ));
        }
    };
    // The command runs in its own task; dropping this request (the client went away) drops
    // `cancel_tx`, which ends the command.
    let (cancel_tx, cancel_rx) = oneshot::channel::<()>();
    let (done_tx, done_rx) = oneshot::channel();
    let st2 = st.clone();
    tokio::spawn(async move {
        let mut sink = Sink::Buffer {
            buf: Vec::new(),
            cancel: cancel_rx,
        };
        let b = bounds(&st2, &req);
        let outcome = supervise(
            spawned,
            req.stdin.clone(),
            &mut sink,
            b,
            st2.shutdown.clone(),
        )
        .await;
        audit_done(&st2, &req, &workdir, started, Ok(&outcome));
        drop(permit);
        if let Sink::Buffer { buf, .. } = sink {
            let _ = done_tx.send((outcome, buf));
        }
    });
    let result = done_rx.await;
    drop(cancel_tx);
    match result {
        Ok((outcome, output)) => json_ok(proto::legacy_response(outcome.exit.exit, &output)),
        Err(_) => Refusal::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the command's supervisor failed",
        )
        .respond(Endpoint::Legacy),
    }
}

fn json_ok(body: Vec<u8>) -> Response<RespBody> {
    let mut r = Response::new(RespBody::Full(Full::new(Bytes::from(body))));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

fn run_v1(
    st: Arc<ServerState>,
    req: ExecRequest,
    workdir: WorkDir,
    permit: OwnedSemaphorePermit,
) -> Response<RespBody> {
    let started = Instant::now();
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    match spawn_for(&st, &req, &workdir, false) {
        Err(e) => {
            audit_done(&st, &req, &workdir, started, Err(&e));
            drop(permit);
            let line = Event::Error {
                error: e.to_string(),
                exit: Some(e.exit_code()),
            }
            .to_line();
            let _ = tx.try_send(Bytes::from(line));
        }
        Ok(spawned) => {
            tokio::spawn(async move {
                let mut sink = Sink::channel(tx);
                let b = bounds(&st, &req);
                let outcome = supervise(
                    spawned,
                    req.stdin.clone(),
                    &mut sink,
                    b,
                    st.shutdown.clone(),
                )
                .await;
                audit_done(&st, &req, &workdir, started, Ok(&outcome));
                match outcome.ended {
                    EndCause::Shutdown => {
                        sink.event(Event::Error {
                            error: "the executor is shutting down; the command was killed".into(),
                            exit: Some(outcome.exit.exit),
                        })
                        .await
                    }
                    EndCause::Disconnected => {}
                    EndCause::Exited | EndCause::TimedOut => {
                        if outcome.ended == EndCause::TimedOut {
                            let msg = format!(
                                "\n[corral: command timed out after {}; its process group was killed]\n",
                                humantime::format_duration(b.timeout)
                            );
                            sink.event(Event::Output {
                                stream: proto::Stream::Stderr,
                                data: msg,
                            })
                            .await;
                        }
                        sink.event(Event::Exit(outcome.exit)).await
                    }
                }
                drop(permit);
            });
        }
    }
    let mut r = Response::new(RespBody::Stream(rx));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/x-ndjson"),
    );
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    r
}

/// Write one record. One that cannot be written is counted by the log
/// ([`AuditLog::failures`]: the server's exit line, the run's summary) and is an error here.
fn audit_write(st: &ServerState, ev: ExecEvent) -> Result<(), corral_audit::AuditError> {
    let Some(log) = &st.cfg.audit else {
        return Ok(());
    };
    let rec = Record::now(&st.cfg.jail_id, AuditEvent::Exec(ev));
    log.write(&rec).inspect_err(|e| {
        eprintln!("corral serve: cannot write the audit log: {e}");
    })
}

/// The record that a command is about to run, written before it is spawned: a command that
/// cannot be recorded is refused (503) and never runs (fail closed).
fn audit_start(st: &ServerState, req: &ExecRequest, workdir: &WorkDir) -> Result<(), Refusal> {
    let ev = ExecEvent {
        phase: ExecPhase::Start,
        command: req.command.clone(),
        cwd: workdir.path.display().to_string(),
        decision: Some(Decision::Allow),
        ..ExecEvent::default()
    };
    audit_write(st, ev).map_err(|e| {
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the audit log cannot record this command, so it was not run ({e}); \
                 make the log writable again, then retry"
            ),
        )
    })
}

/// A refusal by `executor.allow` or the variables' allow-list: audited, and one line on the server's stderr,
/// `corral serve: refused [COMMAND]: REASON` (`corral run` repeats these lines when the run
/// ends).
fn policy_refusal(st: &ServerState, req: &ExecRequest, cwd: &str, reason: &str) {
    eprintln!("{REFUSED_PREFIX}{:?}: {reason}", req.command);
    audit_refusal(st, req, cwd, reason);
}

/// How [`policy_refusal`] lines start.
pub const REFUSED_PREFIX: &str = "corral serve: refused ";

/// A refused request: refused whether or not its record could be written.
fn audit_refusal(st: &ServerState, req: &ExecRequest, cwd: &str, reason: &str) {
    let _ = audit_write(
        st,
        ExecEvent {
            command: req.command.clone(),
            cwd: cwd.into(),
            decision: Some(Decision::Deny),
            reason: Some(reason.into()),
            ..ExecEvent::default()
        },
    );
}

fn audit_done(
    st: &ServerState,
    req: &ExecRequest,
    workdir: &WorkDir,
    started: Instant,
    result: Result<&Outcome, &crate::spawn::SpawnError>,
) {
    let mut ev = ExecEvent {
        command: req.command.clone(),
        cwd: workdir.path.display().to_string(),
        decision: Some(Decision::Allow),
        duration_ms: started.elapsed().as_millis() as u64,
        ..ExecEvent::default()
    };
    match result {
        Ok(o) => {
            ev.exit_code = Some(o.exit.exit);
            ev.signal = o.exit.signal;
            ev.timed_out = o.exit.timed_out;
            ev.bytes_out = o.bytes_out;
            ev.reason = match o.ended {
                EndCause::Exited | EndCause::TimedOut => None,
                EndCause::Disconnected => Some("client disconnected; process group killed".into()),
                EndCause::Shutdown => Some("server shut down; process group killed".into()),
            };
        }
        Err(e) => {
            ev.exit_code = Some(e.exit_code());
            ev.reason = Some(e.to_string());
        }
    }
    // The command has run: a record that cannot be written is counted by the log.
    let _ = audit_write(st, ev);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(
            ListenAddr::parse("127.0.0.1:8080").unwrap(),
            ListenAddr::Tcp("127.0.0.1:8080".into())
        );
        assert_eq!(
            ListenAddr::parse("unix:/run/x.sock").unwrap(),
            ListenAddr::Unix("/run/x.sock".into())
        );
        assert!(ListenAddr::parse("unix:").is_err());
        assert_eq!(ListenAddr::parse("fd:3").unwrap(), ListenAddr::Fd(3));
        assert!(ListenAddr::parse("fd:").is_err());
        assert!(ListenAddr::parse("fd:-1").is_err());
        assert!(ListenAddr::parse("localhost").is_err());
    }

    #[test]
    fn allowlist_by_name_and_path() {
        let allow = vec!["cargo".to_string(), "/bin/sh".to_string()];
        assert!(allowed(&[], "anything"));
        assert!(allowed(&allow, "cargo"));
        assert!(allowed(&allow, "/bin/sh"));
        assert!(!allowed(&allow, "rm"));
        assert!(!allowed(&allow, "./cargo"));
        assert!(!allowed(&allow, "/usr/bin/cargo-evil"));
    }

    #[test]
    fn token_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
    }
}
