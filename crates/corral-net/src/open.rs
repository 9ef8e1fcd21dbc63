//! The close records the proxy owes: every upstream connection it opened is registered here
//! ([`OpenConns::register`]) and its `close` record (bytes each way, duration) is written
//! exactly once, by whichever comes first: the connection's end ([`Owed::close`]), the drop of
//! the task that held it ([`Owed`]'s `Drop`), or the proxy's shutdown ([`OpenConns::shutdown`]),
//! which ends every connection still open and, past its deadline, writes the records of those
//! that have not ended yet from their shared byte counters. No tunnel leaves the run unrecorded.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use corral_audit::{AuditLog, Event, NetEvent, NetPhase, Record};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::proxy::Destination;

/// The `rule` of a close record written because the run ended, not the connection.
pub const ENDED_BY_SHUTDOWN: &str = "closed by corral: the proxy shut down";

/// The connections whose close record is owed.
pub(crate) struct OpenConns {
    audit: AuditLog,
    jail: String,
    state: Mutex<State>,
    /// Set once the proxy shuts down: the tasks between phases stop at it.
    stopping: tokio::sync::watch::Sender<bool>,
    /// Woken when the last open connection is recorded.
    empty: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    next: u64,
    open: HashMap<u64, Arc<Open>>,
    stopping: bool,
}

/// What a close record says, with the byte counters its connection keeps current.
pub(crate) struct Open {
    id: u64,
    peer: String,
    method: String,
    host: String,
    port: u16,
    address: SocketAddr,
    started: Instant,
    up: AtomicU64,
    down: AtomicU64,
    /// The close record was written (or is being written): never twice.
    recorded: AtomicBool,
    /// The proxy shuts down: the connection ends at its next poll.
    stop: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

/// A destination's identity in its close record.
#[derive(Clone, Copy)]
pub(crate) struct Dest<'a> {
    pub peer: &'a str,
    pub method: &'a str,
    pub to: Destination<'a>,
    pub address: SocketAddr,
    pub started: Instant,
}

/// One close record owed; dropping it writes the record (with the counters last set).
pub(crate) struct Owed {
    conns: Arc<OpenConns>,
    open: Arc<Open>,
}

impl OpenConns {
    pub(crate) fn new(audit: AuditLog, jail: &str) -> OpenConns {
        OpenConns {
            audit,
            jail: jail.to_string(),
            state: Mutex::new(State::default()),
            stopping: tokio::sync::watch::channel(false).0,
            empty: tokio::sync::Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Owe a close record for a connection to `dest`; `None` once the proxy shuts down (the
    /// caller closes the connection instead of relaying it, and records that itself).
    pub(crate) fn register(self: &Arc<Self>, dest: Dest<'_>) -> Option<Owed> {
        let mut st = self.state();
        if st.stopping {
            return None;
        }
        let id = st.next;
        st.next += 1;
        let open = Arc::new(Open {
            id,
            peer: dest.peer.to_string(),
            method: dest.method.to_string(),
            host: dest.to.host.to_string(),
            port: dest.to.port,
            address: dest.address,
            started: dest.started,
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            recorded: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            waker: Mutex::new(None),
        });
        st.open.insert(id, open.clone());
        Some(Owed {
            conns: self.clone(),
            open,
        })
    }

    /// Connections whose close record is still owed.
    pub(crate) fn open_count(&self) -> usize {
        self.state().open.len()
    }

    /// Resolves once the proxy shuts down (at once if it has).
    pub(crate) async fn stopping(&self) {
        let mut rx = self.stopping.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// End every open connection and write every close record owed: the connections are told
    /// to stop (each records its own at its next poll); those that have not within `deadline`
    /// are recorded from their counters. Returns how many were recorded that way. Connections
    /// registered afterwards are refused ([`OpenConns::register`]).
    pub(crate) async fn shutdown(&self, deadline: Duration) -> usize {
        let open: Vec<Arc<Open>> = {
            let mut st = self.state();
            st.stopping = true;
            st.open.values().cloned().collect()
        };
        // Each flag first: a task stopped by the signal below records itself as ended by it.
        for o in &open {
            o.stop.store(true, Ordering::Release);
            if let Some(w) = o.waker.lock().unwrap_or_else(|e| e.into_inner()).take() {
                w.wake();
            }
        }
        drop(open);
        self.stopping.send_replace(true);
        let all_ended = async {
            loop {
                let notified = self.empty.notified();
                if self.open_count() == 0 {
                    return;
                }
                notified.await;
            }
        };
        if tokio::time::timeout(deadline, all_ended).await.is_ok() {
            return 0;
        }
        let left: Vec<Arc<Open>> = self.state().open.drain().map(|(_, o)| o).collect();
        for o in &left {
            self.record(o);
        }
        left.len()
    }

    /// Write `o`'s close record unless it was written already.
    fn record(&self, o: &Open) {
        if o.recorded.swap(true, Ordering::AcqRel) {
            return;
        }
        let rule = if o.stop.load(Ordering::Acquire) {
            ENDED_BY_SHUTDOWN.to_string()
        } else {
            String::new()
        };
        let ev = NetEvent {
            phase: NetPhase::Close,
            client: o.peer.clone(),
            method: o.method.clone(),
            host: o.host.clone(),
            port: o.port,
            address: Some(o.address.ip().to_string()),
            rule,
            bytes_up: o.up.load(Ordering::Acquire),
            bytes_down: o.down.load(Ordering::Acquire),
            duration_ms: o.started.elapsed().as_millis() as u64,
            ..Default::default()
        };
        // The connection is over: a record that cannot be written is counted by the log.
        let _ = self.audit.write(&Record::now(&self.jail, Event::Net(ev)));
    }

    /// `o` is recorded: forget it.
    fn finish(&self, o: &Open) {
        self.record(o);
        let mut st = self.state();
        st.open.remove(&o.id);
        if st.open.is_empty() {
            self.empty.notify_waiters();
        }
    }
}

impl Owed {
    /// The bytes so far, each way (what the record says if the connection is cut).
    pub(crate) fn set_bytes(&self, up: u64, down: u64) {
        self.open.up.store(up, Ordering::Release);
        self.open.down.store(down, Ordering::Release);
    }

    /// The address the connection went to.
    pub(crate) fn address(&self) -> SocketAddr {
        self.open.address
    }

    /// The connection ended with these byte counts: its record is written.
    pub(crate) fn close(self, up: u64, down: u64) {
        self.set_bytes(up, down);
        drop(self);
    }

    /// Whether the proxy shuts down; when not, `cx` is woken when it does.
    pub(crate) fn stopped(&self, cx: &Context<'_>) -> bool {
        if self.open.stop.load(Ordering::Acquire) {
            return true;
        }
        {
            let mut w = self.open.waker.lock().unwrap_or_else(|e| e.into_inner());
            match w.as_ref() {
                Some(old) if old.will_wake(cx.waker()) => {}
                _ => *w = Some(cx.waker().clone()),
            }
        }
        // Set between the first look and the waker's registration: seen now.
        self.open.stop.load(Ordering::Acquire)
    }
}

/// A stream whose bytes are counted into an owed close record as they move: written is up,
/// read is down. For a connection whose own counts are known only at its end (the gateway's):
/// cut by the shutdown, its record has these.
pub(crate) struct Counted<S> {
    inner: S,
    open: Arc<Open>,
}

impl Owed {
    /// `stream`, counting into this record.
    pub(crate) fn counted<S>(&self, stream: S) -> Counted<S> {
        Counted {
            inner: stream,
            open: self.open.clone(),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let c = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut c.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before) as u64;
        c.open.down.fetch_add(n, Ordering::AcqRel);
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let c = self.get_mut();
        let r = Pin::new(&mut c.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &r {
            c.open.up.fetch_add(*n as u64, Ordering::AcqRel);
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl Drop for Owed {
    fn drop(&mut self) {
        self.conns.finish(&self.open);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closes(log: &AuditLog) -> Vec<NetEvent> {
        let (records, bad) = log.read_all().unwrap();
        assert_eq!(bad, 0);
        records
            .into_iter()
            .filter_map(|r| match r.event {
                Event::Net(n) if n.phase == NetPhase::Close => Some(n),
                _ => None,
            })
            .collect()
    }

    fn dest(peer: &str) -> Dest<'_> {
        Dest {
            peer,
            method: "CONNECT",
            to: Destination::new("origin.test", 443),
            address: "127.0.0.1:443".parse().unwrap(),
            started: Instant::now(),
        }
    }

    /// A connection whose task never ends (held past the deadline) is recorded from its
    /// counters by the shutdown, once: its guard's drop afterwards writes nothing more. One
    /// that ended before is not written again, and none is accepted after.
    #[test]
    fn the_shutdown_records_what_did_not_end_from_its_counters_once() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::at(dir.path().join("audit.jsonl"));
        let conns = Arc::new(OpenConns::new(log.clone(), "j"));
        let ended = conns.register(dest("a")).unwrap();
        ended.close(1, 2);
        let stuck = conns.register(dest("b")).unwrap();
        stuck.set_bytes(30, 40);
        assert_eq!(conns.open_count(), 1);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let late = rt.block_on(conns.shutdown(Duration::from_millis(50)));
        assert_eq!(late, 1);
        assert!(
            conns.register(dest("c")).is_none(),
            "registered after shutdown"
        );
        stuck.set_bytes(99, 99);
        drop(stuck);
        let got: Vec<(String, u64, u64, String)> = closes(&log)
            .into_iter()
            .map(|e| (e.client, e.bytes_up, e.bytes_down, e.rule))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".into(), 1, 2, String::new()),
                ("b".into(), 30, 40, ENDED_BY_SHUTDOWN.into()),
            ]
        );
    }
}
