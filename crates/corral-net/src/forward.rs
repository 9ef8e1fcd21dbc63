//! `host_ports`: a listener (created inside the jail's network namespace) whose connections are
//! bridged to one fixed port on the host's loopback, and nothing else.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral_audit::{AuditLog, Decision, Event, NetEvent, NetPhase, Record};
use tokio::net::TcpStream;

use crate::open::{Dest, OpenConns};
use crate::proxy::Destination;

/// What a proxy's bridge counts into: its refusals and the close records it owes.
pub(crate) type Recorded = (Arc<crate::bounds::Refusals>, Arc<OpenConns>);

/// One bridged connection: both ends, the idle bound, when it started.
pub(crate) struct Relay {
    pub client: TcpStream,
    pub up: TcpStream,
    pub idle_timeout: Duration,
    pub started: Instant,
}

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
    recorded: Option<Recorded>,
) -> std::io::Result<()> {
    let refused = crate::bounds::Notice::new();
    let mut listener = crate::bounds::Acceptor::new(
        listener,
        format!("host port forward {target}"),
        b"",
        &refused,
    )?;
    let open = recorded.as_ref().map(|r| r.1.clone());
    if let Some((refusals, _)) = recorded {
        listener = listener.recorded(refusals);
    }
    let ctx = Arc::new((audit, jail, open));
    loop {
        let (client, peer) = listener.accept().await;
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let (audit, jail, open) = &*ctx;
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
            let relay = Relay {
                client,
                up,
                idle_timeout,
                started,
            };
            match open {
                Some(open) => relay_recorded(audit, jail, ev, relay, open).await,
                None => relay_audited(audit, jail, ev, relay).await,
            }
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
pub(crate) async fn relay_audited(audit: &AuditLog, jail: &str, mut ev: NetEvent, r: Relay) {
    if audit
        .write(&Record::now(jail, Event::Net(ev.clone())))
        .is_err()
    {
        return;
    }
    let Relay {
        client,
        up,
        idle_timeout,
        started,
    } = r;
    let (u, d) = crate::proxy::tunnel(client, up, idle_timeout, None).await;
    ev.phase = NetPhase::Close;
    ev.decision = None;
    ev.rule = String::new();
    ev.bytes_up = u;
    ev.bytes_down = d;
    ev.duration_ms = started.elapsed().as_millis() as u64;
    let _ = audit.write(&Record::now(jail, Event::Net(ev)));
}

/// [`relay_audited`] with its close record owed to `open` (the proxy's): a connection still
/// open when the proxy shuts down is ended and recorded then, with its bytes.
pub(crate) async fn relay_recorded(
    audit: &AuditLog,
    jail: &str,
    ev: NetEvent,
    r: Relay,
    open: &Arc<OpenConns>,
) {
    if audit
        .write(&Record::now(jail, Event::Net(ev.clone())))
        .is_err()
    {
        return;
    }
    let target = SocketAddr::new(
        r.up.peer_addr().map_or([0, 0, 0, 0].into(), |a| a.ip()),
        ev.port,
    );
    let dest = Dest {
        peer: &ev.client,
        method: &ev.method,
        to: Destination::new(&ev.host, ev.port),
        address: target,
        started: r.started,
    };
    let Some(owed) = open.register(dest) else {
        // The run is ending: closed before any byte moved.
        let ev = NetEvent {
            phase: NetPhase::Close,
            decision: None,
            rule: String::new(),
            duration_ms: r.started.elapsed().as_millis() as u64,
            ..ev
        };
        let _ = audit.write(&Record::now(jail, Event::Net(ev)));
        return;
    };
    let relay = crate::proxy::tunnel(r.client, r.up, r.idle_timeout, None);
    crate::proxy::RecordedRelay::new(relay, owed, 0).await;
}
