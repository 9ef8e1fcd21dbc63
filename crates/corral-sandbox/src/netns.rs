//! The jail's network namespace side: loopback up, and the listeners corral accepts on from
//! outside (a socket keeps the namespace it was created in, so no bridge process is needed).

use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};

use crate::error::JailError;

/// Where the jail's processes find corral's proxy: 127.0.0.1:3128 inside the jail.
pub const PROXY_PORT: u16 = 3128;

/// Listening sockets created inside the jail's network namespace, held by corral only. The jail's
/// own processes never hold them: accept on them from outside to serve the jail.
#[derive(Debug, Default)]
pub struct JailNet {
    /// The jail's 127.0.0.1:3128 (network mode `proxy`).
    pub proxy: Option<TcpListener>,
    /// The jail's 127.0.0.1:PORT for each `network.host_ports` entry.
    pub host_ports: Vec<(u16, TcpListener)>,
}

/// Bring `lo` up with SIOCSIFFLAGS (no `ip` binary).
pub fn bring_up_loopback() -> Result<(), JailError> {
    // SAFETY: plain socket(2); the result is checked and owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(JailError::step(
            "open a socket to configure lo",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
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
}

/// Send the listeners to corral over the control socket (SCM_RIGHTS). One message, also sent
/// when there are none: it tells corral the namespaces are ready.
pub fn send_listeners(ctl: RawFd, net: &JailNet) -> Result<(), JailError> {
    let msg = NetMessage {
        proxy: net.proxy.is_some(),
        host_ports: net.host_ports.iter().map(|(p, _)| *p).collect(),
    };
    let body =
        serde_json::to_vec(&msg).map_err(|e| JailError::step("encode the net message", e))?;
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    let fds: Vec<RawFd> = net
        .proxy
        .iter()
        .map(|l| l.as_raw_fd())
        .chain(net.host_ports.iter().map(|(_, l)| l.as_raw_fd()))
        .collect();
    let cmsgs = if fds.is_empty() {
        vec![]
    } else {
        vec![ControlMessage::ScmRights(&fds)]
    };
    sendmsg::<()>(
        ctl,
        &[IoSlice::new(&frame)],
        &cmsgs,
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| JailError::step("send the jail's listeners to corral", e))?;
    Ok(())
}

/// Receive the message `send_listeners` sent. `Ok(None)`: the set-up process closed the socket
/// first (it failed; it printed why).
pub fn recv_listeners(ctl: RawFd) -> Result<Option<JailNet>, JailError> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut cmsg_space = nix::cmsg_space!([RawFd; 256]);
    let (n, fds) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = loop {
            match recvmsg::<()>(
                ctl,
                &mut iov,
                Some(&mut cmsg_space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                other => break other,
            }
        }
        .map_err(|e| JailError::step("receive the jail's listeners", e))?;
        let mut fds = Vec::new();
        for c in msg
            .cmsgs()
            .map_err(|e| JailError::step("read SCM_RIGHTS", e))?
        {
            if let ControlMessageOwned::ScmRights(r) = c {
                fds.extend(r);
            }
        }
        (msg.bytes, fds)
    };
    // SAFETY: the kernel just installed these descriptors in this process for us alone.
    let mut owned: std::collections::VecDeque<OwnedFd> = fds
        .into_iter()
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    if n == 0 {
        return Ok(None);
    }
    if n < 4 {
        return Err(JailError::Plan(
            "short message on the jail's control socket".into(),
        ));
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if n != 4 + len {
        return Err(JailError::Plan(
            "truncated message on the jail's control socket".into(),
        ));
    }
    let msg: NetMessage = serde_json::from_slice(&buf[4..n])
        .map_err(|e| JailError::step("decode the jail's net message", e))?;
    let mut take = || {
        owned.pop_front().map(TcpListener::from).ok_or_else(|| {
            JailError::Plan("the jail sent fewer listeners than it announced".into())
        })
    };
    let mut net = JailNet::default();
    if msg.proxy {
        net.proxy = Some(take()?);
    }
    for port in msg.host_ports {
        net.host_ports.push((port, take()?));
    }
    Ok(Some(net))
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
}
