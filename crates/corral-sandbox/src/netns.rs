//! The jail's network namespace side: loopback up, and the listeners corral accepts on from
//! outside (a socket keeps the namespace it was created in, so no bridge process is needed).

use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};

use corral_policy::plan::NetworkPlan;

use crate::error::JailError;

/// Where the jail's processes find corral's proxy: 127.0.0.1:3128 inside the jail.
pub const PROXY_PORT: u16 = corral_policy::consts::PROXY_PORT;

/// Listening sockets created inside the jail's network namespace, held by corral only. The jail's
/// own processes never hold them: accept on them from outside to serve the jail.
#[derive(Debug, Default)]
pub struct JailNet {
    /// The jail's 127.0.0.1:3128 (network mode `proxy`).
    pub proxy: Option<TcpListener>,
    /// The jail's 127.0.0.1:PORT for each `network.host_ports` entry.
    pub host_ports: Vec<(u16, TcpListener)>,
    /// `network.dns = "stub"`: the jail's 127.0.0.1:53, UDP and TCP.
    pub dns: Option<(UdpSocket, TcpListener)>,
    /// `network.dns = "stub"`: 0.0.0.0:PORT for each captured port (the stub's addresses are
    /// local to the jail's namespace, so these listeners take their connections).
    pub capture: Vec<(u16, TcpListener)>,
}

/// The stub resolver's address pool (RFC 2544's benchmarking range, never routed): local to the
/// jail's namespace as a whole (an address with this prefix on `lo`), one address per name.
pub const STUB_POOL: (Ipv4Addr, u8) = (Ipv4Addr::new(198, 18, 0, 0), 15);
/// The pool address put on `lo` (never handed out for a name).
pub const STUB_LO_ADDRESS: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

/// The ports the stub's capture listeners take: 443, 80 and every port an allow pattern names,
/// except those the jail's loopback already uses for something else (the stub's own 53, the
/// proxy's 3128, `host_ports`, `publish`: a listener on 0.0.0.0:PORT would take them).
pub fn capture_ports(net: &NetworkPlan) -> Vec<u16> {
    let mut ports = vec![443, 80];
    ports.extend(net.allow.iter().filter_map(|p| p.port()));
    ports.sort_unstable();
    ports.dedup();
    ports.retain(|p| {
        *p != PROXY_PORT && *p != 53 && !net.host_ports.contains(p) && !net.publish.contains(p)
    });
    ports
}

/// Put [`STUB_LO_ADDRESS`] with the pool's prefix on `lo` (SIOCSIFADDR + SIOCSIFNETMASK on the
/// label `lo:corral`; no `ip` binary): the kernel then treats the whole pool as local.
pub fn add_stub_pool() -> Result<(), JailError> {
    let (_, prefix) = STUB_POOL;
    let mask = Ipv4Addr::from(u32::MAX << (32 - prefix as u32));
    let sock = config_socket()?;
    for (request, addr, what) in [
        (
            libc::SIOCSIFADDR,
            STUB_LO_ADDRESS,
            "add the stub's address pool to lo",
        ),
        (
            libc::SIOCSIFNETMASK,
            mask,
            "set the prefix of the stub's address pool",
        ),
    ] {
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo:corral\0") {
            *dst = *src as libc::c_char;
        }
        // SAFETY: sockaddr_in is plain old data; all-zero is a valid value.
        let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sin.sin_family = libc::AF_INET as libc::sa_family_t;
        sin.sin_addr.s_addr = u32::from(addr).to_be();
        // SAFETY: ifru_addr is a sockaddr, large enough for a sockaddr_in (both 16 bytes).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&sin as *const libc::sockaddr_in).cast::<u8>(),
                (&mut req.ifr_ifru.ifru_addr as *mut libc::sockaddr).cast::<u8>(),
                std::mem::size_of::<libc::sockaddr_in>(),
            );
        }
        // SAFETY: the ioctl reads an `ifreq` we own, on our own socket.
        if unsafe { libc::ioctl(sock.as_raw_fd(), request, &req) } < 0 {
            return Err(JailError::at(
                what,
                format!("{addr} on lo"),
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

fn config_socket() -> Result<OwnedFd, JailError> {
    // SAFETY: plain socket(2); the result is checked and owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(JailError::step(
            "open a socket to configure lo",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Bring `lo` up with SIOCSIFFLAGS (no `ip` binary).
pub fn bring_up_loopback() -> Result<(), JailError> {
    let sock = config_socket()?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write an `ifreq` we own, on our own socket.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(JailError::at(
                "read the flags of lo",
                "lo",
                std::io::Error::last_os_error(),
            ));
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(JailError::at(
                "bring lo up",
                "lo",
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}

/// The sockets of the stub resolver (`network.dns = "stub"`), created in the current (the
/// jail's) network namespace after [`add_stub_pool`]. Port 53 and the capture ports are
/// privileged: the set-up process holds CAP_NET_BIND_SERVICE in the jail's user namespace.
pub fn create_stub_sockets(net: &mut JailNet, capture: &[u16]) -> Result<(), JailError> {
    let dns = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 53);
    let udp = UdpSocket::bind(dns)
        .map_err(|e| JailError::at("listen inside the jail", format!("udp {dns}"), e))?;
    let tcp = TcpListener::bind(dns)
        .map_err(|e| JailError::at("listen inside the jail", format!("tcp {dns}"), e))?;
    net.dns = Some((udp, tcp));
    for &port in capture {
        let addr = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port);
        let l = TcpListener::bind(addr)
            .map_err(|e| JailError::at("listen inside the jail", addr.to_string(), e))?;
        net.capture.push((port, l));
    }
    Ok(())
}

/// The listeners of a jail, created in the current (the jail's) network namespace.
pub fn create_listeners(proxy: bool, host_ports: &[u16]) -> Result<JailNet, JailError> {
    let listen = |port: u16| {
        TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
            .map_err(|e| JailError::at("listen inside the jail", format!("127.0.0.1:{port}"), e))
    };
    let mut net = JailNet::default();
    if proxy {
        net.proxy = Some(listen(PROXY_PORT)?);
    }
    for &port in host_ports {
        net.host_ports.push((port, listen(port)?));
    }
    Ok(net)
}

#[derive(Serialize, Deserialize)]
struct NetMessage {
    proxy: bool,
    host_ports: Vec<u16>,
    #[serde(default)]
    dns: bool,
    #[serde(default)]
    capture: Vec<u16>,
}

/// Send the listeners to corral over the control socket (SCM_RIGHTS). One message, also sent
/// when there are none: it tells corral the namespaces are ready.
pub fn send_listeners(ctl: RawFd, net: &JailNet) -> Result<(), JailError> {
    let msg = NetMessage {
        proxy: net.proxy.is_some(),
        host_ports: net.host_ports.iter().map(|(p, _)| *p).collect(),
        dns: net.dns.is_some(),
        capture: net.capture.iter().map(|(p, _)| *p).collect(),
    };
    let body =
        serde_json::to_vec(&msg).map_err(|e| JailError::step("encode the net message", e))?;
    let fds: Vec<RawFd> = net
        .proxy
        .iter()
        .map(|l| l.as_raw_fd())
        .chain(net.host_ports.iter().map(|(_, l)| l.as_raw_fd()))
        .chain(
            net.dns
                .iter()
                .flat_map(|(u, t)| [u.as_raw_fd(), t.as_raw_fd()]),
        )
        .chain(net.capture.iter().map(|(_, l)| l.as_raw_fd()))
        .collect();
    send_frame(ctl, &body, &fds)
        .map_err(|e| JailError::step("send the jail's listeners to corral", e))
}

/// One frame on the control socket: a little-endian u32 length, the JSON body, and `fds` as
/// SCM_RIGHTS, in one `sendmsg` (the descriptors travel with the first byte).
pub(crate) fn send_frame(ctl: RawFd, body: &[u8], fds: &[RawFd]) -> nix::Result<()> {
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(body);
    let cmsgs = if fds.is_empty() {
        vec![]
    } else {
        vec![ControlMessage::ScmRights(fds)]
    };
    let mut sent = 0;
    while sent < frame.len() {
        // The descriptors travel with the first byte only.
        let c = if sent == 0 { &cmsgs[..] } else { &[][..] };
        match sendmsg::<()>(
            ctl,
            &[IoSlice::new(&frame[sent..])],
            c,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) => sent += n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A frame's JSON body and the descriptors that came with it.
pub(crate) type Frame = (Vec<u8>, Vec<OwnedFd>);

/// The largest frame body accepted (a Plan is tens of KiB).
const FRAME_MAX: usize = 64 * 1024 * 1024;

/// Receive one frame `send_frame` sent, and nothing of the next (the length is read alone,
/// then exactly the body). `Ok(None)`: the peer closed the socket before the frame began.
pub(crate) fn recv_frame(ctl: RawFd) -> Result<Option<Frame>, JailError> {
    let fail = |e: nix::errno::Errno| JailError::step("read the jail's control socket", e);
    let mut len = [0u8; 4];
    let mut got = 0;
    let mut fds = Vec::new();
    let mut cmsg_space = nix::cmsg_space!([RawFd; 256]);
    while got < len.len() {
        let mut iov = [IoSliceMut::new(&mut len[got..])];
        let msg = match recvmsg::<()>(
            ctl,
            &mut iov,
            Some(&mut cmsg_space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => msg,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(fail(e)),
        };
        for c in msg.cmsgs().map_err(fail)? {
            if let ControlMessageOwned::ScmRights(r) = c {
                // SAFETY: the kernel just installed these descriptors in this process for us.
                fds.extend(r.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        if msg.bytes == 0 && got == 0 {
            return Ok(None);
        }
        if msg.bytes == 0 {
            return Err(JailError::Plan(
                "truncated message on the jail's control socket".into(),
            ));
        }
        got += msg.bytes;
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > FRAME_MAX {
        return Err(JailError::Plan(format!(
            "a {len}-byte message on the jail's control socket is too large"
        )));
    }
    let mut body = vec![0u8; len];
    let mut got = 0;
    while got < len {
        // SAFETY: `ctl` is a descriptor the caller holds open for the duration of this call.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(ctl) };
        match nix::unistd::read(fd, &mut body[got..]) {
            Ok(0) => {
                return Err(JailError::Plan(
                    "truncated message on the jail's control socket".into(),
                ));
            }
            Ok(k) => got += k,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(fail(e)),
        }
    }
    Ok(Some((body, fds)))
}

/// Receive the message `send_listeners` sent. `Ok(None)`: the set-up process closed the socket
/// first (it failed; it printed why).
pub fn recv_listeners(ctl: RawFd) -> Result<Option<JailNet>, JailError> {
    let Some((body, fds)) = recv_frame(ctl)? else {
        return Ok(None);
    };
    let mut owned: std::collections::VecDeque<OwnedFd> = fds.into();
    let msg: NetMessage = serde_json::from_slice(&body)
        .map_err(|e| JailError::step("decode the jail's net message", e))?;
    let mut take = || {
        owned.pop_front().ok_or_else(|| {
            JailError::Plan("the jail sent fewer listeners than it announced".into())
        })
    };
    let mut net = JailNet::default();
    if msg.proxy {
        net.proxy = Some(take()?.into());
    }
    for port in msg.host_ports {
        net.host_ports.push((port, take()?.into()));
    }
    if msg.dns {
        net.dns = Some((take()?.into(), take()?.into()));
    }
    for port in msg.capture {
        net.capture.push((port, take()?.into()));
    }
    Ok(Some(net))
}

/// What corral may ask the set-up process for once the jail runs.
#[derive(Debug, Serialize, Deserialize)]
enum SocketRequest {
    /// An unbound, unconnected IPv4 TCP socket (corral connects it to the jail's loopback).
    Tcp4,
}

#[derive(Debug, Serialize, Deserialize)]
struct SocketReply {
    /// Why no socket came back.
    error: Option<String>,
}

/// corral's end of the jail's socket factory: the control socket, kept open after the
/// listeners arrived. The set-up process (outside the jail's PID namespace, never reachable
/// from the jail) answers each request with a socket made in the jail's network namespace;
/// a socket keeps the namespace it was created in, so corral connects it from outside.
#[derive(Debug)]
pub struct SocketFactory {
    ctl: std::sync::Mutex<OwnedFd>,
}

impl SocketFactory {
    pub(crate) fn new(ctl: OwnedFd) -> SocketFactory {
        SocketFactory {
            ctl: std::sync::Mutex::new(ctl),
        }
    }

    /// A fresh IPv4 TCP socket in the jail's network namespace (blocking mode, close-on-exec).
    /// Blocks for one round trip to the set-up process; fails once the jail has exited.
    pub fn tcp4(&self) -> std::io::Result<std::net::TcpStream> {
        let ctl = self
            .ctl
            .lock()
            .map_err(|_| std::io::Error::other("the jail's socket factory is poisoned"))?;
        let body = serde_json::to_vec(&SocketRequest::Tcp4).map_err(std::io::Error::other)?;
        send_frame(ctl.as_raw_fd(), &body, &[]).map_err(std::io::Error::from)?;
        let (reply, mut fds) = recv_frame(ctl.as_raw_fd())
            .map_err(std::io::Error::other)?
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "the jail has exited (its set-up process closed the socket factory)",
                )
            })?;
        let reply: SocketReply = serde_json::from_slice(&reply).map_err(std::io::Error::other)?;
        if let Some(e) = reply.error {
            return Err(std::io::Error::other(format!(
                "the jail's set-up process could not make a socket: {e}"
            )));
        }
        match fds.pop() {
            Some(fd) if fds.is_empty() => Ok(std::net::TcpStream::from(fd)),
            _ => Err(std::io::Error::other(
                "the jail's socket factory answered without exactly one socket",
            )),
        }
    }
}

/// The set-up process's side: answer one request waiting on `ctl`. `Ok(false)`: corral closed
/// the socket (no more requests will come).
pub(crate) fn serve_socket_request(ctl: RawFd) -> Result<bool, JailError> {
    let Some((body, fds)) = recv_frame(ctl)? else {
        return Ok(false);
    };
    drop(fds); // corral sends none; never keep what arrives
    let made = match serde_json::from_slice::<SocketRequest>(&body) {
        Ok(SocketRequest::Tcp4) => {
            // SAFETY: plain socket(2); the result is checked and owned below.
            let fd =
                unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
            if fd < 0 {
                Err(std::io::Error::last_os_error().to_string())
            } else {
                // SAFETY: `fd` is a fresh descriptor we own.
                Ok(unsafe { OwnedFd::from_raw_fd(fd) })
            }
        }
        Err(e) => Err(format!("unknown request: {e}")),
    };
    let (reply, fds) = match &made {
        Ok(fd) => (SocketReply { error: None }, vec![fd.as_raw_fd()]),
        Err(e) => (
            SocketReply {
                error: Some(e.clone()),
            },
            vec![],
        ),
    };
    let body =
        serde_json::to_vec(&reply).map_err(|e| JailError::step("encode a socket reply", e))?;
    send_frame(ctl, &body, &fds)
        .map_err(|e| JailError::step("answer corral's socket request", e))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    use std::io::{Read, Write};

    fn ephemeral() -> TcpListener {
        TcpListener::bind("127.0.0.1:0").unwrap()
    }

    #[test]
    fn listeners_cross_the_control_socket_and_still_accept() {
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let sent = JailNet {
            proxy: Some(ephemeral()),
            host_ports: vec![(11434, ephemeral()), (8080, ephemeral())],
            ..Default::default()
        };
        let addrs: Vec<_> = sent
            .proxy
            .iter()
            .chain(sent.host_ports.iter().map(|(_, l)| l))
            .map(|l| l.local_addr().unwrap())
            .collect();
        send_listeners(a.as_raw_fd(), &sent).unwrap();
        drop(sent); // the sender's copies are gone; the received ones keep the sockets open
        let got = recv_listeners(b.as_raw_fd()).unwrap().expect("a message");
        let ports: Vec<u16> = got.host_ports.iter().map(|(p, _)| *p).collect();
        assert_eq!(ports, vec![11434, 8080]);
        let got_addrs: Vec<_> = got
            .proxy
            .iter()
            .chain(got.host_ports.iter().map(|(_, l)| l))
            .map(|l| l.local_addr().unwrap())
            .collect();
        assert_eq!(got_addrs, addrs);
        let proxy = got.proxy.unwrap();
        let mut client = std::net::TcpStream::connect(addrs[0]).unwrap();
        let (mut conn, _) = proxy.accept().unwrap();
        client.write_all(b"hi").unwrap();
        let mut buf = [0u8; 2];
        conn.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
    }

    #[test]
    fn an_empty_message_means_ready_without_listeners_and_eof_means_failure() {
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        send_listeners(a.as_raw_fd(), &JailNet::default()).unwrap();
        let got = recv_listeners(b.as_raw_fd()).unwrap().expect("a message");
        assert!(got.proxy.is_none() && got.host_ports.is_empty());
        drop(a);
        assert!(recv_listeners(b.as_raw_fd()).unwrap().is_none());
    }

    #[test]
    fn the_socket_factory_hands_out_fresh_sockets_until_corral_closes_it() {
        let (corral, setup) = socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let server = std::thread::spawn(move || {
            let mut served = 0;
            while serve_socket_request(setup.as_raw_fd()).unwrap() {
                served += 1;
            }
            served
        });
        let factory = SocketFactory::new(corral);
        let origin = ephemeral();
        for _ in 0..2 {
            let sock = factory.tcp4().unwrap();
            // An unconnected socket: connect it where corral wants.
            assert!(sock.peer_addr().is_err());
            let port = origin.local_addr().unwrap().port();
            // SAFETY: sockaddr_in is plain old data; all-zero is valid before we fill it.
            let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = port.to_be();
            sin.sin_addr.s_addr = u32::from(Ipv4Addr::LOCALHOST).to_be();
            // SAFETY: connect(2) on a socket we own with a sockaddr_in of the size we pass.
            let rc = unsafe {
                libc::connect(
                    sock.as_raw_fd(),
                    (&sin as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
            let (mut conn, _) = origin.accept().unwrap();
            let mut sock = sock;
            sock.write_all(b"ok").unwrap();
            let mut buf = [0u8; 2];
            conn.read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"ok");
        }
        drop(factory);
        assert_eq!(server.join().unwrap(), 2);
    }

    #[test]
    fn capture_ports_leave_the_jails_own_loopback_ports_alone() {
        let mut net = corral_policy::plan::Plan::minimal(
            std::path::Path::new("/p"),
            std::path::Path::new("/h"),
            vec!["true".into()],
        )
        .network;
        net.allow = [
            "a.example:8443",
            "b.example",
            "c.example:53",
            "d.example:3128",
            "e.example:11434",
            "f.example:3000",
            "g.example:8443",
        ]
        .iter()
        .map(|p| corral_policy::domain::DomainPattern::parse(p).unwrap())
        .collect();
        net.host_ports = vec![11434, 80];
        net.publish = vec![3000];
        assert_eq!(capture_ports(&net), vec![443, 8443]);
    }
}
