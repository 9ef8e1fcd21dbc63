//! The running jails of a user, and each one's control socket (`corral watch` talks to them).
//!
//! A `corral run` with corral's proxy (native, or a container engine's) registers itself in the control directory,
//! `$XDG_RUNTIME_DIR/corral-jails` (else `$TMPDIR/corral-UID/jails`), mode 0700 and owned by the
//! user: `JAIL.json` says which project it runs (its pid, the project root) and `JAIL.sock` is a
//! unix socket (0600) that takes one request line and answers one line:
//!
//! - `allow HOST[:PORT]`: allow the destination for this run only (as `corral allow` parses it);
//! - `reload`: re-read the policy files now;
//! - `asks`: the questions pending (`network.on_deny = "ask"`), one JSON array;
//! - `refuse HOST[:PORT]`: refuse the pending question about it (`allow` answers one too).
//!
//! The socket must never be visible in the jail (the agent would allow itself anything): the run
//! refuses to create it when one of the jail's binds covers the directory ([`visible_in`]), the
//! directory is refused when it is not the user's own private one, and a peer with another uid
//! is refused. The jail's network namespace keeps it from abstract sockets; this one is a path.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

/// The longest request line a control socket reads.
const MAX_LINE: u64 = 4096;

/// The user's control directory, created 0700 when missing; refused when it is not a directory
/// owned by the user that only the user can enter.
pub fn dir() -> anyhow::Result<PathBuf> {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| Path::new(d).is_absolute() && Path::new(d).is_dir())
        .map(|d| PathBuf::from(d).join("corral-jails"));
    let uid = nix::unistd::geteuid().as_raw();
    let dir = match base {
        Some(d) => d,
        None => {
            let top = std::env::temp_dir().join(format!("corral-{uid}"));
            private_dir(&top, uid)?;
            top.join("jails")
        }
    };
    private_dir(&dir, uid)?;
    Ok(dir)
}

/// Create `dir` (0700) if needed and check it is the user's own, private directory (not a
/// symlink: another user of a shared /tmp could plant one).
fn private_dir(dir: &Path, uid: u32) -> anyhow::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(dir)
        .with_context(|| format!("cannot inspect {}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        bail!(
            "{} is not a private directory of uid {uid} (mode 0700): refusing to keep jail \
             control sockets there; remove it",
            dir.display()
        );
    }
    Ok(())
}

/// Whether `dir` is reachable inside the jail of `plan`: a bind's source holds it.
pub fn visible_in(plan: &corral_policy::Plan, dir: &Path) -> bool {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    plan.mounts.iter().any(|m| {
        matches!(m.kind, corral_policy::plan::MountKind::Bind(_))
            && (dir.starts_with(&m.source)
                || std::fs::canonicalize(&m.source).is_ok_and(|s| dir.starts_with(s)))
    })
}

/// One running jail, as registered.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Entry {
    pub jail: String,
    pub pid: u32,
    pub project: PathBuf,
    /// When it started (RFC 3339).
    pub started: String,
    pub socket: PathBuf,
    /// The container engine running it (`podman`, `docker`); none for a native run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

/// The running jails of `project` (registrations whose process is gone are removed).
pub fn list(project: &Path) -> Vec<Entry> {
    let Ok(dir) = dir() else { return Vec::new() };
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Some(entry) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Entry>(&b).ok())
        else {
            continue;
        };
        if !alive(entry.pid) {
            let _ = std::fs::remove_file(&entry.socket);
            let _ = std::fs::remove_file(&path);
            continue;
        }
        if entry.project == project {
            out.push(entry);
        }
    }
    out.sort_by(|a, b| a.jail.cmp(&b.jail));
    out
}

fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// Send one request line to a control socket; its one-line answer (`ok ...` or `error ...`).
pub fn request(socket: &Path, line: &str) -> anyhow::Result<String> {
    let mut s = UnixStream::connect(socket).with_context(|| {
        format!(
            "cannot reach the jail's control socket {}",
            socket.display()
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(format!("{line}\n").as_bytes())
        .with_context(|| format!("cannot write to {}", socket.display()))?;
    let mut answer = String::new();
    BufReader::new(s.take(MAX_LINE))
        .read_line(&mut answer)
        .with_context(|| format!("no answer from {}", socket.display()))?;
    Ok(answer.trim_end().to_string())
}

/// What answers a request line: `Ok(text)` is sent as `ok text`, `Err(text)` as `error text`.
pub type Handler = Arc<dyn Fn(&str) -> Result<String, String> + Send + Sync>;

/// A registered jail's control socket, served on a thread; unregistered when dropped.
pub struct Server {
    socket: PathBuf,
    info: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Register `jail` of `project` in `dir` and serve its socket with `handler`.
    pub fn start(
        dir: &Path,
        jail: &str,
        project: &Path,
        engine: Option<&str>,
        handler: Handler,
    ) -> anyhow::Result<Server> {
        let socket = dir.join(format!("{jail}.sock"));
        let info = dir.join(format!("{jail}.json"));
        let listener = UnixListener::bind(&socket)
            .with_context(|| format!("cannot bind the control socket {}", socket.display()))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot set the mode of {}", socket.display()))?;
        let entry = Entry {
            jail: jail.to_string(),
            pid: std::process::id(),
            project: project.to_path_buf(),
            started: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            socket: socket.clone(),
            engine: engine.map(String::from),
        };
        let tmp = dir.join(format!(".{jail}.json.tmp"));
        std::fs::write(&tmp, serde_json::to_vec(&entry)?)
            .and_then(|()| std::fs::rename(&tmp, &info))
            .with_context(|| format!("cannot write {}", info.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("corral-control".into())
            .spawn(move || serve(listener, &s, &handler))
            .context("cannot start the control socket thread")?;
        Ok(Server {
            socket,
            info,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept: a connection of our own.
        let _ = UnixStream::connect(&self.socket);
        let _ = std::fs::remove_file(&self.info);
        let _ = std::fs::remove_file(&self.socket);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(listener: UnixListener, stop: &AtomicBool, handler: &Handler) {
    let me = nix::unistd::geteuid().as_raw();
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut conn) = conn else { continue };
        // Only the user's own processes (the socket is 0600 in a 0700 directory too).
        let peer = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials);
        if !peer.is_ok_and(|c| c.uid() == me) {
            let _ = conn.write_all(b"error not the jail's user\n");
            continue;
        }
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        let mut line = String::new();
        let read = BufReader::new((&conn).take(MAX_LINE)).read_line(&mut line);
        let answer = match read {
            Ok(_) if line.ends_with('\n') => match handler(line.trim_end()) {
                Ok(text) => format!("ok {text}\n"),
                Err(text) => format!("error {text}\n"),
            },
            _ => "error expected one request line\n".to_string(),
        };
        let _ = conn.write_all(answer.as_bytes());
    }
}
