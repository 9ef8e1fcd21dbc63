//! corral's one audit writer and reader.
//!
//! Every run has a jail id; every network decision, executor command and lifecycle event of a run
//! is one JSON line in the project's log under `$XDG_STATE_HOME/corral/` (default
//! `~/.local/state/corral/`). Writers in several processes append to the same file: each record is
//! written with a single `write(2)` on an `O_APPEND` descriptor while holding an exclusive `flock`
//! on `audit.jsonl.lock`, so lines never interleave. When the file passes `max_bytes` it is renamed
//! to `audit.jsonl.1` (one generation kept) under the same lock.
//!
//! A writer keeps both files open between records (reopened when the log was rotated or
//! replaced), so a process that has run out of descriptors still records. A record that cannot
//! be written is an error for the caller (who refuses what it would have recorded) and is
//! counted: [`AuditLog::failures`].

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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

/// What a [`NetEvent`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetPhase {
    /// The proxy (or the DNS stub, the capture, a bridge) decided.
    #[default]
    Decision,
    /// The connection ended: bytes and duration.
    Close,
    /// The credential gateway handled a request to a secret's host.
    Gateway,
    /// The proxy holds a connection the allow list does not name while `corral watch` asks
    /// (`network.on_deny = "ask"`); its decision record follows.
    Ask,
    /// Connections refused before any decision (corral out of file descriptors, the jail's
    /// connection or head budget spent): one record per listener and reason per interval,
    /// `count` of them; the run's `exit` record has the totals.
    Refused,
}

/// One network decision or closed connection (SPEC section 5).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NetEvent {
    pub phase: NetPhase,
    pub client: String,
    /// `CONNECT`, `GET`, ..., or `SOCKS5`.
    pub method: String,
    pub host: String,
    pub port: u16,
    /// The request's path (normalised when it could be), for a request decided by method
    /// and path (`network.allow = ["GET host/path/**"]`). Absent in older logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
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
    /// A `refused` record: how many connections it counts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub count: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What an [`ExecEvent`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecPhase {
    /// The command is about to run (written before it starts: a command whose start cannot be
    /// recorded is refused).
    Start,
    /// The command ended, or was refused. Not written out (`phase` is absent), as in every log
    /// before start records existed.
    #[default]
    End,
}

impl ExecPhase {
    fn is_end(&self) -> bool {
        *self == ExecPhase::End
    }
}

/// One executor command.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ExecEvent {
    #[serde(default, skip_serializing_if = "ExecPhase::is_end")]
    pub phase: ExecPhase,
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

/// A jail lifecycle event, one variant per event a run records; on disk the variant's name is
/// the `event` field (`start`, `exit`, `policy-reload-failed`, ...) and its fields sit beside it.
///
/// A `detail` that is a [`serde_json::Value`] holds the JSON of a type another crate owns (the
/// Plan, the change list, the cgroup counters, ...): stored as written, so a log stays readable
/// when those types change. The writer serialises its own type into it; readers that need its
/// fields deserialise it back into that type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum JailEvent {
    /// The jail is about to start. Native runs: the Plan itself; container runs:
    /// `{"engine": "podman", "plan": PLAN}`.
    Start {
        #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
        detail: serde_json::Value,
    },
    /// The jail could not start (`exit_code` 125); the error.
    Error { exit_code: i32, detail: String },
    /// The jail's command ended with `exit_code`. `refused`: connections the run refused before
    /// any decision, by reason (the totals of its `refused` records); absent when none was.
    Exit {
        exit_code: i32,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        refused: BTreeMap<String, u64>,
    },
    /// What the run planted was moved aside or disarmed after the run (the git check); the
    /// line printed about it.
    Quarantine { detail: String },
    /// A hidden file the host replaced during the run, which the jail could then read; the
    /// line printed about it.
    Exposed { detail: String },
    /// The memory limit was hit: the cgroup's counters.
    Oom {
        #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
        detail: serde_json::Value,
    },
    /// The process limit was hit: the cgroup's counters.
    Pids {
        #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
        detail: serde_json::Value,
    },
    /// The terminal filter dropped output: what it dropped.
    Terminal {
        #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
        detail: serde_json::Value,
    },
    /// What the run changed in the project.
    Changes {
        #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
        detail: serde_json::Value,
    },
    /// Set-id files that appeared where the jail can write.
    Setid {
        #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
        detail: serde_json::Value,
    },
    /// The standalone proxy reloaded its policy file.
    PolicyReload { detail: PolicyReload },
    /// The standalone proxy could not reload its policy file and kept the previous rules.
    PolicyReloadFailed { detail: PolicyReload },
    /// A running native jail applied its changed policy files (`corral allow`/`deny`, an edit,
    /// `corral watch`): what each list gained and lost, from which files.
    LivePolicy { detail: LiveDetail },
    /// A changed project policy grants what the user has not trusted: the jail kept its rules.
    LivePolicyRefused { detail: LiveDetail },
    /// The changed policy files could not be read or resolved: the jail kept its rules.
    LivePolicyFailed { detail: LiveDetail },
    /// `corral watch` allowed a destination for the rest of this run.
    LiveAllow { detail: LiveDetail },
    /// An event this version does not know (written by another version of corral).
    #[serde(other)]
    Unknown,
}

/// What a running jail's policy change did: the one-line summary `corral log` shows, and the
/// event's own fields (lists added/removed, files, grants, ...) as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveDetail {
    pub summary: String,
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// A policy reload of the standalone proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyReload {
    /// Why the reload failed. (The fields are in the order earlier versions wrote them.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub file: PathBuf,
    /// `SIGHUP` or `file change`.
    pub trigger: String,
}

impl JailEvent {
    /// The event's name, as in the log's `event` field.
    pub fn name(&self) -> &'static str {
        match self {
            JailEvent::Start { .. } => "start",
            JailEvent::Error { .. } => "error",
            JailEvent::Exit { .. } => "exit",
            JailEvent::Quarantine { .. } => "quarantine",
            JailEvent::Exposed { .. } => "exposed",
            JailEvent::Oom { .. } => "oom",
            JailEvent::Pids { .. } => "pids",
            JailEvent::Terminal { .. } => "terminal",
            JailEvent::Changes { .. } => "changes",
            JailEvent::Setid { .. } => "setid",
            JailEvent::PolicyReload { .. } => "policy-reload",
            JailEvent::PolicyReloadFailed { .. } => "policy-reload-failed",
            JailEvent::LivePolicy { .. } => "live-policy",
            JailEvent::LivePolicyRefused { .. } => "live-policy-refused",
            JailEvent::LivePolicyFailed { .. } => "live-policy-failed",
            JailEvent::LiveAllow { .. } => "live-allow",
            JailEvent::Unknown => "unknown",
        }
    }

    /// The exit code it carries (`exit`, `error`).
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            JailEvent::Error { exit_code, .. } | JailEvent::Exit { exit_code, .. } => {
                Some(*exit_code)
            }
            _ => None,
        }
    }

    /// What `corral log` shows in its RULE column: the exit code, or why a reload failed.
    pub fn summary(&self) -> String {
        match self {
            JailEvent::Exit { exit_code, refused } if !refused.is_empty() => {
                let total: u64 = refused.values().sum();
                format!("exit {exit_code}; {total} connection(s) refused before a decision")
            }
            JailEvent::Exit { exit_code, .. } | JailEvent::Error { exit_code, .. } => {
                format!("exit {exit_code}")
            }
            JailEvent::PolicyReloadFailed { detail } => detail.error.clone().unwrap_or_default(),
            JailEvent::LivePolicy { detail }
            | JailEvent::LivePolicyRefused { detail }
            | JailEvent::LivePolicyFailed { detail }
            | JailEvent::LiveAllow { detail } => detail.summary.clone(),
            JailEvent::Start { .. }
            | JailEvent::Quarantine { .. }
            | JailEvent::Exposed { .. }
            | JailEvent::PolicyReload { .. }
            | JailEvent::Oom { .. }
            | JailEvent::Pids { .. }
            | JailEvent::Terminal { .. }
            | JailEvent::Changes { .. }
            | JailEvent::Setid { .. }
            | JailEvent::Unknown => String::new(),
        }
    }
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
    let xdg = std::env::var("XDG_STATE_HOME").ok();
    let home = std::env::var_os("HOME").filter(|d| !d.is_empty());
    state_dir_in(xdg.as_deref(), home.as_deref().map(Path::new)).ok_or(AuditError::NoStateDir)
}

/// The one rule for corral's state directory, given the value of `XDG_STATE_HOME` and the
/// home directory: `$XDG_STATE_HOME/corral` when it is an absolute path (the XDG rule: a
/// relative one is ignored), else `HOME/.local/state/corral`; none without either.
pub fn state_dir_in(xdg_state_home: Option<&str>, home: Option<&Path>) -> Option<PathBuf> {
    match (xdg_state_home, home) {
        (Some(x), _) if x.starts_with('/') => Some(PathBuf::from(x).join("corral")),
        (_, Some(home)) => Some(home.join(".local/state/corral")),
        (_, None) => None,
    }
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

/// `s` made safe to print in a terminal line (`corral log`, the end-of-run summary): what the
/// jail chose (a host, a rule quoting it, a command) cannot move the cursor, forge a row, or
/// look like another name. Escaped: control characters (`\n`, `\u{1b}`), backslashes (so an
/// escape cannot be faked), invisible and format characters (soft hyphen, zero-width
/// characters, bidirectional controls, BOM, tags, variation selectors: `\u{200b}`), line and
/// paragraph separators, whitespace other than the space, and dots that read as `.`
/// (fullwidth, ideographic, halfwidth ideographic).
pub fn printable(s: &str) -> String {
    if !s.chars().any(needs_escape) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.extend(c.escape_default()),
            c if needs_escape(c) => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    out
}

/// Whether [`printable`] escapes `c`.
fn needs_escape(c: char) -> bool {
    const INVISIBLE: &[(u32, u32)] = &[
        (0x00AD, 0x00AD),   // soft hyphen
        (0x034F, 0x034F),   // combining grapheme joiner
        (0x0600, 0x0605),   // Arabic number signs (Cf)
        (0x061C, 0x061C),   // Arabic letter mark
        (0x06DD, 0x06DD),   // Arabic end of ayah
        (0x070F, 0x070F),   // Syriac abbreviation mark
        (0x0890, 0x0891),   // Arabic pound/piastre mark above
        (0x08E2, 0x08E2),   // Arabic disputed end of ayah
        (0x115F, 0x1160),   // Hangul fillers
        (0x17B4, 0x17B5),   // Khmer inherent vowels
        (0x180B, 0x180F),   // Mongolian variation selectors, vowel separator
        (0x200B, 0x200F),   // zero-width space/non-joiner/joiner, LRM, RLM
        (0x2028, 0x2029),   // line and paragraph separators
        (0x202A, 0x202E),   // bidirectional embeddings and overrides
        (0x2060, 0x206F),   // word joiner, invisible operators, bidi isolates, deprecated
        (0x3002, 0x3002),   // ideographic full stop
        (0x3164, 0x3164),   // Hangul filler
        (0xFE00, 0xFE0F),   // variation selectors
        (0xFEFF, 0xFEFF),   // BOM, zero-width no-break space
        (0xFF0E, 0xFF0E),   // fullwidth full stop
        (0xFF61, 0xFF61),   // halfwidth ideographic full stop
        (0xFFA0, 0xFFA0),   // halfwidth Hangul filler
        (0xFFF9, 0xFFFB),   // interlinear annotation
        (0x110BD, 0x110BD), // Kaithi number sign
        (0x110CD, 0x110CD), // Kaithi number sign above
        (0x13430, 0x1343F), // Egyptian hieroglyph format controls
        (0x1BCA0, 0x1BCA3), // shorthand format controls
        (0x1D173, 0x1D17A), // musical symbol format controls
        (0xE0000, 0xE0FFF), // tags, variation selectors supplement
    ];
    let n = u32::from(c);
    c == '\\'
        || c.is_control()
        || (c.is_whitespace() && c != ' ')
        || INVISIBLE.iter().any(|(lo, hi)| (*lo..=*hi).contains(&n))
}

/// A project's audit log. Clones share the open files and the failure count.
#[derive(Debug, Clone)]
pub struct AuditLog {
    path: PathBuf,
    max_bytes: u64,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// The lock file and the log, open between records; `None` until the first record and
    /// after a failed one (the next record opens them again).
    held: Mutex<Option<OpenLog>>,
    failures: AtomicU64,
    /// Why the last record could not be written.
    last_failure: Mutex<Option<String>>,
}

/// The audit log's lock file and the log itself, open between records.
#[derive(Debug)]
struct OpenLog {
    lock: File,
    log: File,
}

/// Records that could not be written, and the last reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteFailures {
    pub count: u64,
    pub reason: String,
}

/// How [`WriteFailures::summary_line`] reads around the count and the reason.
const FAILURES_HEAD: &str = "corral: ";
const FAILURES_MID: &str = " audit record(s) could not be written (";
const FAILURES_TAIL: &str =
    "); every request and command that could not be recorded before it ran was refused";

impl WriteFailures {
    /// The end-of-run line.
    pub fn summary_line(&self) -> String {
        format!(
            "{FAILURES_HEAD}{}{FAILURES_MID}{}{FAILURES_TAIL}",
            self.count, self.reason
        )
    }

    /// The failures a [`WriteFailures::summary_line`] reports (another process's: the
    /// executor's server prints it when it stops, and `corral run` adds it to its own).
    pub fn parse_summary_line(line: &str) -> Option<Self> {
        let rest = line.strip_prefix(FAILURES_HEAD)?;
        let (count, rest) = rest.split_once(FAILURES_MID)?;
        let reason = rest.strip_suffix(FAILURES_TAIL)?;
        Some(Self {
            count: count.parse().ok().filter(|n| *n > 0)?,
            reason: reason.to_string(),
        })
    }
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
            shared: Arc::default(),
        }
    }

    /// How many records could not be written so far (by this log and its clones), and why the
    /// last one failed; `None` when every record was written.
    pub fn failures(&self) -> Option<WriteFailures> {
        let count = self.shared.failures.load(Ordering::Relaxed);
        if count == 0 {
            return None;
        }
        let reason = self
            .shared
            .last_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_default();
        Some(WriteFailures { count, reason })
    }

    /// Count `failures` another process's writer reported for this log (the executor's server,
    /// [`WriteFailures::parse_summary_line`]), so [`AuditLog::failures`] gives the run's total.
    pub fn add_failures(&self, failures: &WriteFailures) {
        if failures.count == 0 {
            return;
        }
        self.shared
            .failures
            .fetch_add(failures.count, Ordering::Relaxed);
        let mut last = self
            .shared
            .last_failure
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if last.is_none() {
            *last = Some(failures.reason.clone());
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

    /// Append one record. Safe against concurrent writers in other processes. A failure is
    /// counted ([`AuditLog::failures`]); the caller must not go on as if it was recorded.
    pub fn write(&self, record: &Record) -> Result<(), AuditError> {
        let written = self.write_line(record);
        if let Err(e) = &written {
            self.shared.failures.fetch_add(1, Ordering::Relaxed);
            let why = match e {
                AuditError::Io { source, .. } => source.to_string(),
                other => other.to_string(),
            };
            *self
                .shared
                .last_failure
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(why);
        }
        written
    }

    fn write_line(&self, record: &Record) -> Result<(), AuditError> {
        let mut line = serde_json::to_vec(record).map_err(|e| self.io_err(e.into()))?;
        line.push(b'\n');
        if self.path == Path::new("-") {
            let mut out = io::stdout().lock();
            return out
                .write_all(&line)
                .and_then(|()| out.flush())
                .map_err(|e| self.io_err(e));
        }
        // The mutex orders this process's writers (a flock does not: it belongs to the open
        // file, which they share); the flock orders the processes.
        let mut held = self.shared.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.is_none() {
            *held = Some(self.open_held()?);
        }
        let Some(h) = held.as_mut() else {
            unreachable!("opened just above")
        };
        lock(&h.lock, libc::LOCK_EX).map_err(|e| self.io_err(e))?;
        let written = self.append_locked(h, &line);
        let _ = lock(&h.lock, libc::LOCK_UN);
        if written.is_err() {
            *held = None;
        }
        written
    }

    fn open_held(&self) -> Result<OpenLog, AuditError> {
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir).map_err(|e| self.io_err(e))?;
        }
        // One lock file that is never renamed serialises every writer, so rotation (a rename
        // of the log itself) cannot race another writer holding the old inode.
        let lock = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.lock_path())
            .map_err(|e| self.io_err(e))?;
        Ok(OpenLog {
            lock,
            log: self.open_append()?,
        })
    }

    /// Under the lock: follow a rotation (or a replacement) of the path, rotate if this line
    /// would pass `max_bytes`, append the line with one write.
    fn append_locked(&self, h: &mut OpenLog, line: &[u8]) -> Result<(), AuditError> {
        let mut open = h.log.metadata().map_err(|e| self.io_err(e))?;
        let same = fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.dev() == open.dev() && m.ino() == open.ino());
        if !same {
            h.log = self.open_append()?;
            open = h.log.metadata().map_err(|e| self.io_err(e))?;
        }
        // Under the lock, so no other writer changed the length since `open` was read.
        let len = open.len();
        if len > 0 && len + line.len() as u64 > self.max_bytes {
            let old = open;
            fs::rename(&self.path, self.rotated_path()).map_err(|e| self.io_err(e))?;
            h.log = self.open_append()?;
            // The new generation keeps the old one's group and mode, so writers of another user
            // that share the log (the proxy container's, corral-engine) can still append.
            use std::os::unix::fs::PermissionsExt;
            let _ = std::os::unix::fs::fchown(&h.log, None, Some(old.gid()));
            let _ = h
                .log
                .set_permissions(fs::Permissions::from_mode(old.mode() & 0o660));
        }
        h.log.write_all(line).map_err(|e| self.io_err(e))
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

/// `flock(file, op)` (`LOCK_EX` or `LOCK_UN`), retried on EINTR.
fn lock(file: &File, op: libc::c_int) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: flock on a descriptor we own; a lock still held is released when the File is
        // dropped.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
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

    #[test]
    fn the_state_directory_follows_an_absolute_xdg_state_home_else_the_home() {
        let home = Some(Path::new("/home/u"));
        let cases = [
            (Some("/x/state"), home, Some("/x/state/corral")),
            (Some("/x/state"), None, Some("/x/state/corral")),
            (
                Some("relative/state"),
                home,
                Some("/home/u/.local/state/corral"),
            ),
            (Some(""), home, Some("/home/u/.local/state/corral")),
            (None, home, Some("/home/u/.local/state/corral")),
            (Some("relative"), None, None),
            (None, None, None),
        ];
        for (xdg, home, want) in cases {
            assert_eq!(
                state_dir_in(xdg, home),
                want.map(PathBuf::from),
                "XDG_STATE_HOME={xdg:?} HOME={home:?}"
            );
        }
    }

    fn net(host: &str, decision: Decision) -> Event {
        Event::Net(NetEvent {
            phase: NetPhase::Decision,
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

    /// Two writers that each hold the log open (two processes, say): a rotation by one is
    /// followed by the other, which never appends to the renamed generation.
    #[test]
    fn a_held_log_follows_a_rotation_by_another_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let a = AuditLog::at(&path).with_max_bytes(4096);
        let b = AuditLog::at(&path).with_max_bytes(4096);
        b.write(&Record::now("b", net("first.b", Decision::Allow)))
            .unwrap();
        for i in 0..40 {
            a.write(&Record::now("a", net(&format!("h{i}.a"), Decision::Allow)))
                .unwrap();
        }
        assert!(a.rotated_path().exists());
        b.write(&Record::now("b", net("after.b", Decision::Allow)))
            .unwrap();
        let current = fs::read_to_string(&path).unwrap();
        assert!(current.contains("after.b"), "{current}");
        assert!(
            !fs::read_to_string(a.rotated_path())
                .unwrap()
                .contains("after.b")
        );
        assert_eq!((a.failures(), b.failures()), (None, None));
    }

    /// A record that cannot be written is an error for the caller and is counted, with the
    /// reason, across clones; once the log is writable again, records are written.
    #[test]
    fn a_record_that_cannot_be_written_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::at(&path);
        let clone = log.clone();
        log.write(&Record::now("j", net("ok.org", Decision::Allow)))
            .unwrap();
        // The log replaced by a directory while the writer holds the old file open.
        fs::rename(&path, dir.path().join("moved")).unwrap();
        fs::create_dir(&path).unwrap();
        for _ in 0..3 {
            assert!(
                clone
                    .write(&Record::now("j", net("lost.org", Decision::Allow)))
                    .is_err()
            );
        }
        let f = log.failures().unwrap();
        assert_eq!(f.count, 3);
        assert!(f.reason.contains("directory"), "{f:?}");
        assert!(
            f.summary_line()
                .starts_with("corral: 3 audit record(s) could not be written (")
        );
        assert!(
            !fs::read_to_string(dir.path().join("moved"))
                .unwrap()
                .contains("lost.org")
        );
        fs::remove_dir(&path).unwrap();
        log.write(&Record::now("j", net("back.org", Decision::Allow)))
            .unwrap();
        assert!(fs::read_to_string(&path).unwrap().contains("back.org"));
    }

    /// Lines written by corral before the events were typed (main's writers: the real binary's
    /// `corral run`, and each writer's record built as it built it): each reads into a typed
    /// event, none as unknown, and writes back byte for byte. Every event kind is among them.
    #[test]
    fn logs_written_before_the_typed_events_read_and_write_back_unchanged() {
        let text = include_str!("../tests/fixtures/audit-before-typed-events.jsonl");
        let mut jail_events = std::collections::BTreeSet::new();
        let mut phases = std::collections::BTreeSet::new();
        for line in text.lines() {
            let r: Record = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            match &r.event {
                Event::Jail(JailEvent::Unknown) => panic!("read as unknown: {line}"),
                Event::Jail(j) => {
                    jail_events.insert(j.name());
                }
                Event::Net(n) => {
                    phases.insert(format!("{:?}", n.phase));
                }
                Event::Exec(e) => assert_eq!(e.phase, ExecPhase::End, "{line}"),
            }
            assert_eq!(serde_json::to_string(&r).unwrap(), line);
        }
        let all = [
            "start",
            "error",
            "exit",
            "quarantine",
            "oom",
            "pids",
            "terminal",
            "changes",
            "setid",
            "policy-reload",
            "policy-reload-failed",
        ];
        assert_eq!(jail_events, all.into_iter().collect());
        assert_eq!(phases.len(), 3, "{phases:?}");
    }

    /// An event a later corral writes still reads (as unknown), and `corral log` shows its row.
    #[test]
    fn an_event_of_another_version_reads_as_unknown() {
        let line = r#"{"time":"2026-12-01T10:00:00.000Z","jail":"j","kind":"jail","event":"hibernate","detail":{"x":1}}"#;
        let r: Record = serde_json::from_str(line).unwrap();
        assert_eq!(r.event, Event::Jail(JailEvent::Unknown));
        // A known event with a field of the wrong type is a bad line, not a guess.
        let bad = r#"{"time":"t","jail":"j","kind":"jail","event":"exit","exit_code":"zero"}"#;
        assert!(serde_json::from_str::<Record>(bad).is_err());
    }

    /// A command's start record says so; its end record is written as before (no `phase`).
    #[test]
    fn exec_start_records_are_marked_and_end_records_unchanged() {
        let start = ExecEvent {
            phase: ExecPhase::Start,
            command: vec!["true".into()],
            cwd: "/p".into(),
            decision: Some(Decision::Allow),
            ..ExecEvent::default()
        };
        let v = serde_json::to_value(Event::Exec(start.clone())).unwrap();
        assert_eq!(v["phase"], "start");
        let end = ExecEvent {
            phase: ExecPhase::End,
            exit_code: Some(0),
            ..start
        };
        let v = serde_json::to_value(Event::Exec(end)).unwrap();
        assert!(v.get("phase").is_none(), "{v}");
    }

    /// Another process's summary line parses back, and adds to this log's count.
    #[test]
    fn failures_reported_by_another_process_add_to_the_count() {
        let theirs = WriteFailures {
            count: 2,
            reason: "Is a directory (os error 21); really".into(),
        };
        let line = theirs.summary_line();
        assert_eq!(
            WriteFailures::parse_summary_line(&line),
            Some(theirs.clone())
        );
        for not in [
            "",
            "corral: 0 audit record(s) could not be written (x); every request and command that could not be recorded before it ran was refused",
            "corral: the executor refused [\"rm\"]: no",
        ] {
            assert_eq!(WriteFailures::parse_summary_line(not), None, "{not}");
        }
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::at(dir.path().join("audit.jsonl"));
        log.add_failures(&theirs);
        assert_eq!(log.failures(), Some(theirs.clone()));
        log.add_failures(&WriteFailures {
            count: 1,
            reason: "other".into(),
        });
        assert_eq!(log.failures().unwrap().count, 3);
    }

    #[test]
    fn printable_escapes_control_invisible_and_lookalike_characters() {
        assert_eq!(printable("example.org"), "example.org");
        assert_eq!(printable("bücher.de ok"), "bücher.de ok");
        assert_eq!(printable("a\u{1b}[2J\nforged\r"), "a\\u{1b}[2J\\nforged\\r");
        for (raw, shown) in [
            ("git\u{ad}hub.com", "git\\u{ad}hub.com"),
            ("git\u{200b}hub.com", "git\\u{200b}hub.com"),
            ("\u{feff}github.com", "\\u{feff}github.com"),
            ("moc.buhtig\u{202e}", "moc.buhtig\\u{202e}"),
            ("github\u{ff0e}com", "github\\u{ff0e}com"),
            ("github\u{3002}com", "github\\u{3002}com"),
            ("github\u{ff61}com", "github\\u{ff61}com"),
            ("a\u{2028}b\u{a0}c", "a\\u{2028}b\\u{a0}c"),
            ("x\u{e0041}", "x\\u{e0041}"),
            // Every bidirectional control, zero-width character and C1 control.
            (
                "a\u{202a}\u{202b}\u{202c}\u{202d}b",
                "a\\u{202a}\\u{202b}\\u{202c}\\u{202d}b",
            ),
            (
                "a\u{2066}\u{2067}\u{2068}\u{2069}b",
                "a\\u{2066}\\u{2067}\\u{2068}\\u{2069}b",
            ),
            ("a\u{200e}\u{200f}b", "a\\u{200e}\\u{200f}b"),
            (
                "a\u{200c}\u{200d}\u{2060}b",
                "a\\u{200c}\\u{200d}\\u{2060}b",
            ),
            ("a\u{85}\u{9b}2J\u{7f}b", "a\\u{85}\\u{9b}2J\\u{7f}b"),
            ("a\u{0}\tb", "a\\u{0}\\tb"),
            // A literal backslash cannot pass for an escape.
            ("a\\u{200b}", "a\\\\u{200b}"),
        ] {
            assert_eq!(printable(raw), shown, "{raw:?}");
        }
    }

    #[test]
    fn project_key_separates_same_names() {
        let a = project_key(Path::new("/home/u/a/app"));
        let b = project_key(Path::new("/home/u/b/app"));
        assert!(a.starts_with("app-") && b.starts_with("app-"));
        assert_ne!(a, b);
    }
}
