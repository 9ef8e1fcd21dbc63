//! corral's one audit writer and reader.
//!
//! Every run has a jail id; every network decision, executor command and lifecycle event of a run
//! is one JSON line in the project's log under `$XDG_STATE_HOME/corral/` (default
//! `~/.local/state/corral/`). Writers in several processes append to the same file: each record is
//! written with a single `write(2)` on an `O_APPEND` descriptor while holding an exclusive `flock`
//! on `audit.jsonl.lock`, so lines never interleave. When the file passes `max_bytes` it is renamed
//! to `audit.jsonl.1` (one generation kept) under the same lock.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Default size at which the log rotates.
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit log {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("no state directory: set XDG_STATE_HOME or HOME")]
    NoStateDir,
}

/// Allowed or denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allow,
    Deny,
}

/// One network decision or closed connection (SPEC section 5).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NetEvent {
    /// `decision` when the proxy decides, `close` when the connection ends.
    pub phase: String,
    pub client: String,
    /// `CONNECT`, `GET`, ..., or `SOCKS5`.
    pub method: String,
    pub host: String,
    pub port: u16,
    /// The address the proxy checked and connected to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub decision: Option<Decision>,
    /// The rule that decided (`network.allow: *.github.com`, `not in network.allow`, ...).
    pub rule: String,
    #[serde(default)]
    pub bytes_up: u64,
    #[serde(default)]
    pub bytes_down: u64,
    #[serde(default)]
    pub duration_ms: u64,
    /// Credential-gateway secret involved (its name only, never its value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// One executor command.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ExecEvent {
    pub command: Vec<String>,
    pub cwd: String,
    pub decision: Option<Decision>,
    /// Why a command was refused or failed to start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default)]
    pub timed_out: bool,
    #[serde(default)]
    pub duration_ms: u64,
    #[serde(default)]
    pub bytes_out: u64,
}

/// A jail lifecycle event: `start` (with the plan), `exit`, `oom`, `pids`, `changes`, ...
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct JailEvent {
    pub event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub detail: serde_json::Value,
}

/// What a record is about.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Event {
    Net(NetEvent),
    Exec(ExecEvent),
    Jail(JailEvent),
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// RFC 3339 UTC with milliseconds.
    pub time: String,
    pub jail: String,
    #[serde(flatten)]
    pub event: Event,
}

impl Record {
    pub fn now(jail: &str, event: Event) -> Self {
        Self {
            time: rfc3339(SystemTime::now()),
            jail: jail.to_string(),
            event,
        }
    }

    /// Whether this record is a denial (network deny or refused command).
    pub fn is_blocked(&self) -> bool {
        match &self.event {
            Event::Net(n) => n.decision == Some(Decision::Deny),
            Event::Exec(e) => e.decision == Some(Decision::Deny),
            Event::Jail(_) => false,
        }
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// A new jail id: time-ordered and unique enough to tell runs apart in one log.
pub fn new_jail_id() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let mut rnd = [0u8; 3];
    if let Ok(mut f) = File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut rnd);
    }
    format!(
        "{:x}-{:02x}{:02x}{:02x}",
        now.as_secs(),
        rnd[0],
        rnd[1],
        rnd[2]
    )
}

/// The state directory: `$XDG_STATE_HOME/corral`, else `$HOME/.local/state/corral`.
pub fn state_dir() -> Result<PathBuf, AuditError> {
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("corral"));
    }
    let home = std::env::var_os("HOME")
        .filter(|d| !d.is_empty())
        .ok_or(AuditError::NoStateDir)?;
    Ok(PathBuf::from(home).join(".local/state/corral"))
}

/// The directory name of a project's log: its base name plus a hash of its full path, so two
/// projects with the same name never share a log.
pub fn project_key(project_root: &Path) -> String {
    let name = project_root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into());
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // FNV-1a: stable across releases, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in project_root.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{name}-{:08x}", h as u32)
}

/// A project's audit log.
#[derive(Debug, Clone)]
pub struct AuditLog {
    path: PathBuf,
    max_bytes: u64,
}

impl AuditLog {
    /// The log of the project at `project_root`, under the state directory.
    pub fn for_project(project_root: &Path) -> Result<Self, AuditError> {
        Ok(Self::at(
            state_dir()?
                .join(project_key(project_root))
                .join("audit.jsonl"),
        ))
    }

    /// A log at an explicit path (tests, the proxy container's volume). The path `-` is
    /// standard output: one JSON line per record, for a log stack that collects it (the proxy
    /// on Kubernetes).
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }

    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn rotated_path(&self) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(".1");
        PathBuf::from(p)
    }

    fn io_err(&self, source: io::Error) -> AuditError {
        AuditError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Append one record. Safe against concurrent writers in other processes.
    pub fn write(&self, record: &Record) -> Result<(), AuditError> {
        let mut line = serde_json::to_vec(record).map_err(|e| self.io_err(e.into()))?;
        line.push(b'\n');
        if self.path == Path::new("-") {
            let mut out = io::stdout().lock();
            return out
                .write_all(&line)
                .and_then(|()| out.flush())
                .map_err(|e| self.io_err(e));
        }
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir).map_err(|e| self.io_err(e))?;
        }
        // One lock file that is never renamed serialises every writer, so rotation (a rename
        // of the log itself) cannot race another writer holding the old inode.
        let guard = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.lock_path())
            .map_err(|e| self.io_err(e))?;
        lock(&guard).map_err(|e| self.io_err(e))?;
        let mut file = self.open_append()?;
        let len = file.metadata().map_err(|e| self.io_err(e))?.len();
        if len > 0 && len + line.len() as u64 > self.max_bytes {
            let old = file.metadata().map_err(|e| self.io_err(e))?;
            fs::rename(&self.path, self.rotated_path()).map_err(|e| self.io_err(e))?;
            file = self.open_append()?;
            // The new generation keeps the old one's group and mode, so writers of another user
            // that share the log (the proxy container's, corral-engine) can still append.
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            let _ = std::os::unix::fs::fchown(&file, None, Some(old.gid()));
            let _ = file.set_permissions(fs::Permissions::from_mode(old.mode() & 0o660));
        }
        let written = file.write_all(&line).map_err(|e| self.io_err(e));
        drop(guard);
        written
    }

    fn lock_path(&self) -> PathBuf {
        let mut name = self.path.file_name().unwrap_or_default().to_os_string();
        name.push(".lock");
        self.path.with_file_name(name)
    }

    fn open_append(&self) -> Result<File, AuditError> {
        // Never through a link: the directory may be shared with a less trusted writer (the
        // proxy container's user), which must not point root's next write at another file.
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)
            .map_err(|e| self.io_err(e))
    }

    /// Every record, oldest first (the rotated generation, then the current file). Lines that do
    /// not parse are skipped and counted.
    pub fn read_all(&self) -> Result<(Vec<Record>, usize), AuditError> {
        let mut out = Vec::new();
        let mut bad = 0;
        for path in [self.rotated_path(), self.path.clone()] {
            let file = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => return Err(AuditError::Io { path, source }),
            };
            for line in BufReader::new(file).lines() {
                let line = line.map_err(|source| AuditError::Io {
                    path: path.clone(),
                    source,
                })?;
                if line.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str(&line) {
                    Ok(r) => out.push(r),
                    Err(_) => bad += 1,
                }
            }
        }
        Ok((out, bad))
    }
}

fn lock(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: flock on a descriptor we own; the lock is released when the File is dropped.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(host: &str, decision: Decision) -> Event {
        Event::Net(NetEvent {
            phase: "decision".into(),
            client: "jail".into(),
            method: "CONNECT".into(),
            host: host.into(),
            port: 443,
            decision: Some(decision),
            rule: "not in network.allow".into(),
            ..Default::default()
        })
    }

    #[test]
    fn round_trips_and_flags_blocked() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::at(dir.path().join("a/audit.jsonl"));
        log.write(&Record::now("j1", net("github.com", Decision::Deny)))
            .unwrap();
        log.write(&Record::now(
            "j1",
            net("api.anthropic.com", Decision::Allow),
        ))
        .unwrap();
        let (records, bad) = log.read_all().unwrap();
        assert_eq!(bad, 0);
        assert_eq!(records.len(), 2);
        assert!(records[0].is_blocked());
        assert!(!records[1].is_blocked());
        let line = fs::read_to_string(log.path()).unwrap();
        let first: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
        assert_eq!(first["kind"], "net");
        assert_eq!(first["host"], "github.com");
        assert_eq!(first["decision"], "deny");
    }

    #[test]
    fn concurrent_writers_never_interleave_and_rotation_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::at(dir.path().join("audit.jsonl")).with_max_bytes(64 * 1024);
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        let host = format!("h{t}-{i}.example.org");
                        log.write(&Record::now("j", net(&host, Decision::Allow)))
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // The last records written, whichever generation they landed in, survive rotation.
        let finals: Vec<_> = (0..8)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    let host = format!("final{t}.example.org");
                    log.write(&Record::now("j", net(&host, Decision::Allow)))
                        .unwrap();
                })
            })
            .collect();
        for t in finals {
            t.join().unwrap();
        }
        // Every line of both generations parses; the newest records are all present.
        let (records, bad) = log.read_all().unwrap();
        assert_eq!(bad, 0);
        assert!(log.rotated_path().exists(), "the log should have rotated");
        assert!(records.len() < 1600, "only one rotated generation is kept");
        let hosts: std::collections::HashSet<String> = records
            .iter()
            .filter_map(|r| match &r.event {
                Event::Net(n) => Some(n.host.clone()),
                _ => None,
            })
            .collect();
        for t in 0..8 {
            let last = format!("final{t}.example.org");
            assert!(hosts.contains(&last), "{last} was lost in rotation");
        }
        let cur = fs::metadata(log.path()).unwrap().len();
        assert!(
            cur <= 64 * 1024,
            "current file {cur} bytes exceeds the rotation size"
        );
    }

    #[test]
    fn a_link_planted_at_the_log_or_its_lock_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "precious\n").unwrap();
        for name in ["audit.jsonl", "audit.jsonl.lock"] {
            let sub = dir.path().join(name.replace('.', "-"));
            fs::create_dir(&sub).unwrap();
            std::os::unix::fs::symlink(&victim, sub.join(name)).unwrap();
            let log = AuditLog::at(sub.join("audit.jsonl"));
            assert!(
                log.write(&Record::now("j", net("x.org", Decision::Allow)))
                    .is_err()
            );
        }
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
    }

    #[test]
    fn project_key_separates_same_names() {
        let a = project_key(Path::new("/home/u/a/app"));
        let b = project_key(Path::new("/home/u/b/app"));
        assert!(a.starts_with("app-") && b.starts_with("app-"));
        assert_ne!(a, b);
    }
}
