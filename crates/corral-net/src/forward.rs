//! `host_ports`: a listener (created inside the jail's network namespace) whose connections are
//! bridged to one fixed port on the host's loopback, and nothing else.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_audit::{AuditLog, Decision, Event, NetEvent, NetPhase, Record};
use tokio::net::TcpStream;

/// Accept on `listener` and connect each client to `target` (normally `127.0.0.1:PORT` on the
/// host). Each connection is audited (`method` `FORWARD`) with its bytes and duration. Runs until
/// the runtime stops.
pub async fn forward_port(
    listener: std::net::TcpListener,
    target: SocketAddr,
    audit: AuditLog,
    jail: String,
    idle_timeout: Duration,
) -> std::io::Result<()> {
    forward_port_recorded(listener, target, (audit, jail), idle_timeout, None).await
}

/// [`forward_port`], counting the connections it refuses into `refusals` (the proxy's).
pub(crate) async fn forward_port_recorded(
    listener: std::net::TcpListener,
    target: SocketAddr,
    (audit, jail): (AuditLog, String),
    idle_timeout: Duration,
    refusals: Option<Arc<crate::bounds::Refusals>>,
) -> std::io::Result<()> {
    let refused = crate::bounds::Notice::new();
    let mut listener = crate::bounds::Acceptor::new(
        listener,
        format!("host port forward {target}"),
        b"",
        &refused,
    )?;
    if let Some(r) = refusals {
        listener = listener.recorded(r);
    }
    let ctx = Arc::new((audit, jail));
    loop {
        let (client, peer) = listener.accept().await;
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let (audit, jail) = &*ctx;
            let started = Instant::now();
            let mut ev = NetEvent {
                phase: NetPhase::Decision,
                client: peer.to_string(),
                method: "FORWARD".into(),
                host: target.ip().to_string(),
                port: target.port(),
                address: Some(target.ip().to_string()),
                decision: Some(Decision::Allow),
                rule: format!("network.host_ports: {}", target.port()),
                ..Default::default()
            };
            let up = match TcpStream::connect(target).await {
                Ok(s) => s,
                Err(e) => {
                    ev.rule = format!("network.host_ports: {}; connect failed: {e}", target.port());
                    let _ = audit.write(&Record::now(jail, Event::Net(ev)));
                    return;
                }
            };
            relay_audited(audit, jail, ev, client, up, idle_timeout, started).await;
        });
    }
}

pub(crate) fn to_tokio(l: std::net::TcpListener) -> std::io::Result<tokio::net::TcpListener> {
    l.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(l)
}

/// Audit the decision `ev`, relay `client` <-> `up` until both close or idle out, then audit
/// the closed connection with its bytes and duration (the fixed bridges: `host_ports`,
/// `publish`). A decision that cannot be recorded is refused: the connection is closed.
pub(crate) async fn relay_audited(
    audit: &AuditLog,
    jail: &str,
    mut ev: NetEvent,
    client: TcpStream,
    up: TcpStream,
    idle_timeout: Duration,
    started: Instant,
) {
    if audit
        .write(&Record::now(jail, Event::Net(ev.clone())))
        .is_err()
    {
        return;
    }
    let (u, d) = crate::proxy::tunnel(client, up, idle_timeout, None).await;
    ev.phase = NetPhase::Close;
    ev.decision = None;
    ev.rule = String::new();
    ev.bytes_up = u;
    ev.bytes_down = d;
    ev.duration_ms = started.elapsed().as_millis() as u64;
    let _ = audit.write(&Record::now(jail, Event::Net(ev)));
}
