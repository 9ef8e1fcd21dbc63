//! SOCKS5: the greeting, the request and its address, answered and handed out as a tunnel.

use super::*;

/// DST.ADDR of a SOCKS5 request of address type `atyp`, read by `deadline`: the host, or why
/// it is not one; `None` when the client went away or was too slow, or named an unknown
/// address type (answered REP=8).
async fn read_socks_address<S>(
    client: &mut BufConn<S>,
    atyp: u8,
    deadline: Instant,
) -> Option<Result<Host, String>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let t = deadline;
    let host = match atyp {
        1 => {
            let b = client.read_exact_by(4, t).await.ok()?;
            Ok(Host::Ip(IpAddr::from([b[0], b[1], b[2], b[3]])))
        }
        4 => {
            let b = client.read_exact_by(16, t).await.ok()?;
            let mut a = [0u8; 16];
            a.copy_from_slice(&b);
            Ok(Host::Ip(IpAddr::from(a)))
        }
        3 => {
            let len = client.read_exact_by(1, t).await.ok()?;
            let name = client.read_exact_by(len[0] as usize, t).await.ok()?;
            match std::str::from_utf8(&name) {
                Ok(n) if !n.contains(['%', '@', '/', ':', '[', ']']) => {
                    normalize_host(n).map_err(|e| e.to_string())
                }
                _ => Err(format!(
                    "invalid SOCKS5 host name {:?}",
                    String::from_utf8_lossy(&name)
                )),
            }
        }
        _ => {
            let _ = client.io.write_all(&[5, 8, 0, 1, 0, 0, 0, 0, 0, 0]).await;
            return None;
        }
    };
    Some(host)
}

impl Proxy {
    pub(super) async fn socks<S>(&self, mut client: BufConn<S>, peer: &str) -> Option<Tunnel<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let (host, port) = self.socks_request(&mut client, peer).await?;
        let shown = host_display(&host);
        let reply = |code: u8| [5, code, 0, 1, 0, 0, 0, 0, 0, 0];
        let dest = (&host, port, Kind::Socks);
        let (rules, decided) =
            Box::pin(self.decide_asking(&mut client, dest, "SOCKS5", peer)).await?;
        let decided = decided.and_then(|a| self.interceptable(&host, a));
        let (rule, per_request) = match decided {
            Ok(x) => x,
            Err(d) => {
                self.log_denial(peer, "SOCKS5", Destination::new(&shown, port), &d);
                let _ = client.io.write_all(&reply(2)).await;
                return None;
            }
        };
        let (mut up, address) = match Box::pin(self.dial(&rules, &host, port)).await {
            Ok(x) => x,
            Err(Refusal::Denied(d)) => {
                self.log_denial(peer, "SOCKS5", Destination::new(&shown, port), &d);
                let _ = client.io.write_all(&reply(2)).await;
                return None;
            }
            Err(Refusal::Failed { rule, .. }) => {
                let why = format!("allowed, but {rule}");
                let _ = self.log_decision(
                    peer,
                    "SOCKS5",
                    Destination::new(&shown, port),
                    None,
                    Decision::Allow,
                    &why,
                );
                self.note_failed("SOCKS5", &format!("{shown}:{port}"), &rule);
                let _ = client.io.write_all(&reply(4)).await;
                return None;
            }
        };
        let allowed = Decision::Allow;
        if !self.log_decision(
            peer,
            "SOCKS5",
            Destination::new(&shown, port),
            Some(address),
            allowed,
            &rule,
        ) {
            // Fail closed: REP=1, general failure.
            let _ = client.io.write_all(&reply(1)).await;
            return None;
        }
        let started = Instant::now();
        if client.io.write_all(&reply(0)).await.is_err() {
            self.log_close(
                peer,
                "SOCKS5",
                Destination::new(&shown, port),
                address,
                0,
                0,
                started,
            );
            return None;
        }
        // A host decided by method and path, as a CONNECT to it: never an opaque tunnel.
        if per_request {
            let dest = (&host, port, address, Kind::Socks);
            Box::pin(self.intercept_paths(client, up, dest, peer, "SOCKS5", started)).await;
            return None;
        }
        // A secret-bound name goes through the gateway, as a CONNECT to it does: never an
        // opaque tunnel that would skip the swap.
        if self.gateway.as_ref().is_some_and(|g| g.binds(&host, port)) {
            let dest = (&host, port, address);
            Box::pin(self.intercept(client, up, dest, peer, "SOCKS5", started)).await;
            return None;
        }
        let BufConn { io, buf } = client;
        let early = buf.len() as u64;
        if early > 0 && up.write_all(&buf).await.is_err() {
            self.log_close(
                peer,
                "SOCKS5",
                Destination::new(&shown, port),
                address,
                0,
                0,
                started,
            );
            return None;
        }
        let meta = TunnelMeta {
            method: "SOCKS5",
            host: shown,
            port,
            address,
            started,
            early,
        };
        Some(Tunnel {
            client: io,
            up,
            meta,
        })
    }

    /// The SOCKS5 greeting and CONNECT request: the destination, or `None` when the client
    /// went away, was too slow, or asked for something refused (answered and logged).
    async fn socks_request<S>(&self, client: &mut BufConn<S>, peer: &str) -> Option<(Host, u16)>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        // One deadline for the whole handshake, as for an HTTP head: a client dribbling one
        // byte at a time cannot hold a connection longer than that.
        let t = Instant::now() + self.config.header_timeout;
        // Greeting: VER NMETHODS METHODS...
        let hdr = client.read_exact_by(2, t).await.ok()?;
        let methods = client.read_exact_by(hdr[1] as usize, t).await.ok()?;
        if !methods.contains(&0) {
            self.log_bad(
                peer,
                "SOCKS5",
                "?",
                "no acceptable authentication method (only none)",
            );
            let _ = client.io.write_all(&[5, 0xff]).await;
            return None;
        }
        client.io.write_all(&[5, 0]).await.ok()?;
        // Request: VER CMD RSV ATYP DST.ADDR DST.PORT
        let req = client.read_exact_by(4, t).await.ok()?;
        let reply = |code: u8| [5, code, 0, 1, 0, 0, 0, 0, 0, 0];
        if req[0] != 5 || req[2] != 0 {
            self.log_bad(peer, "SOCKS5", "?", "invalid SOCKS5 request header");
            return None;
        }
        if !matches!(req[3], 1 | 3 | 4) {
            let why = format!("unknown SOCKS5 address type {}", req[3]);
            self.log_bad(peer, "SOCKS5", "?", &why);
        }
        let host = read_socks_address(client, req[3], t).await?;
        let port = client.read_exact_by(2, t).await.ok()?;
        let port = u16::from_be_bytes([port[0], port[1]]);
        let host = match host {
            Ok(h) => h,
            Err(why) => {
                self.log_bad(peer, "SOCKS5", "?", &why);
                let _ = client.io.write_all(&reply(1)).await;
                return None;
            }
        };
        if req[1] != 1 {
            let d = Denial {
                rule: "only SOCKS5 CONNECT is supported".into(),
                fix: "use CONNECT".into(),
                status: 400,
            };
            self.log_denial(
                peer,
                "SOCKS5",
                Destination::new(&host_display(&host), port),
                &d,
            );
            let _ = client.io.write_all(&reply(7)).await;
            return None;
        }
        Some((host, port))
    }
}
