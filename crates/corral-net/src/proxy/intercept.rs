//! Connections the credential gateway intercepts: secret-bound hosts, and hosts decided by
//! method and path ([`Rules::check_request`]).

use super::*;

/// The proxy's decision of each request in a connection the gateway intercepted for a host
/// decided by method and path ([`Rules::check_request`]).
struct PathGate<'a> {
    proxy: &'a Proxy,
    peer: &'a str,
    host: &'a Host,
    port: u16,
    kind: Kind,
    address: SocketAddr,
}

impl corral_gateway::RequestGate for PathGate<'_> {
    fn decide(&self, method: &str, target: &str) -> Result<String, corral_gateway::Refusal> {
        let dest = (self.host, self.port, self.kind);
        self.proxy
            .decide_request(self.peer, dest, Some(self.address), method, target)
            .map_err(|(status, message)| corral_gateway::Refusal { status, message })
    }
}

impl Proxy {
    /// Owe the close record of a connection the gateway intercepts; `None` once the proxy
    /// shuts down, with the refusal counted and the connection's close record written (the
    /// caller drops the connection).
    fn owe_intercepted(&self, dest: Dest<'_>) -> Option<crate::open::Owed> {
        let owed = self.open.register(dest);
        if owed.is_none() {
            self.refusals.hit(LISTENER, reason::ENDING);
            let Dest {
                peer,
                method,
                to,
                address,
                started,
            } = dest;
            self.log_close(peer, method, to, address, 0, 0, started);
        }
        owed
    }

    /// The run's gateway, if any, with the proxy's deadlines and its budget for the jail's
    /// request heads: a head read inside the tunnel is counted with every other one the jail
    /// makes corral hold.
    fn bounded_gateway(&self) -> Option<corral_gateway::Gateway> {
        let gw = self.gateway.as_ref()?;
        Some(
            gw.clone()
                .with_timeouts(http::io::Timeouts {
                    head: self.config.header_timeout,
                    idle: self.config.idle_timeout,
                })
                .with_budget(self.buffers.clone()),
        )
    }

    /// Hand an allowed connection to a secret-bound `host:port` to the gateway (TLS terminated,
    /// placeholders swapped; failures are in the audit log, the gateway writes them), then log
    /// its close line. `client`'s buffered bytes (a TLS hello sent early) go first.
    pub(super) async fn intercept<S>(
        &self,
        client: BufConn<S>,
        up: TcpStream,
        (host, port, address): (&Host, u16, SocketAddr),
        peer: &str,
        method: &str,
        started: Instant,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Some(gw) = self.bounded_gateway() else {
            return;
        };
        let stream = corral_gateway::Prefixed::new(client.buf.to_vec(), client.io);
        // The gateway's counts (of the requests and answers) come only when it returns: cut
        // at shutdown, the record has the bytes on the wire to the destination instead.
        let shown = host_display(host);
        let dest = Dest {
            peer,
            method,
            to: Destination::new(&shown, port),
            address,
            started,
        };
        let Some(owed) = self.owe_intercepted(dest) else {
            return;
        };
        let up = owed.counted(up);
        let (bytes_up, bytes_down) = gw
            .intercept_over(stream, up, host, port, address, peer)
            .await
            .map_or((0, 0), |s| (s.bytes_up, s.bytes_down));
        owed.close(bytes_up, bytes_down);
    }

    /// The rule of a host allowed whole, or for a host decided by method and path the rule
    /// set and `true`, when the gateway can terminate its TLS; else the denial: such a host is
    /// never an opaque tunnel.
    pub(super) fn interceptable(&self, host: &Host, a: Allowed) -> Result<(String, bool), Denial> {
        match a {
            Allowed::Host(rule) => Ok((rule, false)),
            Allowed::Paths(set) if self.gateway.as_ref().is_some_and(|g| g.can_intercept(host)) => {
                Ok((format!("{set} (each request decided)"), true))
            }
            Allowed::Paths(set) => Err(Denial {
                rule: format!(
                    "{set}: deciding its requests needs the run's CA, and this run's CA cannot sign for {}",
                    host_display(host)
                ),
                fix: "path rules added while the jail runs take effect at the next run".into(),
                status: 403,
            }),
        }
    }

    /// [`Proxy::intercept`] for a host decided by method and path: every request goes through
    /// [`PathGate`] before it is forwarded.
    pub(super) async fn intercept_paths<S>(
        &self,
        client: BufConn<S>,
        up: TcpStream,
        (host, port, address, kind): (&Host, u16, SocketAddr, Kind),
        peer: &str,
        method: &str,
        started: Instant,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Some(gw) = self.bounded_gateway() else {
            return;
        };
        let gate = PathGate {
            proxy: self,
            peer,
            host,
            port,
            kind,
            address,
        };
        let stream = corral_gateway::Prefixed::new(client.buf.to_vec(), client.io);
        // The gateway's counts (of the requests and answers) come only when it returns: cut
        // at shutdown, the record has the bytes on the wire to the destination instead.
        let shown = host_display(host);
        let dest = Dest {
            peer,
            method,
            to: Destination::new(&shown, port),
            address,
            started,
        };
        let Some(owed) = self.owe_intercepted(dest) else {
            return;
        };
        let up = owed.counted(up);
        let (bytes_up, bytes_down) = gw
            .intercept_gated(stream, up, host, port, address, peer, &gate)
            .await
            .map_or((0, 0), |s| (s.bytes_up, s.bytes_down));
        owed.close(bytes_up, bytes_down);
    }

    /// The credential gateway's step for a plain-HTTP request: placeholders swapped (audited
    /// as injected once sent), and for a secret-bound host the scrubber its answer goes
    /// through; `None` when the gateway refuses the request (answered, audited by it).
    pub(super) async fn gateway_step<S>(
        &self,
        client: &mut BufConn<S>,
        (method, path): (&str, &str),
        headers: &mut Vec<http::Header>,
        (host, port): (&Host, u16),
        peer: &str,
    ) -> Option<PlainRewrite<'_>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Some(gw) = &self.gateway else {
            return Some((None, None));
        };
        match gw.rewrite_plain_headers(method, path, headers, host, port, peer) {
            Ok(report) => {
                let scrub = gw.binds(host, port).then(|| {
                    identity_only(headers);
                    gw.scrubber()
                });
                Some((Some((gw, report)), scrub))
            }
            Err(r) => {
                let body = format!("{}\n", r.message);
                self.reply_and_close(&mut client.io, r.status, &body).await;
                None
            }
        }
    }
}
