//! The jail's network capabilities beyond the proxy listener:
//!
//! - `--publish PORT` ([`publish_port`]): the host's 127.0.0.1:PORT reaches the jail's loopback
//!   PORT (a dev server), and nothing else. A socket keeps the network namespace it was created
//!   in and rootless corral cannot enter the jail's, so each connection's socket is made inside
//!   the jail's namespace by the jail's set-up process (the native backend's socket factory,
//!   passed in as a [`JailSocket`]) and connected from here.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_audit::{AuditLog, Decision, Event, NetEvent, Record};

use crate::NetError;

/// Makes an unconnected TCP socket in the jail's network namespace (blocking call).
pub type JailSocket = Arc<dyn Fn() -> std::io::Result<std::net::TcpStream> + Send + Sync>;

/// The host's 127.0.0.1:`port`, for `--publish PORT`. Fails clearly when something else holds it.
pub fn bind_published(port: u16) -> Result<std::net::TcpListener, NetError> {
    let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    std::net::TcpListener::bind(addr).map_err(|source| NetError::Io {
        what: if source.kind() == std::io::ErrorKind::AddrInUse {
            format!(
                "cannot publish the jail's port {port}: 127.0.0.1:{port} is already in use on this \
                 host; stop what listens there or publish another port"
            )
        } else {
            format!("cannot publish the jail's port {port}: listen on 127.0.0.1:{port}")
        },
        source,
    })
}

/// Accept on `listener` (the host's 127.0.0.1:`port`) and connect each client to the jail's
/// 127.0.0.1:`port` through a socket `make` creates in the jail's namespace. Each connection is
/// audited (`method` `PUBLISH`: a decision record, and a close record with bytes and duration).
/// Runs until the runtime stops.
pub async fn publish_port(
    listener: std::net::TcpListener,
    port: u16,
    make: JailSocket,
    audit: AuditLog,
    jail: String,
    idle_timeout: Duration,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let ctx = Arc::new((audit, jail, make));
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                eprintln!("corral: published port {port}: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let (audit, jail, make) = &*ctx;
            let started = Instant::now();
            let target = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
            let mut ev = NetEvent {
                phase: "decision".into(),
                client: peer.to_string(),
                method: "PUBLISH".into(),
                host: "jail:127.0.0.1".into(),
                port,
                address: Some(target.to_string()),
                decision: Some(Decision::Allow),
                rule: format!("network.publish: {port}"),
                ..Default::default()
            };
            let up = match connect_in_jail(make.clone(), target).await {
                Ok(s) => s,
                Err(e) => {
                    ev.rule = format!(
                        "network.publish: {port}; nothing accepted on the jail's 127.0.0.1:{port}: {e}"
                    );
                    let _ = audit.write(&Record::now(jail, Event::Net(ev)));
                    return;
                }
            };
            let _ = audit.write(&Record::now(jail, Event::Net(ev.clone())));
            let (u, d) = crate::proxy::tunnel(client, up, idle_timeout).await;
            ev.phase = "close".into();
            ev.decision = None;
            ev.rule = String::new();
            ev.bytes_up = u;
            ev.bytes_down = d;
            ev.duration_ms = started.elapsed().as_millis() as u64;
            let _ = audit.write(&Record::now(jail, Event::Net(ev)));
        });
    }
}

/// A socket from the jail's namespace, connected to `target` there.
async fn connect_in_jail(
    make: JailSocket,
    target: SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let std_sock = tokio::task::spawn_blocking(move || make())
        .await
        .map_err(std::io::Error::other)??;
    std_sock.set_nonblocking(true)?;
    let sock = tokio::net::TcpSocket::from_std_stream(std_sock);
    tokio::time::timeout(Duration::from_secs(10), sock.connect(target))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
}

/// A task of the jail-side network thread.
pub enum Task {
    /// `--publish PORT`: the host listener and the jail's socket factory.
    Publish {
        listener: std::net::TcpListener,
        port: u16,
        make: JailSocket,
    },
}

/// The thread serving a jail's [`Task`]s. Dropping it stops the thread (connections are cut).
pub struct NetcapHandle {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for NetcapHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serve `tasks` on a new thread with its own tokio runtime, writing to `audit` as `jail`.
pub fn spawn(tasks: Vec<Task>, audit: AuditLog, jail: &str) -> Result<NetcapHandle, NetError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| NetError::Io {
            what: "cannot start the jail network runtime".into(),
            source,
        })?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let jail = jail.to_string();
    let thread = std::thread::Builder::new()
        .name("corral-netcap".into())
        .spawn(move || {
            rt.block_on(async move {
                for t in tasks {
                    match t {
                        Task::Publish {
                            listener,
                            port,
                            make,
                        } => {
                            tokio::spawn(publish_port(
                                listener,
                                port,
                                make,
                                audit.clone(),
                                jail.clone(),
                                Duration::from_secs(3600),
                            ));
                        }
                    }
                }
                let _ = rx.await;
            });
            rt.shutdown_timeout(Duration::from_millis(200));
        })
        .map_err(|source| NetError::Io {
            what: "cannot start the jail network thread".into(),
            source,
        })?;
    Ok(NetcapHandle {
        stop: Some(tx),
        thread: Some(thread),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_port_is_taken_clearly() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let err = bind_published(port).unwrap_err().to_string();
        assert!(
            err.contains(&format!("127.0.0.1:{port} is already in use")),
            "{err}"
        );
    }
}
