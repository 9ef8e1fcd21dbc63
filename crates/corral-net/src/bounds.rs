//! What a jail can make corral spend, bounded, and said out loud when a bound is hit.
//!
//! - Descriptors: [`raise_nofile_limit`] lifts corral's own soft `RLIMIT_NOFILE` to the hard
//!   limit at start (the jail's command gets the original back: [`original_nofile_soft`]).
//!   When descriptors still run out, an [`Acceptor`] refuses new connections at once (`503` on
//!   the proxy's listener) instead of leaving them in the backlog forever. It holds a few spare
//!   descriptors for this: after each accept it takes back the spares it is missing, and when
//!   it cannot (the process is at its limit) it refuses the connection just accepted; when
//!   accept itself fails for want of a descriptor, it closes one spare, accepts, refuses and
//!   closes. Keeping several spares, and refusing while any is missing, means another thread
//!   that takes the descriptor a spare freed cannot leave the listener without one.
//! - Stderr: a condition that can repeat as fast as the jail can cause it is reported through a
//!   [`Notice`], at most one line per [`NOTICE_INTERVAL`], with how often it happened.
//! - Head buffers: a [`Budget`] bounds the bytes of partial request heads the proxy holds
//!   across all of a jail's connections.
//! - The audit log: each connection refused before any decision is counted in [`Refusals`],
//!   written as one `refused` record per listener and reason per [`RECORD_INTERVAL`] (and at
//!   shutdown: none is lost), with the totals for the run's `exit` record.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

/// At most one stderr line per condition in this interval.
pub const NOTICE_INTERVAL: Duration = Duration::from_secs(10);

/// A repeating condition, reported on stderr at most once per [`NOTICE_INTERVAL`].
#[derive(Debug, Default)]
pub struct Notice {
    state: Mutex<NoticeState>,
    total: AtomicU64,
}

#[derive(Debug, Default)]
struct NoticeState {
    last_line: Option<Instant>,
    /// Occurrences since the last line.
    pending: u64,
}

impl Notice {
    pub fn new() -> Notice {
        Notice::default()
    }

    /// Count one occurrence. When no line was printed in the last interval, print
    /// `line(n)`, `n` being the occurrences since the last line (this one included).
    pub fn hit(&self, line: impl FnOnce(u64) -> String) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.pending += 1;
        let due = st.last_line.is_none_or(|t| t.elapsed() >= NOTICE_INTERVAL);
        if due {
            let n = std::mem::take(&mut st.pending);
            st.last_line = Some(Instant::now());
            drop(st);
            eprintln!("{}", line(n));
        }
    }

    /// Occurrences so far.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// At most one `refused` record per listener and reason in this interval.
pub const RECORD_INTERVAL: Duration = Duration::from_secs(1);

/// Why a connection was refused before any decision (the `rule` of its `refused` record).
pub mod reason {
    /// The process had no descriptor for it (accept, or the connection to the destination).
    pub const DESCRIPTORS: &str = "corral was out of file descriptors";
    /// The jail's connections were at `ProxyConfig::max_connections`.
    pub const CONNECTIONS: &str = "the jail's connection limit was reached";
    /// The jail's partial request heads were at the proxy's buffer budget.
    pub const HEADS: &str = "the jail's partial request heads passed the buffer budget";
    /// The run was ending: the proxy took no new connection.
    pub const ENDING: &str = "the run was ending";
}

/// Connections refused before any decision, counted into the audit log: a flood of them is
/// one `refused` record per listener and reason per [`RECORD_INTERVAL`] ([`Refusals::run`]),
/// and [`Refusals::flush`] writes what is pending (at shutdown). A record that cannot be written
/// stays pending and is tried again; the log counts the failure.
pub struct Refusals {
    audit: corral_audit::AuditLog,
    jail: String,
    /// (listener, reason) -> counts. Both come from corral (listener names, [`reason`]), not
    /// from the jail: the map stays small.
    counts: Mutex<BTreeMap<(String, &'static str), Counted>>,
}

#[derive(Default)]
struct Counted {
    pending: u64,
    total: u64,
}

impl Refusals {
    pub fn new(audit: corral_audit::AuditLog, jail: impl Into<String>) -> Refusals {
        Refusals {
            audit,
            jail: jail.into(),
            counts: Mutex::new(BTreeMap::new()),
        }
    }

    /// Count one connection to `listener` refused for `reason`.
    pub fn hit(&self, listener: &str, reason: &'static str) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let c = counts.entry((listener.to_string(), reason)).or_default();
        c.pending += 1;
        c.total += 1;
    }

    /// Write one `refused` record for each listener and reason with refusals not yet recorded.
    pub fn flush(&self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        for ((listener, reason), c) in counts.iter_mut().filter(|(_, c)| c.pending > 0) {
            let ev = corral_audit::NetEvent {
                phase: corral_audit::NetPhase::Refused,
                host: listener.clone(),
                decision: Some(corral_audit::Decision::Deny),
                rule: (*reason).to_string(),
                count: c.pending,
                ..Default::default()
            };
            let record = corral_audit::Record::now(&self.jail, corral_audit::Event::Net(ev));
            if self.audit.write(&record).is_ok() {
                c.pending = 0;
            }
        }
    }

    /// Refusals so far, by reason (the `exit` record's `refused`).
    pub fn totals(&self) -> BTreeMap<String, u64> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = BTreeMap::new();
        for ((_, reason), c) in counts.iter() {
            *out.entry((*reason).to_string()).or_insert(0) += c.total;
        }
        out
    }

    /// Flush every [`RECORD_INTERVAL`] until the last other holder of `this` is gone.
    pub async fn run(this: std::sync::Weak<Refusals>) {
        let mut tick = tokio::time::interval(RECORD_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match this.upgrade() {
                Some(r) => r.flush(),
                None => return,
            }
        }
    }
}

/// Whether `e` says this process (EMFILE) or the system (ENFILE) is out of descriptors.
pub fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// The soft `RLIMIT_NOFILE` this process started with, before [`raise_nofile_limit`].
static ORIGINAL_SOFT: AtomicU64 = AtomicU64::new(0);

/// Raise this process's soft `RLIMIT_NOFILE` to its hard limit (every tunnel holds two
/// descriptors; the common soft limit of 1,024 is 500 tunnels). Returns the soft limit the
/// process had before its first call, also kept for [`original_nofile_soft`]; a second call
/// changes nothing.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct, which we provide.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let original =
        match ORIGINAL_SOFT.compare_exchange(0, lim.rlim_cur, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => lim.rlim_cur,
            Err(first) => first,
        };
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit reads one rlimit struct, which we provide.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(original)
}

/// The soft `RLIMIT_NOFILE` to give back to the processes corral starts (the jail's command,
/// the executor): the one this process started with; `None` when it was never raised.
pub fn original_nofile_soft() -> Option<u64> {
    match ORIGINAL_SOFT.load(Ordering::Relaxed) {
        0 => None,
        n => Some(n),
    }
}

/// Spare descriptors an [`Acceptor`] holds.
const SPARES: usize = 8;

/// Descriptors held in reserve (`/dev/null`), closed one at a time when the process is out of
/// descriptors so that a waiting connection can be accepted and refused.
#[derive(Debug)]
struct Spare(Vec<std::fs::File>);

impl Spare {
    fn new() -> Spare {
        let mut s = Spare(Vec::with_capacity(SPARES));
        s.refill();
        s
    }

    fn release(&mut self) -> bool {
        self.0.pop().is_some()
    }

    /// Take back the missing spares; `false` when the process is at its descriptor limit.
    fn refill(&mut self) -> bool {
        while self.0.len() < SPARES {
            match std::fs::File::open("/dev/null") {
                Ok(f) => self.0.push(f),
                Err(_) => return false,
            }
        }
        true
    }
}

/// A TCP listener that stays up when descriptors run out: each connection it cannot serve is
/// accepted with the spare descriptor, sent `refusal` (nothing for a raw TCP port) and closed.
pub struct Acceptor<'a> {
    listener: tokio::net::TcpListener,
    what: String,
    spare: Spare,
    refusal: &'static [u8],
    notice: &'a Notice,
    errors: Notice,
    refusals: Option<Arc<Refusals>>,
}

/// What the proxy's listener answers a connection it has no descriptor for.
pub const REFUSED_503: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 55\r\nConnection: close\r\nX-Corral-Proxy: 1\r\n\r\ncorral proxy: out of file descriptors; try again later\n";

impl<'a> Acceptor<'a> {
    /// `what` names the listener in stderr lines; `notice` counts refused connections.
    pub fn new(
        listener: std::net::TcpListener,
        what: impl Into<String>,
        refusal: &'static [u8],
        notice: &'a Notice,
    ) -> io::Result<Acceptor<'a>> {
        Ok(Acceptor {
            listener: crate::forward::to_tokio(listener)?,
            what: what.into(),
            spare: Spare::new(),
            refusal,
            notice,
            errors: Notice::new(),
            refusals: None,
        })
    }

    /// Count each refused connection into `refusals` (the audit log's `refused` records).
    pub fn recorded(mut self, refusals: Arc<Refusals>) -> Acceptor<'a> {
        self.refusals = Some(refusals);
        self
    }

    /// The next connection corral can serve.
    pub async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            let e = match self.listener.accept().await {
                Ok((conn, peer)) => {
                    if self.spare.refill() {
                        return (conn, peer);
                    }
                    // At the limit: this connection is refused, which frees its descriptor.
                    self.refuse(conn);
                    self.spare.refill();
                    continue;
                }
                Err(e) => e,
            };
            if out_of_descriptors(&e) {
                self.refuse_waiting().await;
                continue;
            }
            // A connection reset while queued, and the like: retried, said once in a while.
            let what = &self.what;
            self.errors
                .hit(|n| format!("corral: {what}: accept: {e} ({n} in the last 10 s)"));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Answer `conn` with the refusal and close it; counted and said (once per interval).
    fn refuse(&self, conn: TcpStream) {
        if !self.refusal.is_empty() {
            let _ = conn.try_write(self.refusal);
        }
        drop(conn);
        let what = &self.what;
        if let Some(r) = &self.refusals {
            r.hit(what, reason::DESCRIPTORS);
        }
        self.notice.hit(|n| {
            format!(
                "corral: out of file descriptors: {n} connection(s) to {what} refused in the last 10 s"
            )
        });
    }

    /// Accept failed for want of a descriptor: refuse the waiting connection with a spare one.
    async fn refuse_waiting(&mut self) {
        if !self.spare.release() {
            // No spare left: wait for a descriptor to close.
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.spare.refill();
            return;
        }
        if let Ok(Ok((conn, _))) =
            tokio::time::timeout(Duration::from_millis(100), self.listener.accept()).await
        {
            self.refuse(conn);
        }
        self.spare.refill();
    }
}

pub use corral_http1::io::Budget;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_prints_once_per_interval_and_counts_every_hit() {
        let n = Notice::new();
        let mut lines = Vec::new();
        for _ in 0..1000 {
            n.hit(|k| {
                lines.push(k);
                String::new()
            });
        }
        assert_eq!(lines, vec![1], "one line for a burst");
        assert_eq!(n.total(), 1000);
    }

    #[test]
    fn the_refusal_is_one_complete_response() {
        let end = crate::http::find_head_end(REFUSED_503).unwrap().unwrap();
        let head = crate::http::parse_response_head(&REFUSED_503[..end]).unwrap();
        assert_eq!(head.status, 503);
        assert_eq!(
            crate::http::response_framing(&head, "GET").unwrap(),
            crate::http::Framing::Length((REFUSED_503.len() - end) as u64)
        );
    }

    /// A flood is one record per listener and reason with its count; nothing is written twice,
    /// and what could not be written stays pending until it can.
    #[test]
    fn refusals_are_counted_into_one_record_per_listener_and_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = corral_audit::AuditLog::at(&path);
        let r = Refusals::new(log.clone(), "j");
        for _ in 0..500 {
            r.hit("the proxy", reason::DESCRIPTORS);
        }
        r.hit("the proxy", reason::CONNECTIONS);
        r.hit("stub capture on port 443", reason::DESCRIPTORS);
        r.flush();
        r.flush();
        let records = |log: &corral_audit::AuditLog| -> Vec<(String, String, u64)> {
            let (all, bad) = log.read_all().unwrap();
            assert_eq!(bad, 0);
            all.into_iter()
                .filter_map(|rec| match rec.event {
                    corral_audit::Event::Net(n) if n.phase == corral_audit::NetPhase::Refused => {
                        Some((n.host, n.rule, n.count))
                    }
                    _ => None,
                })
                .collect()
        };
        let d = reason::DESCRIPTORS.to_string();
        assert_eq!(
            records(&log),
            vec![
                ("stub capture on port 443".into(), d.clone(), 1),
                ("the proxy".into(), d.clone(), 500),
                ("the proxy".into(), reason::CONNECTIONS.into(), 1),
            ]
        );
        // The log cannot be written: the next refusal stays pending, and is written once it can.
        std::fs::rename(&path, dir.path().join("moved.jsonl")).unwrap();
        std::fs::create_dir(&path).unwrap();
        r.hit("the proxy", reason::DESCRIPTORS);
        r.flush();
        std::fs::remove_dir(&path).unwrap();
        r.flush();
        let last = records(&corral_audit::AuditLog::at(&path));
        assert_eq!(last, vec![("the proxy".into(), d.clone(), 1)]);
        assert_eq!(
            r.totals(),
            BTreeMap::from([(d, 502), (reason::CONNECTIONS.to_string(), 1)])
        );
    }

    #[test]
    fn a_budget_never_passes_its_limit() {
        let b = Budget::new(100);
        assert!(b.take(60));
        assert!(!b.take(41));
        assert!(b.take(40));
        assert_eq!(b.used(), 100);
        b.give(60);
        assert!(b.take(60));
        assert!(!b.take(1));
    }
}
