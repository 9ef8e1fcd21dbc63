//! The jail's network capabilities beyond the proxy listener:
//!
//! - `--publish PORT` ([`publish_port`]): the host's 127.0.0.1:PORT reaches the jail's loopback
//!   PORT (a dev server), and nothing else. A socket keeps the network namespace it was created
//!   in and rootless corral cannot enter the jail's, so each connection's socket is made inside
//!   the jail's namespace by the jail's set-up process (the native backend's socket factory,
//!   passed in as a [`JailSocket`]) and connected from here.
//! - `network.dns = "stub"` ([`serve_dns_udp`], [`serve_dns_tcp`], [`serve_capture`]): a DNS
//!   server on the jail's 127.0.0.1:53 that answers A queries only for names the proxy's rules
//!   would allow (deny wins), each with a synthetic address from [`StubPool`] (stable for the
//!   run), AAAA and other types of allowed names with an empty NOERROR, every other name with
//!   NXDOMAIN; it never forwards a query anywhere. The pool is local inside the jail's
//!   namespace, so a connection to one of its addresses lands on a capture listener
//!   (0.0.0.0:443, :80, each port a pattern names); the address tells the name, and the
//!   connection goes through exactly the proxy's decision path ([`Proxy::capture`]).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Mutex;

use corral_audit::{AuditLog, Decision, Event, NetEvent, NetPhase, Record};
use corral_policy::domain::{Host, normalize_host};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{NetError, Proxy, Rules};

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
    publish_port_recorded(listener, port, make, (audit, jail), idle_timeout, None).await
}

/// [`publish_port`], its refusals counted and its close records owed to `recorded` (ended and
/// written at the handle's shutdown).
async fn publish_port_recorded(
    listener: std::net::TcpListener,
    port: u16,
    make: JailSocket,
    (audit, jail): (AuditLog, String),
    idle_timeout: Duration,
    recorded: Option<crate::forward::Recorded>,
) -> std::io::Result<()> {
    let refused = crate::bounds::Notice::new();
    let mut listener =
        crate::bounds::Acceptor::new(listener, format!("published port {port}"), b"", &refused)?;
    let open = recorded.as_ref().map(|r| r.1.clone());
    if let Some((refusals, _)) = recorded {
        listener = listener.recorded(refusals);
    }
    let ctx = Arc::new((audit, jail, make, open));
    loop {
        let (client, peer) = listener.accept().await;
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let (audit, jail, make, open) = &*ctx;
            let started = Instant::now();
            let target = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
            let mut ev = NetEvent {
                phase: NetPhase::Decision,
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
            let relay = crate::forward::Relay {
                client,
                up,
                idle_timeout,
                started,
            };
            match open {
                Some(open) => crate::forward::relay_recorded(audit, jail, ev, relay, open).await,
                None => crate::forward::relay_audited(audit, jail, ev, relay).await,
            }
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

/// Names a jail's stub keeps addresses for at once ([`StubPool::new`]); past it, the least
/// recently used name that is neither in use nor recently answered gives its address up.
pub const STUB_NAMES: usize = 4096;

/// Why a name got no address.
const POOL_FULL: &str =
    "the stub resolver's names are all in use or answered in the last 2 minutes";

/// A name is not recycled within this time of its last answer or connection (twice the TTL
/// the stub answers with), so a client that cached the answer still reaches that name.
const RECYCLE_AFTER: Duration = Duration::from_secs(2 * STUB_TTL as u64);

/// The stub's synthetic addresses: one per name, handed out from a pool and mapped back when a
/// captured connection arrives. At most `capacity` names hold an address at once: a flood of
/// names cannot use up the pool or grow corral. A name keeps its address while a captured
/// connection to it is open ([`StubPool::hold`]) and for [`RECYCLE_AFTER`] after its last
/// use; past that the least recently used name's address goes to a new name. When every name
/// is in use or recent, a new name gets none (SERVFAIL) until one ages.
#[derive(Debug)]
pub struct StubPool {
    first: u32,
    last: u32,
    capacity: usize,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    next: u32,
    by_name: HashMap<String, PoolEntry>,
    by_addr: HashMap<Ipv4Addr, String>,
    /// Names by their last use, oldest first (the key is a use counter).
    order: BTreeMap<u64, String>,
    uses: u64,
}

#[derive(Debug)]
struct PoolEntry {
    addr: Ipv4Addr,
    last_used: Instant,
    /// Its key in `order`.
    use_key: u64,
    /// Captured connections open to it.
    open: u32,
}

impl PoolState {
    /// Mark `name` used now.
    fn touch(&mut self, name: &str, now: Instant) {
        self.uses += 1;
        let key = self.uses;
        if let Some(e) = self.by_name.get_mut(name) {
            self.order.remove(&e.use_key);
            e.use_key = key;
            e.last_used = now;
            self.order.insert(key, name.to_string());
        }
    }

    /// The address of the least recently used name that may give it up, taken from it.
    fn recycle(&mut self, now: Instant) -> Option<Ipv4Addr> {
        let mut victim = None;
        for name in self.order.values() {
            let e = &self.by_name[name];
            if now.saturating_duration_since(e.last_used) < RECYCLE_AFTER {
                break; // every later name was used more recently
            }
            if e.open == 0 {
                victim = Some(name.clone());
                break;
            }
        }
        let name = victim?;
        let e = self.by_name.remove(&name)?;
        self.order.remove(&e.use_key);
        self.by_addr.remove(&e.addr);
        Some(e.addr)
    }
}

/// A captured connection's hold on its name's address ([`StubPool::hold`]); released on drop.
#[derive(Debug)]
pub struct PoolHold {
    pool: Arc<StubPool>,
    addr: Ipv4Addr,
}

impl Drop for PoolHold {
    fn drop(&mut self) {
        let mut st = self.pool.lock();
        if let Some(name) = st.by_addr.get(&self.addr).cloned() {
            if let Some(e) = st.by_name.get_mut(&name) {
                e.open = e.open.saturating_sub(1);
            }
            st.touch(&name, Instant::now());
        }
    }
}

impl StubPool {
    /// The pool `network/prefix`, skipping its network address and `reserved` (the address on
    /// the jail's `lo`), and its broadcast address; at most [`STUB_NAMES`] names at once.
    pub fn new(network: Ipv4Addr, prefix: u8, reserved: Ipv4Addr) -> StubPool {
        StubPool::with_capacity(network, prefix, reserved, STUB_NAMES)
    }

    /// [`StubPool::new`] holding at most `capacity` names at once.
    pub fn with_capacity(
        network: Ipv4Addr,
        prefix: u8,
        reserved: Ipv4Addr,
        capacity: usize,
    ) -> StubPool {
        let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
        let base = u32::from(network) & mask;
        let first = base + 1 + u32::from(u32::from(reserved) == base + 1);
        StubPool {
            first,
            last: base | !mask,
            capacity,
            state: Mutex::new(PoolState {
                next: first,
                ..Default::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The address of `name`, given out now if it has none yet; `None` when none is free.
    pub fn address_for(&self, name: &str) -> Option<Ipv4Addr> {
        self.address_for_at(name, Instant::now())
    }

    /// [`StubPool::address_for`] at the time `now`.
    pub fn address_for_at(&self, name: &str, now: Instant) -> Option<Ipv4Addr> {
        let mut st = self.lock();
        if let Some(a) = st.by_name.get(name).map(|e| e.addr) {
            st.touch(name, now);
            return Some(a);
        }
        let a = if st.by_name.len() < self.capacity && st.next < self.last {
            st.next += 1;
            Ipv4Addr::from(st.next - 1)
        } else {
            st.recycle(now)?
        };
        st.by_name.insert(
            name.to_string(),
            PoolEntry {
                addr: a,
                last_used: now,
                use_key: 0,
                open: 0,
            },
        );
        st.by_addr.insert(a, name.to_string());
        st.touch(name, now);
        Some(a)
    }

    /// The name `addr` was given out for.
    pub fn name_for(&self, addr: IpAddr) -> Option<String> {
        let IpAddr::V4(v4) = addr else { return None };
        self.lock().by_addr.get(&v4).cloned()
    }

    /// The name `addr` was given out for, held for a captured connection: the name keeps the
    /// address until the hold is dropped.
    pub fn hold(self: &Arc<Self>, addr: IpAddr) -> Option<(String, PoolHold)> {
        let IpAddr::V4(v4) = addr else { return None };
        let mut st = self.lock();
        let name = st.by_addr.get(&v4)?.clone();
        if let Some(e) = st.by_name.get_mut(&name) {
            e.open += 1;
        }
        st.touch(&name, Instant::now());
        Some((
            name,
            PoolHold {
                pool: self.clone(),
                addr: v4,
            },
        ))
    }

    /// Names holding an address now.
    pub fn len(&self) -> usize {
        self.lock().by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `addr` lies in the pool's range.
    fn contains(&self, addr: Ipv4Addr) -> bool {
        (self.first..=self.last).contains(&u32::from(addr))
    }
}

/// Whether the stub answers for `host`: `Ok(rule)` when an allow pattern or a path rule's host
/// names it (for any port) and no port-less deny pattern does; the rule that refused it
/// otherwise. The proxy still decides each connection on its port (and a path-ruled host's
/// each request).
pub fn stub_decision(rules: &Rules, host: &Host) -> Result<String, String> {
    if let Host::Ip(_) = host {
        return Err("an IP address is not a name to resolve".into());
    }
    if let Some(p) = rules
        .deny
        .iter()
        .find(|p| p.port().is_none() && p.matches(host, 0))
    {
        return Err(format!("network.deny: {p}"));
    }
    match (rules.allow.iter())
        .chain(rules.allow_paths.iter().map(|r| r.host()))
        .find(|p| p.matches(host, p.port().unwrap_or(0)))
    {
        Some(p) => Ok(format!("network.allow: {p}")),
        None => Err("not in network.allow".into()),
    }
}

const RCODE_NOERROR: u16 = 0;
const RCODE_FORMERR: u16 = 1;
const RCODE_SERVFAIL: u16 = 2;
const RCODE_NXDOMAIN: u16 = 3;
const RCODE_NOTIMP: u16 = 4;
const RCODE_REFUSED: u16 = 5;
const TYPE_A: u16 = 1;
const CLASS_IN: u16 = 1;
/// At most this many DNS-over-TCP connections at once (more are closed at once).
const DNS_TCP_CONNECTIONS: usize = 64;
/// Seconds a synthetic answer may be cached (the address is stable for the run anyway).
const STUB_TTL: u32 = 60;

/// What one query was, for the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StubQuery {
    pub name: String,
    pub qtype: u16,
    pub allowed: bool,
    pub rule: String,
    pub address: Option<Ipv4Addr>,
}

/// The stub's answer to one DNS message: the reply (`None`: not a query, dropped) and what was
/// asked (`None` when no question could be read).
pub fn stub_reply(
    query: &[u8],
    rules: &Rules,
    pool: &StubPool,
) -> (Option<Vec<u8>>, Option<StubQuery>) {
    stub_reply_recorded(query, rules, pool, |_| true)
}

/// [`stub_reply`], with each question handed to `record` (the audit log) before it is
/// answered: a name `record` could not record is not resolved (SERVFAIL), so the jail never
/// gets an address the log does not show.
pub fn stub_reply_recorded(
    query: &[u8],
    rules: &Rules,
    pool: &StubPool,
    record: impl FnOnce(&StubQuery) -> bool,
) -> (Option<Vec<u8>>, Option<StubQuery>) {
    if query.len() < 12 {
        return (None, None);
    }
    let flags = u16::from_be_bytes([query[2], query[3]]);
    if flags & 0x8000 != 0 {
        return (None, None); // a response: never answered
    }
    let opcode = (flags >> 11) & 0xf;
    let header = |rcode: u16, qd: u16, an: u16| {
        let mut h = Vec::with_capacity(512);
        h.extend_from_slice(&query[0..2]);
        // QR, the opcode, RD copied, AA (the stub is authoritative for what it says), RA 0.
        let f = 0x8000 | 0x0400 | (opcode << 11) | (flags & 0x0100) | rcode;
        h.extend_from_slice(&f.to_be_bytes());
        for n in [qd, an, 0, 0] {
            h.extend_from_slice(&n.to_be_bytes());
        }
        h
    };
    if opcode != 0 {
        return (Some(header(RCODE_NOTIMP, 0, 0)), None);
    }
    if u16::from_be_bytes([query[4], query[5]]) != 1 {
        return (Some(header(RCODE_REFUSED, 0, 0)), None);
    }
    let Some(q) = parse_question(query) else {
        return (Some(header(RCODE_FORMERR, 0, 0)), None);
    };
    let question = &query[12..q.end];
    let reply = |rcode: u16, answer: Option<Ipv4Addr>| {
        let mut r = header(rcode, 1, u16::from(answer.is_some()));
        r.extend_from_slice(question);
        if let Some(a) = answer {
            r.extend_from_slice(&[0xc0, 0x0c]); // the question's name
            r.extend_from_slice(&TYPE_A.to_be_bytes());
            r.extend_from_slice(&CLASS_IN.to_be_bytes());
            r.extend_from_slice(&STUB_TTL.to_be_bytes());
            r.extend_from_slice(&4u16.to_be_bytes());
            r.extend_from_slice(&a.octets());
        }
        r
    };
    let (asked, rcode) = stub_answer(&q, rules, pool);
    let out = match (record(&asked), rcode) {
        (true, RCODE_NOERROR) => reply(RCODE_NOERROR, asked.address),
        (false, RCODE_NOERROR) => reply(RCODE_SERVFAIL, None),
        (_, rcode) => reply(rcode, None),
    };
    (Some(out), Some(asked))
}

/// The one question of a stub query.
struct Question<'a> {
    labels: Vec<&'a [u8]>,
    qtype: u16,
    qclass: u16,
    /// Where the question ends in the query.
    end: usize,
}

/// The question of `query` (uncompressed labels, then type and class); `None` when it does not
/// parse (FORMERR).
fn parse_question(query: &[u8]) -> Option<Question<'_>> {
    let mut pos = 12;
    let mut labels: Vec<&[u8]> = Vec::new();
    loop {
        let &len = query.get(pos)?;
        pos += 1;
        if len == 0 {
            break;
        }
        if len & 0xc0 != 0 || pos + len as usize > query.len() || pos > 12 + 255 {
            return None;
        }
        labels.push(&query[pos..pos + len as usize]);
        pos += len as usize;
    }
    let tail = query.get(pos..pos + 4)?;
    Some(Question {
        labels,
        qtype: u16::from_be_bytes([tail[0], tail[1]]),
        qclass: u16::from_be_bytes([tail[2], tail[3]]),
        end: pos + 4,
    })
}

/// What the stub decides for question `q`, and the answer's rcode.
fn stub_answer(q: &Question<'_>, rules: &Rules, pool: &StubPool) -> (StubQuery, u16) {
    // Only plain hostname characters make a name; anything else (a dot or NUL inside a label,
    // bytes IDNA would map) is refused here rather than reinterpreted.
    // The jail chooses these bytes: escaped (`\x1b`, `\n`, ...), so what reaches the audit log and
    // `corral log` cannot forge a row or drive the reader's terminal.
    let shown: String = q
        .labels
        .iter()
        .map(|l| l.escape_ascii().to_string())
        .collect::<Vec<_>>()
        .join(".");
    let plain = !q.labels.is_empty()
        && q.labels.iter().all(|l| {
            l.iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        });
    let host = if plain {
        normalize_host(&shown).map_err(|e| e.to_string())
    } else {
        Err("not a plain host name".into())
    };
    let decision = match (&host, q.qclass) {
        (_, c) if c != CLASS_IN => Err(format!("class {c} is not IN")),
        (Ok(h), _) => stub_decision(rules, h),
        (Err(e), _) => Err(e.clone()),
    };
    let name = match &host {
        Ok(Host::Name(n)) => n.clone(),
        _ => shown.chars().take(253).collect(),
    };
    let mut asked = StubQuery {
        name: name.clone(),
        qtype: q.qtype,
        allowed: decision.is_ok(),
        rule: String::new(),
        address: None,
    };
    let rcode = match decision {
        Err(rule) => {
            asked.rule = rule;
            RCODE_NXDOMAIN
        }
        Ok(rule) => {
            asked.rule = rule;
            if q.qtype != TYPE_A {
                RCODE_NOERROR
            } else if let Some(a) = pool.address_for(&name) {
                asked.address = Some(a);
                RCODE_NOERROR
            } else {
                asked.allowed = false;
                asked.rule = POOL_FULL.into();
                RCODE_SERVFAIL
            }
        }
    };
    (asked, rcode)
}

fn qtype_name(t: u16) -> String {
    match t {
        1 => "A".into(),
        28 => "AAAA".into(),
        5 => "CNAME".into(),
        15 => "MX".into(),
        16 => "TXT".into(),
        33 => "SRV".into(),
        65 => "HTTPS".into(),
        other => format!("TYPE{other}"),
    }
}

/// What the user can do about a refused name, for the end-of-run summary.
fn dns_fix(q: &StubQuery) -> String {
    match q.rule.strip_prefix("network.deny: ") {
        Some(p) => format!("remove {p} from network.deny to allow it"),
        None if q.rule == "not in network.allow" => {
            format!("allow with: corral run --allow {}", q.name)
        }
        None if q.rule == POOL_FULL => format!(
            "the jail asked for more than {STUB_NAMES} names within 2 minutes; ask again later"
        ),
        None => "the stub resolver answers allowed plain host names only".into(),
    }
}

/// Record one query; `false` when the record could not be written.
fn audit_query(proxy: &Proxy, peer: &str, q: &StubQuery) -> bool {
    let method = format!("DNS {}", qtype_name(q.qtype));
    if !q.allowed {
        // One summary line per name, whatever the record types asked (A, AAAA, HTTPS, ...).
        proxy.note_blocked("DNS", &q.name, &q.rule, &dns_fix(q));
    }
    let ev = NetEvent {
        phase: NetPhase::Decision,
        client: peer.to_string(),
        method,
        host: q.name.clone(),
        port: 53,
        address: q.address.map(|a| a.to_string()),
        decision: Some(if q.allowed {
            Decision::Allow
        } else {
            Decision::Deny
        }),
        rule: q.rule.clone(),
        ..Default::default()
    };
    proxy.record(ev)
}

/// Answer DNS over UDP on `socket` (the jail's 127.0.0.1:53) until the runtime stops.
pub async fn serve_dns_udp(
    socket: std::net::UdpSocket,
    proxy: Arc<Proxy>,
    pool: Arc<StubPool>,
) -> std::io::Result<()> {
    socket.set_nonblocking(true)?;
    let socket = tokio::net::UdpSocket::from_std(socket)?;
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, peer) = match socket.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let (reply, _) = stub_reply_recorded(&buf[..n], &proxy.rules(), &pool, |q| {
            audit_query(&proxy, &peer.to_string(), q)
        });
        if let Some(r) = reply {
            let _ = socket.send_to(&r, peer).await;
        }
    }
}

/// Answer DNS over TCP on `listener` (the jail's 127.0.0.1:53) until the runtime stops.
pub async fn serve_dns_tcp(
    listener: std::net::TcpListener,
    proxy: Arc<Proxy>,
    pool: Arc<StubPool>,
) -> std::io::Result<()> {
    let mut listener = crate::bounds::Acceptor::new(
        listener,
        "the stub resolver (TCP)",
        b"",
        proxy.refused_for_descriptors(),
    )?
    .recorded(proxy.refusals().clone());
    // Resolvers open a TCP connection only after a truncated UDP answer: a few suffice.
    let slots = Arc::new(tokio::sync::Semaphore::new(DNS_TCP_CONNECTIONS));
    loop {
        let (mut conn, peer) = listener.accept().await;
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(conn);
            let why = crate::bounds::reason::CONNECTIONS;
            proxy.refusals().hit("the stub resolver (TCP)", why);
            continue;
        };
        let (proxy, pool) = (proxy.clone(), pool.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let idle = Duration::from_secs(10);
            loop {
                let mut len = [0u8; 2];
                match tokio::time::timeout(idle, conn.read_exact(&mut len)).await {
                    Ok(Ok(_)) => {}
                    _ => return,
                }
                let mut msg = vec![0u8; u16::from_be_bytes(len) as usize];
                match tokio::time::timeout(idle, conn.read_exact(&mut msg)).await {
                    Ok(Ok(_)) => {}
                    _ => return,
                }
                let (reply, _) = stub_reply_recorded(&msg, &proxy.rules(), &pool, |q| {
                    audit_query(&proxy, &peer.to_string(), q)
                });
                let Some(r) = reply else { return };
                let mut framed = (r.len() as u16).to_be_bytes().to_vec();
                framed.extend_from_slice(&r);
                if conn.write_all(&framed).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// Take the connections made to the jail's `port` on any local address: those to an address
/// the stub gave out go through the proxy's decision for that name ([`Proxy::capture`]); any
/// other (an address nobody resolved, the jail's own loopback) is refused and audited.
pub async fn serve_capture(
    listener: std::net::TcpListener,
    port: u16,
    proxy: Arc<Proxy>,
    pool: Arc<StubPool>,
) -> std::io::Result<()> {
    let mut listener = crate::bounds::Acceptor::new(
        listener,
        format!("stub capture on port {port}"),
        b"",
        proxy.refused_for_descriptors(),
    )?
    .recorded(proxy.refusals().clone());
    loop {
        let (conn, peer) = listener.accept().await;
        let local = conn.local_addr().ok().map(|a| a.ip());
        match local.and_then(|ip| pool.hold(ip)) {
            Some((name, hold)) => {
                let _ = conn.set_nodelay(true);
                let proxy = proxy.clone();
                tokio::spawn(async move {
                    // The name keeps its address while this connection is open.
                    let _hold = hold;
                    proxy
                        .capture(conn, peer.to_string(), Host::Name(name), port)
                        .await;
                });
            }
            None => {
                let addr = local.map_or_else(|| "?".to_string(), |ip| ip.to_string());
                let why = match local {
                    Some(IpAddr::V4(v4)) if pool.contains(v4) => {
                        "an address of the stub's pool that it never handed out"
                    }
                    _ => "not an address the stub resolver handed out",
                };
                let rule = format!("direct connection to {addr}:{port}: {why}");
                proxy.note_blocked(
                    "CAPTURE",
                    &format!("{addr}:{port}"),
                    &rule,
                    "connect to a name the policy allows (through the proxy, or resolved by the jail's resolver)",
                );
                let ev = NetEvent {
                    phase: NetPhase::Decision,
                    client: peer.to_string(),
                    method: "CAPTURE".into(),
                    host: addr.clone(),
                    port,
                    decision: Some(Decision::Deny),
                    rule,
                    ..Default::default()
                };
                let _ = proxy.record(ev);
                drop(conn);
            }
        }
    }
}

/// A task of the jail-side network thread.
pub enum Task {
    /// `--publish PORT`: the host listener and the jail's socket factory.
    Publish {
        listener: std::net::TcpListener,
        port: u16,
        make: JailSocket,
    },
    /// `network.dns = "stub"`: the jail's DNS sockets and capture listeners, served with the
    /// jail's proxy (its rules, audit log and decision path).
    Stub {
        udp: std::net::UdpSocket,
        tcp: std::net::TcpListener,
        capture: Vec<(u16, std::net::TcpListener)>,
        proxy: Arc<Proxy>,
        pool: Arc<StubPool>,
    },
}

/// The thread serving a jail's [`Task`]s. [`NetcapHandle::shutdown`] (or dropping it) stops
/// the thread: the listeners close, every published connection still open is ended and its
/// close record written, and the refusals not yet recorded are.
pub struct NetcapHandle {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    refusals: Arc<crate::bounds::Refusals>,
}

impl NetcapHandle {
    /// Stop the thread and wait until every record it owes is written. A second call does
    /// nothing.
    pub fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// The connections to the published ports refused before any decision (the stub's are
    /// the proxy's).
    pub fn refusals(&self) -> &Arc<crate::bounds::Refusals> {
        &self.refusals
    }
}

impl Drop for NetcapHandle {
    fn drop(&mut self) {
        self.shutdown();
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
    let refusals = Arc::new(crate::bounds::Refusals::new(audit.clone(), jail.clone()));
    let open = Arc::new(crate::open::OpenConns::new(audit.clone(), &jail));
    let recorded = (refusals.clone(), open.clone());
    let thread = std::thread::Builder::new()
        .name("corral-netcap".into())
        .spawn(move || {
            rt.block_on(async move {
                let mut accepting = Vec::new();
                let publishes = tasks.iter().any(|t| matches!(t, Task::Publish { .. }));
                if publishes {
                    tokio::spawn(crate::bounds::Refusals::run(Arc::downgrade(&recorded.0)));
                }
                for t in tasks {
                    match t {
                        Task::Publish {
                            listener,
                            port,
                            make,
                        } => {
                            accepting.push(tokio::spawn(publish_port_recorded(
                                listener,
                                port,
                                make,
                                (audit.clone(), jail.clone()),
                                Duration::from_secs(3600),
                                Some(recorded.clone()),
                            )));
                        }
                        Task::Stub {
                            udp,
                            tcp,
                            capture,
                            proxy,
                            pool,
                        } => {
                            tokio::spawn(serve_dns_udp(udp, proxy.clone(), pool.clone()));
                            tokio::spawn(serve_dns_tcp(tcp, proxy.clone(), pool.clone()));
                            for (port, l) in capture {
                                tokio::spawn(serve_capture(l, port, proxy.clone(), pool.clone()));
                            }
                        }
                    }
                }
                let _ = rx.await;
                // No new connection, then every open one ended and recorded.
                for task in &accepting {
                    task.abort();
                }
                for task in accepting {
                    let _ = task.await;
                }
                open.shutdown(crate::run::SHUTDOWN_DEADLINE).await;
                recorded.0.flush();
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
        refusals,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_policy::domain::DomainPattern;

    fn rules(allow: &[&str], deny: &[&str]) -> Rules {
        let p = |v: &[&str]| v.iter().map(|s| DomainPattern::parse(s).unwrap()).collect();
        Rules {
            allow: p(allow),
            deny: p(deny),
            ..Default::default()
        }
    }

    #[test]
    fn the_stub_answers_for_a_path_ruled_host() {
        let mut r = rules(&[], &["gist.github.com"]);
        r.allow_paths =
            vec![corral_policy::pathrule::PathRule::parse("GET *.github.com/myorg/**").unwrap()];
        let name = |n: &str| corral_policy::domain::normalize_host(n).unwrap();
        assert_eq!(
            stub_decision(&r, &name("api.github.com")),
            Ok("network.allow: *.github.com".into())
        );
        assert_eq!(
            stub_decision(&r, &name("gist.github.com")),
            Err("network.deny: gist.github.com".into())
        );
        assert_eq!(
            stub_decision(&r, &name("github.com")),
            Err("not in network.allow".into())
        );
    }

    fn query(id: u16, flags: u16, labels: &[&[u8]], qtype: u16) -> Vec<u8> {
        let mut q = id.to_be_bytes().to_vec();
        q.extend_from_slice(&flags.to_be_bytes());
        q.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
        for l in labels {
            q.push(l.len() as u8);
            q.extend_from_slice(l);
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&CLASS_IN.to_be_bytes());
        q
    }

    fn rcode(reply: &[u8]) -> u16 {
        u16::from_be_bytes([reply[2], reply[3]]) & 0xf
    }

    fn pool() -> StubPool {
        StubPool::new(
            Ipv4Addr::new(198, 18, 0, 0),
            15,
            Ipv4Addr::new(198, 18, 0, 1),
        )
    }

    #[test]
    fn the_pool_gives_each_name_one_stable_address_and_maps_it_back() {
        let p = pool();
        let a = p.address_for("a.example").unwrap();
        assert_eq!(
            a,
            Ipv4Addr::new(198, 18, 0, 2),
            "the lo address is never handed out"
        );
        let b = p.address_for("b.example").unwrap();
        assert_ne!(a, b);
        assert_eq!(p.address_for("a.example"), Some(a));
        assert_eq!(p.name_for(IpAddr::V4(b)).as_deref(), Some("b.example"));
        assert_eq!(p.name_for("198.18.0.99".parse().unwrap()), None);
        assert_eq!(p.name_for("::1".parse().unwrap()), None);
        // A tiny pool runs out instead of wrapping onto an address already given.
        let tiny = StubPool::new(Ipv4Addr::new(10, 0, 0, 0), 30, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(tiny.address_for("x"), Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(tiny.address_for("y"), None);
    }

    /// A flood of 200,000 names under an allowed wildcard (1 ms apart): at most
    /// [`STUB_NAMES`] hold an address at any time (corral's memory and the pool are bounded),
    /// a name with a captured connection open keeps its address through the flood, a name
    /// answered recently keeps it too, and once the flood's names age, later names resolve.
    /// Before, the flood took the whole /15 and every later name failed.
    #[test]
    fn a_flood_of_names_cannot_use_up_the_pool() {
        let p = Arc::new(pool());
        let t0 = Instant::now();
        let early = p.address_for_at("early.flood.test", t0).unwrap();
        let (name, hold) = p.hold(IpAddr::V4(early)).unwrap();
        assert_eq!(name, "early.flood.test");
        let (mut given, mut refused) = (0, 0);
        let mut last = t0;
        for i in 0..200_000u64 {
            last = t0 + Duration::from_millis(i + 1);
            match p.address_for_at(&format!("n{i}.flood.test"), last) {
                Some(_) => given += 1,
                None => refused += 1,
            }
            assert!(p.len() <= STUB_NAMES, "{} names held", p.len());
        }
        assert!(
            given >= STUB_NAMES && refused > 0,
            "{given} given, {refused} refused"
        );
        // The held name still maps both ways; the addresses stayed at the pool's start.
        assert_eq!(
            p.name_for(IpAddr::V4(early)).as_deref(),
            Some("early.flood.test")
        );
        assert_eq!(p.address_for_at("early.flood.test", last), Some(early));
        let used = |a: Ipv4Addr| u32::from(a) - u32::from(Ipv4Addr::new(198, 18, 0, 0));
        // A name answered just now keeps its address while a new flood fills the pool.
        let recent = p.address_for_at("recent.flood.test", last + RECYCLE_AFTER);
        let recent = recent.expect("after the flood ages, a later name resolves");
        assert!(used(recent) <= STUB_NAMES as u32 + 2);
        for i in 0..2 * STUB_NAMES {
            let _ = p.address_for_at(&format!("m{i}.flood.test"), last + RECYCLE_AFTER);
        }
        assert_eq!(
            p.address_for_at("recent.flood.test", last + RECYCLE_AFTER),
            Some(recent)
        );
        assert_eq!(p.address_for_at("early.flood.test", last), Some(early));
        // Released and aged, the early name's address can go to another name.
        drop(hold);
        let much_later = last + 3 * RECYCLE_AFTER;
        for i in 0..STUB_NAMES {
            assert!(
                p.address_for_at(&format!("z{i}.flood.test"), much_later)
                    .is_some()
            );
        }
        assert_ne!(
            p.name_for(IpAddr::V4(early)).as_deref(),
            Some("early.flood.test")
        );
        assert!(p.len() <= STUB_NAMES);
    }

    #[test]
    fn the_stub_answers_allowed_names_only_and_deny_wins() {
        let r = rules(
            &["example.org", "*.github.com", "models.lan:8080"],
            &["gist.github.com"],
        );
        let p = pool();
        let (reply, asked) = stub_reply(&query(0xbeef, 0x0100, &[b"Example", b"ORG"], 1), &r, &p);
        let reply = reply.unwrap();
        let asked = asked.unwrap();
        assert_eq!(&reply[0..2], &[0xbe, 0xef]);
        assert_eq!(reply[2] & 0x80, 0x80, "a response");
        assert_eq!(reply[2] & 0x01, 0x01, "RD copied");
        assert_eq!(rcode(&reply), RCODE_NOERROR);
        assert_eq!(&reply[6..8], &[0, 1], "one answer");
        let addr = p.address_for("example.org").unwrap();
        assert_eq!(&reply[reply.len() - 4..], &addr.octets());
        assert_eq!(
            asked,
            StubQuery {
                name: "example.org".into(),
                qtype: 1,
                allowed: true,
                rule: "network.allow: example.org".into(),
                address: Some(addr),
            }
        );
        // A pattern with a port still makes the name resolvable.
        let (reply, _) = stub_reply(&query(1, 0, &[b"models", b"lan"], 1), &r, &p);
        assert_eq!(rcode(&reply.unwrap()), RCODE_NOERROR);
        // AAAA of an allowed name: empty NOERROR (IPv4 only).
        let (reply, asked) = stub_reply(&query(2, 0, &[b"example", b"org"], 28), &r, &p);
        let reply = reply.unwrap();
        assert_eq!(
            (rcode(&reply), &reply[6..8]),
            (RCODE_NOERROR, &[0u8, 0][..])
        );
        assert!(asked.unwrap().allowed);
        for (labels, rule) in [
            (
                &[&b"gist"[..], b"github", b"com"][..],
                "network.deny: gist.github.com",
            ),
            (&[&b"github"[..], b"com"][..], "not in network.allow"),
            (&[&b"evil"[..], b"example"][..], "not in network.allow"),
            (
                &[&b"127"[..], b"0", b"0", b"1"][..],
                "an IP address is not a name to resolve",
            ),
        ] {
            let (reply, asked) = stub_reply(&query(3, 0, labels, 1), &r, &p);
            assert_eq!(rcode(&reply.unwrap()), RCODE_NXDOMAIN, "{labels:?}");
            let asked = asked.unwrap();
            assert!(!asked.allowed && asked.rule == rule, "{asked:?}");
            assert_eq!(asked.address, None);
        }
        // A dot or a NUL inside a label is not the name it looks like.
        for bad in [&b"example.org"[..], b"example\0"] {
            let (reply, asked) = stub_reply(&query(4, 0, &[bad, b"org"], 1), &r, &p);
            assert_eq!(rcode(&reply.unwrap()), RCODE_NXDOMAIN);
            assert!(!asked.unwrap().allowed);
        }
        // Control bytes the jail puts in a name reach the audit log escaped, never raw.
        let (_, asked) = stub_reply(&query(6, 0, &[b"a\x1b[2J\nforged", b"org"], 1), &r, &p);
        let name = asked.unwrap().name;
        assert!(!name.chars().any(char::is_control), "{name:?}");
        assert_eq!(name, "a\\x1b[2J\\nforged.org");
    }

    #[test]
    fn malformed_messages_get_an_error_or_nothing() {
        let r = rules(&["example.org"], &[]);
        let p = pool();
        let q = query(5, 0, &[b"example", b"org"], 1);
        // Responses and runts are dropped.
        assert_eq!(
            stub_reply(&query(5, 0x8000, &[b"x"], 1), &r, &p),
            (None, None)
        );
        assert_eq!(stub_reply(&q[..11], &r, &p), (None, None));
        // Truncated question, compression in the question: FORMERR.
        let (reply, asked) = stub_reply(&q[..q.len() - 2], &r, &p);
        assert_eq!((rcode(&reply.unwrap()), asked), (RCODE_FORMERR, None));
        let mut ptr = q[..12].to_vec();
        ptr.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1]);
        assert_eq!(rcode(&stub_reply(&ptr, &r, &p).0.unwrap()), RCODE_FORMERR);
        // Another opcode, two questions: NOTIMP, REFUSED.
        assert_eq!(
            rcode(&stub_reply(&query(5, 0x2000, &[b"x"], 1), &r, &p).0.unwrap()),
            RCODE_NOTIMP
        );
        let mut two = q.clone();
        two[5] = 2;
        assert_eq!(rcode(&stub_reply(&two, &r, &p).0.unwrap()), RCODE_REFUSED);
        // Class CHAOS for an allowed name: refused as a decision (NXDOMAIN), audited.
        let mut chaos = q.clone();
        let n = chaos.len();
        chaos[n - 1] = 3;
        let (reply, asked) = stub_reply(&chaos, &r, &p);
        assert_eq!(rcode(&reply.unwrap()), RCODE_NXDOMAIN);
        assert_eq!(asked.unwrap().rule, "class 3 is not IN");
        // Nothing was handed out for any of these.
        assert_eq!(p.name_for("198.18.0.2".parse().unwrap()), None);
    }

    /// A jail asking for ever new names (or hosts) cannot grow corral's memory through the
    /// end-of-run summary: past the bound they share one line, and the count stays right.
    #[test]
    fn the_summary_keeps_a_bounded_number_of_destinations() {
        let dir = tempfile::tempdir().unwrap();
        let proxy = Proxy::new(
            rules(&["ok.test"], &[]),
            AuditLog::at(dir.path().join("audit.jsonl")),
            "j",
        );
        let (pool, extra) = (pool(), 250);
        let ask = |name: &str| {
            let labels: Vec<&[u8]> = name.split('.').map(str::as_bytes).collect();
            let (_, asked) = stub_reply(&query(7, 0x0100, &labels, TYPE_A), &proxy.rules(), &pool);
            assert!(audit_query(&proxy, "127.0.0.1:5", &asked.unwrap()));
        };
        for i in 0..crate::proxy::BLOCKED_KEPT + extra {
            ask(&format!("n{i}.evil.test"));
        }
        // A name already listed keeps counting on its own line.
        ask("n0.evil.test");
        let summary = proxy.blocked_summary();
        assert_eq!(summary.len(), crate::proxy::BLOCKED_KEPT + 1);
        let others = summary
            .iter()
            .find(|b| b.target == "other destinations")
            .unwrap();
        assert_eq!(others.count, extra as u64);
        let first = summary.iter().find(|b| b.target == "n0.evil.test").unwrap();
        assert_eq!(first.count, 2);
        // Every query is still in the audit log.
        assert_eq!(
            proxy.audit().read_all().unwrap().0.len(),
            crate::proxy::BLOCKED_KEPT + extra + 1
        );
    }

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

    /// A captured port-80 connection goes through the proxy's HTTP path pinned to the name the
    /// stub resolved: an origin-form request is a request for that name; a Host header or an
    /// absolute URL naming another host is refused and audited.
    #[tokio::test]
    async fn a_captured_port_80_connection_is_pinned_to_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::at(dir.path().join("audit.jsonl"));
        let mut r = rules(&["plain.test", "other.test"], &[]);
        r.allow_cidrs = vec!["127.0.0.1/32".parse().unwrap()];
        let resolver = crate::StaticResolver::new()
            .with("plain.test", &["127.0.0.1".parse().unwrap()])
            .with("other.test", &["127.0.0.1".parse().unwrap()]);
        let proxy = Arc::new(Proxy::new(r, log.clone(), "j").with_resolver(Arc::new(resolver)));
        let host = || Host::Name("plain.test".into());
        let exchange = |req: &'static str| {
            let proxy = proxy.clone();
            async move {
                let (mut jail, corral) = tokio::io::duplex(64 * 1024);
                let mut task =
                    tokio::spawn(proxy.capture(corral, "198.18.0.1:5".into(), host(), 80));
                jail.write_all(req.as_bytes()).await.unwrap();
                let mut out = Vec::new();
                let _ =
                    tokio::time::timeout(Duration::from_secs(20), jail.read_to_end(&mut out)).await;
                drop(jail);
                // Something listening on this machine's port 80 may hold the relay open: the
                // test does not wait for it forever.
                if tokio::time::timeout(Duration::from_secs(30), &mut task)
                    .await
                    .is_err()
                {
                    task.abort();
                }
                String::from_utf8_lossy(&out).into_owned()
            }
        };
        // Origin-form for the captured name: decided and dialled as plain.test:80 (whether
        // anything answers on this machine's port 80 does not matter here).
        exchange("GET /x HTTP/1.1\r\nHost: plain.test\r\nConnection: close\r\n\r\n").await;
        let other_host =
            exchange("GET /x HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n").await;
        assert!(other_host.starts_with("HTTP/1.1 400"), "{other_host}");
        let absolute =
            exchange("GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n").await;
        assert!(absolute.starts_with("HTTP/1.1 403"), "{absolute}");

        let decisions: Vec<(String, String, u16, Option<Decision>, String)> = log
            .read_all()
            .unwrap()
            .0
            .into_iter()
            .filter_map(|r| match r.event {
                Event::Net(n) if n.phase == NetPhase::Decision => {
                    Some((n.method, n.host, n.port, n.decision, n.rule))
                }
                _ => None,
            })
            .collect();
        assert_eq!(decisions.len(), 3, "{decisions:#?}");
        let (m, h, p, d, _) = &decisions[0];
        assert_eq!(
            (m.as_str(), h.as_str(), *p, *d),
            ("GET", "plain.test", 80, Some(Decision::Allow))
        );
        assert_eq!(
            decisions[1],
            (
                "GET".into(),
                "plain.test".into(),
                80,
                Some(Decision::Deny),
                "Host header names other.test, the request target names plain.test:80".into()
            )
        );
        assert_eq!(
            decisions[2],
            (
                "GET".into(),
                "other.test".into(),
                80,
                Some(Decision::Deny),
                "connection pinned to plain.test:80".into()
            )
        );
    }
}
