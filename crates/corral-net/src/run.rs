//! Running a proxy for a jail on its own thread, from already-bound listeners.
//!
//! The native backend creates the jail's `127.0.0.1:3128` listener inside the jail's network
//! namespace (a socket keeps the namespace it was created in) and hands it here; the proxy
//! accepts on it from outside and dials out from the host's namespace.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::{NetError, Proxy};

/// A listener the proxy thread serves.
pub enum Listener {
    /// Proxy requests (HTTP, CONNECT, SOCKS5).
    Proxy(std::net::TcpListener),
    /// Proxy requests over a unix socket.
    ProxyUnix(std::os::unix::net::UnixListener),
    /// `host_ports`: connections bridged to `target` on the host.
    Forward {
        listener: std::net::TcpListener,
        target: SocketAddr,
    },
}

/// How long a shutdown waits for the open connections to end and record themselves before it
/// records the rest from their counters. Each ends at its next poll, so this is generous; it
/// stays under the 5 s a container engine gives the standalone proxy after SIGTERM.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(3);

/// A running proxy thread. [`ProxyHandle::shutdown`] (or dropping it) stops the thread: the
/// listeners close, every open connection is ended and its close record written, and the
/// refusals not yet recorded are.
pub struct ProxyHandle {
    proxy: Arc<Proxy>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ProxyHandle {
    pub fn proxy(&self) -> &Arc<Proxy> {
        &self.proxy
    }

    /// The end-of-run summary lines, most frequent first: `corral: blocked ...` for each
    /// denied destination, then `corral: failed ...` for each allowed one that could not be
    /// reached (with the reason: not resolved, connection refused, ...).
    pub fn summary(&self) -> Vec<String> {
        let blocked = self.proxy.blocked_summary();
        let failed = self.proxy.failed_summary();
        blocked
            .iter()
            .map(|b| b.summary_line())
            .chain(failed.iter().map(|b| b.failed_line()))
            .collect()
    }
}

impl ProxyHandle {
    /// Stop the proxy and wait until every record it owes is written (see [`Proxy::shutdown`]).
    /// A second call does nothing.
    pub fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The proxy's tokio runtime (`corral proxy` and the in-process proxy of `corral run`): two
/// worker threads whatever the number of cores (the proxy is I/O-bound; two keep one slow
/// decision from stalling every tunnel), and the process's allocator limited to two arenas
/// (see [`limit_malloc_arenas`]).
pub fn runtime() -> Result<tokio::runtime::Runtime, NetError> {
    limit_malloc_arenas();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("corral-proxy")
        .enable_all()
        .build()
        .map_err(|source| NetError::Io {
            what: "cannot start the proxy runtime".into(),
            source,
        })
}

/// glibc gives each thread that meets contention an arena of its own (up to 8 per core), and
/// each arena keeps the memory freed into it; the proxy's worker and blocking (resolver)
/// threads would each hold one. Two arenas serve two workers. No-op on other C libraries.
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; M_ARENA_MAX is valid at any time (it
    // bounds arenas created from then on).
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Serve `listeners` with `proxy` on a new thread with its own tokio runtime.
pub fn spawn(proxy: Arc<Proxy>, listeners: Vec<Listener>) -> Result<ProxyHandle, NetError> {
    let rt = runtime()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let p = proxy.clone();
    let thread = std::thread::Builder::new()
        .name("corral-proxy".into())
        .spawn(move || {
            rt.block_on(async move {
                let mut accepting = Vec::new();
                for l in listeners {
                    let task = match l {
                        Listener::Proxy(l) => tokio::spawn(p.clone().serve(l)),
                        Listener::ProxyUnix(l) => tokio::spawn(p.clone().serve_unix(l)),
                        Listener::Forward { listener, target } => {
                            let (audit, jail) = (p.audit().clone(), p.jail().to_string());
                            tokio::spawn(crate::forward::forward_port_recorded(
                                listener,
                                target,
                                (audit, jail),
                                Duration::from_secs(3600),
                                Some((p.refusals().clone(), p.open_conns().clone())),
                            ))
                        }
                    };
                    accepting.push(task);
                }
                let _ = rx.await;
                // No new connection, then every open one ended and recorded.
                for task in &accepting {
                    task.abort();
                }
                for task in accepting {
                    let _ = task.await;
                }
                p.shutdown(SHUTDOWN_DEADLINE).await;
            });
            rt.shutdown_timeout(Duration::from_millis(200));
        })
        .map_err(|source| NetError::Io {
            what: "cannot start the proxy thread".into(),
            source,
        })?;
    Ok(ProxyHandle {
        proxy,
        stop: Some(tx),
        thread: Some(thread),
    })
}
