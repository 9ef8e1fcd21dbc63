//! `network.publish` and `network.host_ports` for the harness container, for any engine and any
//! user: a relay container in the harness's network namespace, and corral on the host, joined
//! by Unix sockets in a per-run directory.
//!
//! Neither engine forwards ports of a container on an `--internal` network (`--publish` is
//! accepted and nothing answers), and the harness's loopback is its own. So:
//!
//! - corral binds 127.0.0.1:PORT on the host for each published port before anything starts (a
//!   port in use is an error at once), and creates the run's socket directory
//!   ([`Context::ports_dir`], mode 0700, owned by the relay's user) with a listening socket
//!   `h<PORT>` for each host port;
//! - once the harness runs, corral starts the relay container ([`relay_run`]) with
//!   `--network container:<harness>`, the same hardening as corral's other containers, and
//!   only that directory bound in. It runs `corral port-relay` ([`serve_relay`]): a socket
//!   `p<PORT>` per published port, each connection connected to 127.0.0.1:PORT in the
//!   harness's namespace; a listener on 127.0.0.1:PORT there per host port, each connection
//!   connected to the socket `h<PORT>`;
//! - corral forwards each host connection on a published port to `p<PORT>`, and each
//!   connection on `h<PORT>` to the host's 127.0.0.1:PORT: nothing else is reachable through
//!   the directory, and the harness never sees it (it is bound into the relay only; sockets
//!   with a path, never abstract ones, which the shared network namespace would expose).
//!
//! The relay exists a moment after the harness starts: a harness that connects to a host port
//! at once may retry, as it would for any service that starts beside it. The relay and the
//! directory are removed when the run ends ([`RelayGuard`]'s `Drop`, also after SIGTERM, which
//! ends the run); after a SIGKILL, `corral down` removes both ([`remove_leftovers`]).
//!
//! One path for every caller: root used to join the namespace with `setns` from corral's own
//! threads, which only root may do; the relay costs one container start (a fraction of a
//! second, only in runs that use ports) and leaves one code path to test.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use corral_policy::plan::{Access, NetworkMode, Plan};

use crate::argv::{
    CONTAINER_BIN, PROXY_FALLBACK_USER, STOP_TIMEOUT, hardening, harness_image, user_args, volume,
};
use crate::{Command, Context, EngineError, EngineKind, Result};

/// Where the relay container sees the run's socket directory.
pub const CONTAINER_PORTS_DIR: &str = "/run/corral-ports";
/// The end of a relay container's name (after the harness's).
pub const RELAY_SUFFIX: &str = "-ports";
/// The relay container's limits: a thread per connection direction.
pub const RELAY_CPUS: &str = "1";
pub const RELAY_MEMORY: &str = "256m";
pub const RELAY_PIDS: &str = "256";
/// How long a host connection on a published port waits for the relay's socket.
const RELAY_WAIT: Duration = Duration::from_secs(30);

/// The socket the relay listens on for a published port.
pub fn publish_socket(port: u16) -> String {
    format!("p{port}")
}

/// The socket corral listens on for a host port.
pub fn host_socket(port: u16) -> String {
    format!("h{port}")
}

fn io_err(what: String) -> impl FnOnce(io::Error) -> EngineError {
    move |source| EngineError::Io {
        path: PathBuf::from(what),
        source,
    }
}

/// The relay's uid/gid on the host when it is not the caller's (root runs: nobody).
fn relay_owner(plan: &Plan) -> Option<(u32, u32)> {
    if plan.uid != 0 {
        return None;
    }
    let (u, g) = PROXY_FALLBACK_USER.split_once(':').expect("uid:gid");
    Some((u.parse().expect("uid"), g.parse().expect("gid")))
}

/// The ports a plan relays: none with `network.mode = "host"` (the harness's ports are the
/// host's already).
fn relayed(plan: &Plan) -> (Vec<u16>, Vec<u16>) {
    if plan.network.mode == NetworkMode::Host {
        return (Vec::new(), Vec::new());
    }
    (
        plan.network.publish.clone(),
        plan.network.host_ports.clone(),
    )
}

impl Context {
    /// This run's socket directory on the host (publish and host_ports), bound into its relay
    /// container only.
    pub fn ports_dir(&self) -> PathBuf {
        self.state_dir.join("ports").join(&self.jail_id)
    }

    /// This run's relay container, in the harness's network namespace.
    pub fn relay_container(&self, plan: &Plan) -> String {
        format!("{}{RELAY_SUFFIX}", self.harness_container(plan))
    }
}

/// The relay container: in the harness's network namespace, hardened like corral's other
/// containers, the run's socket directory its only bind besides the corral binary.
pub fn relay_run(plan: &Plan, ctx: &Context) -> Result<Command> {
    let e = ctx.engine;
    let names = ctx.names(plan);
    let (publish, host_ports) = relayed(plan);
    let mut a: Vec<String> = vec![
        "run".into(),
        "--detach".into(),
        "--name".into(),
        ctx.relay_container(plan),
        "--label".into(),
        names.label(),
        "--label".into(),
        "corral.role=ports".into(),
        "--label".into(),
        format!("corral.jail={}", ctx.jail_id),
        "--pull".into(),
        "never".into(),
        "--init".into(),
    ];
    a.extend(hardening(ctx));
    match relay_owner(plan) {
        Some((u, g)) => a.extend(["--user".into(), format!("{u}:{g}")]),
        // Rootless podman gives each container a user namespace of its own, and a container
        // whose user namespace does not own the network namespace it joins cannot mount its
        // /sys: the relay shares the harness's (as the caller's uid; other namespaces, the PID
        // one included, stay its own).
        None if ctx.engine == EngineKind::Podman && ctx.rootless => a.extend([
            "--userns".into(),
            format!("container:{}", ctx.harness_container(plan)),
            "--user".into(),
            format!("{}:{}", plan.uid, plan.gid),
        ]),
        None => a.extend(user_args(ctx, plan.uid, plan.gid)),
    }
    // Where the engine ignores limits (rootless podman on cgroup v1), none are asked for.
    let limits = [
        ("--cpus", RELAY_CPUS),
        ("--memory", RELAY_MEMORY),
        ("--pids-limit", RELAY_PIDS),
    ];
    for (flag, value) in limits.into_iter().filter(|_| ctx.limits_enforceable) {
        a.extend([flag.into(), value.into()]);
    }
    a.extend(["--stop-timeout".into(), STOP_TIMEOUT.to_string()]);
    a.extend([
        "--network".into(),
        format!("container:{}", ctx.harness_container(plan)),
    ]);
    a.push("--volume".into());
    a.push(volume(
        e,
        &ctx.corral_bin,
        Path::new(CONTAINER_BIN),
        Access::Ro,
    )?);
    a.push("--volume".into());
    a.push(volume(
        e,
        &ctx.ports_dir(),
        Path::new(CONTAINER_PORTS_DIR),
        Access::Rw,
    )?);
    let image = ctx
        .proxy_image
        .clone()
        .unwrap_or_else(|| harness_image(plan));
    a.extend(["--entrypoint".into(), CONTAINER_BIN.into(), image]);
    a.extend([
        "port-relay".into(),
        "--dir".into(),
        CONTAINER_PORTS_DIR.into(),
    ]);
    for p in publish {
        a.extend(["--publish".into(), p.to_string()]);
    }
    for p in host_ports {
        a.extend(["--host-port".into(), p.to_string()]);
    }
    Ok(Command::new(e.program()).args(a))
}

/// The host's side, set up before anything starts: the published ports' listeners and the
/// socket directory with the host ports' sockets.
pub struct Relays {
    published: Vec<(u16, TcpListener)>,
    host_ports: Vec<(u16, UnixListener)>,
    dir: Option<Arc<RunDir>>,
}

/// The run's socket directory, open: its sockets are reached as `/proc/self/fd/N/NAME`, short
/// whatever the state directory's path (a socket path holds at most 107 bytes).
struct RunDir {
    path: PathBuf,
    fd: File,
}

impl RunDir {
    fn socket(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}/{name}", self.fd.as_raw_fd()))
    }
}

impl Relays {
    /// Bind 127.0.0.1:PORT on the host for each published port, and make the socket directory
    /// with a listening socket per host port. Nothing when the plan relays no port.
    pub fn bind(plan: &Plan, ctx: &Context) -> Result<Self> {
        let (publish, host) = relayed(plan);
        let mut published = Vec::new();
        for port in publish {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let l = TcpListener::bind(addr)
                .map_err(io_err(format!("publish: binding {addr} on the host")))?;
            published.push((port, l));
        }
        let mut relays = Relays {
            published,
            host_ports: Vec::new(),
            dir: None,
        };
        if relays.published.is_empty() && host.is_empty() {
            return Ok(relays);
        }
        let dir = make_run_dir(&ctx.ports_dir(), relay_owner(plan))?;
        for port in host {
            let path = dir.socket(&host_socket(port));
            let shown = dir.path.join(host_socket(port));
            let l = UnixListener::bind(&path)
                .map_err(io_err(format!("host_ports: binding {}", shown.display())))?;
            // Reached only through the 0700 directory: the relay's user must connect.
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
                .map_err(io_err(format!("host_ports: {}", shown.display())))?;
            if let Some((u, g)) = relay_owner(plan) {
                std::os::unix::fs::chown(&path, Some(u), Some(g))
                    .map_err(io_err(format!("host_ports: {}", shown.display())))?;
            }
            relays.host_ports.push((port, l));
        }
        relays.dir = Some(Arc::new(dir));
        Ok(relays)
    }

    /// Serve the host's side, and start the relay container once the harness runs (in a
    /// thread). Returns at once; dropping the guard removes the relay and the directory.
    pub fn start(self, ctx: &Context, plan: &Plan) -> Result<RelayGuard> {
        let done = Arc::new(AtomicBool::new(false));
        let Some(dir) = self.dir else {
            return Ok(RelayGuard::none(done));
        };
        for (port, listener) in self.published {
            let (dir, done) = (dir.clone(), done.clone());
            thread::spawn(move || {
                for conn in listener.incoming().flatten() {
                    let (dir, done) = (dir.clone(), done.clone());
                    thread::spawn(move || {
                        if let Some(relay) = connect_relay(&dir, port, &done) {
                            pipe(conn, relay);
                        }
                    });
                }
            });
        }
        for (port, listener) in self.host_ports {
            thread::spawn(move || {
                for conn in listener.incoming().flatten() {
                    // Only the host's 127.0.0.1:PORT, the port this socket stands for.
                    thread::spawn(move || {
                        if let Ok(host) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
                            pipe(conn, host);
                        }
                    });
                }
            });
        }
        let run = relay_run(plan, ctx)?;
        let running = Command::new(ctx.engine.program()).args([
            "container",
            "inspect",
            "--format",
            "{{.State.Running}}",
            &ctx.harness_container(plan),
        ]);
        let stopped = done.clone();
        let starter = thread::spawn(move || start_relay(&running, &run, &stopped));
        Ok(RelayGuard {
            done,
            starter: Some(starter),
            engine: ctx.engine,
            relay: ctx.relay_container(plan),
            harness: ctx.harness_container(plan),
            dir: Some(dir),
        })
    }
}

/// The run's socket directory: 0700, owned by the relay's user; a leftover of the same jail id
/// would be someone else's, so it must not exist yet.
fn make_run_dir(path: &Path, owner: Option<(u32, u32)>) -> Result<RunDir> {
    let shown = |what: &str| format!("ports: {what} {}", path.display());
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(io_err(shown("creating the parent of")))?;
    }
    fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(io_err(shown("creating")))?;
    if let Some((u, g)) = owner {
        std::os::unix::fs::chown(path, Some(u), Some(g)).map_err(io_err(shown("chown")))?;
    }
    let fd = File::open(path).map_err(io_err(shown("opening")))?;
    Ok(RunDir {
        path: path.to_path_buf(),
        fd,
    })
}

/// Wait for the harness to run, then start the relay; a relay that cannot start beside a
/// harness that still runs is said once (the run goes on without its ports).
fn start_relay(running: &Command, run: &Command, done: &AtomicBool) {
    let is_running = || {
        let out = running.to_std().stdin(Stdio::null()).output();
        out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "true")
    };
    loop {
        if done.load(Ordering::Relaxed) {
            return;
        }
        if is_running() {
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    if let Err(e) = crate::runner::output(run)
        && !done.load(Ordering::Relaxed)
        && is_running()
    {
        eprintln!("corral: publish/host_ports: the relay container did not start: {e}");
    }
}

/// A connection to the relay's socket for `port`, waiting while the relay starts.
fn connect_relay(dir: &RunDir, port: u16, done: &AtomicBool) -> Option<UnixStream> {
    let path = dir.socket(&publish_socket(port));
    let mut waited = Duration::ZERO;
    while waited < RELAY_WAIT && !done.load(Ordering::Relaxed) {
        if let Ok(s) = UnixStream::connect(&path) {
            return Some(s);
        }
        thread::sleep(Duration::from_millis(50));
        waited += Duration::from_millis(50);
    }
    None
}

/// The run's relay: dropping it stops it and removes the relay container, then the harness's
/// (podman does not remove a container another one shares the network of, so the harness's
/// `--rm` may have left it), and the socket directory.
pub struct RelayGuard {
    done: Arc<AtomicBool>,
    starter: Option<JoinHandle<()>>,
    engine: EngineKind,
    relay: String,
    harness: String,
    dir: Option<Arc<RunDir>>,
}

impl RelayGuard {
    fn none(done: Arc<AtomicBool>) -> Self {
        RelayGuard {
            done,
            starter: None,
            engine: EngineKind::Podman,
            relay: String::new(),
            harness: String::new(),
            dir: None,
        }
    }
}

impl Drop for RelayGuard {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        let Some(starter) = self.starter.take() else {
            return;
        };
        // Not removing a relay that starts after the removal.
        let _ = starter.join();
        for name in [&self.relay, &self.harness] {
            let _ = remove_container(self.engine, name);
        }
        if let Some(dir) = &self.dir {
            let _ = fs::remove_dir_all(&dir.path);
        }
    }
}

/// `ENGINE rm --force NAME`, its output dropped (a container already gone is no error).
pub(crate) fn remove_container(
    engine: EngineKind,
    name: &str,
) -> io::Result<std::process::ExitStatus> {
    let mut rm = std::process::Command::new(engine.program());
    rm.args(["rm", "--force"]);
    if engine == EngineKind::Podman {
        rm.args(["--time", "5"]);
    }
    rm.arg(name)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
}

/// What killed runs left in the project's state directory: their socket directories (their
/// relay containers go with the project's containers). `corral down` calls it.
pub fn remove_leftovers(state_dir: &Path) -> Result<Option<PathBuf>> {
    let dir = state_dir.join("ports");
    if !dir.exists() {
        return Ok(None);
    }
    fs::remove_dir_all(&dir).map_err(io_err(format!("removing {}", dir.display())))?;
    Ok(Some(dir))
}

/// `corral port-relay`, in the relay container: serve `publish` and `host_ports` between the
/// harness's loopback and the sockets in `dir`. Runs until killed.
pub fn serve_relay(dir: &Path, publish: &[u16], host_ports: &[u16]) -> io::Result<()> {
    let mut threads = Vec::new();
    for &port in publish {
        let path = dir.join(publish_socket(port));
        let _ = fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|e| context(e, "binding", &path))?;
        threads.push(thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                thread::spawn(move || {
                    if let Ok(inner) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
                        pipe(conn, inner);
                    }
                });
            }
        }));
    }
    for &port in host_ports {
        let path = dir.join(host_socket(port));
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let listener = TcpListener::bind(addr).map_err(|e| {
            io::Error::new(e.kind(), format!("listening on {addr} in the harness: {e}"))
        })?;
        threads.push(thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let path = path.clone();
                thread::spawn(move || {
                    if let Ok(host) = UnixStream::connect(&path) {
                        pipe(conn, host);
                    }
                });
            }
        }));
    }
    eprintln!("corral port-relay: relaying publish {publish:?}, host_ports {host_ports:?}");
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

fn context(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// A stream `pipe` can copy in both directions at once.
trait Duplex: Read + Write + Send + Sized + 'static {
    fn duplicate(&self) -> io::Result<Self>;
    fn close_write(&self);
}

impl Duplex for TcpStream {
    fn duplicate(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn close_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

impl Duplex for UnixStream {
    fn duplicate(&self) -> io::Result<Self> {
        self.try_clone()
    }
    fn close_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

/// Copy both ways until each side has finished sending.
fn pipe<A: Duplex, B: Duplex>(a: A, b: B) {
    let (Ok(a2), Ok(b2)) = (a.duplicate(), b.duplicate()) else {
        return;
    };
    let back = thread::spawn(move || copy_then_close(b2, a2));
    copy_then_close(a, b);
    let _ = back.join();
}

fn copy_then_close<F: Duplex, T: Duplex>(mut from: F, mut to: T) {
    let _ = io::copy(&mut from, &mut to);
    to.close_write();
}

#[cfg(test)]
mod tests;
