//! CONNECT tunnels, and connections captured by the jail's network capture: decided, dialled,
//! then handed out as an established tunnel.

use super::*;

/// An established tunnel, handed out of the phase that decided it (whose state is then freed).
pub(super) struct Tunnel<S> {
    pub(super) client: S,
    pub(super) up: TcpStream,
    pub(super) meta: TunnelMeta,
}

/// What the close line of a tunnel says besides the byte counts.
pub(super) struct TunnelMeta {
    pub(super) method: &'static str,
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) address: SocketAddr,
    pub(super) started: Instant,
    /// Bytes the client sent before the tunnel was established, already written upstream.
    pub(super) early: u64,
}

impl TunnelMeta {
    pub(super) fn to(&self) -> Destination<'_> {
        Destination::new(&self.host, self.port)
    }
}

/// The task of an established tunnel: the relay, then its close line; the connection's slot is
/// released when it ends.
pub(super) struct TunnelTask<S> {
    relay: RecordedRelay<S, TcpStream>,
    proxy: Arc<Proxy>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Future for TunnelTask<S> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let t = self.get_mut();
        if Pin::new(&mut t.relay).poll(cx).is_pending() {
            return Poll::Pending;
        }
        t.proxy.closed.fetch_add(1, Ordering::Relaxed);
        Poll::Ready(())
    }
}

impl Proxy {
    /// Decide and dial a CONNECT. An established plain tunnel is handed back (the caller runs
    /// it once this phase's state is freed); refusals and gateway-intercepted tunnels are
    /// finished here.
    pub(super) async fn connect<S>(
        &self,
        mut client: BufConn<S>,
        req: RequestHead,
        peer: &str,
    ) -> Option<Tunnel<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let target = req.target.clone();
        let parsed = check_authority_chars(&target)
            .map_err(str::to_string)
            .and_then(|()| parse_authority(&target).map_err(|e| e.to_string()));
        let (host, port) = match parsed {
            Ok((h, Some(p))) => (h, p),
            Ok((_, None)) => {
                self.log_bad(peer, "CONNECT", &target, "CONNECT target without a port");
                self.reply_and_close(&mut client.io, 400, "corral: CONNECT needs HOST:PORT\n")
                    .await;
                return None;
            }
            Err(e) => {
                self.log_bad(peer, "CONNECT", &target, &e);
                self.reply_and_close(
                    &mut client.io,
                    400,
                    &format!("corral: invalid CONNECT target {target:?}: {e}\n"),
                )
                .await;
                return None;
            }
        };
        let shown = host_display(&host);
        if req.framing != Framing::None {
            self.log_bad(peer, "CONNECT", &target, "CONNECT with a body");
            self.reply_and_close(&mut client.io, 400, "corral: CONNECT with a body\n")
                .await;
            return None;
        }
        if let Err(why) = host_header_agrees(&req, &host, port, 443) {
            let d = Denial {
                rule: why.clone(),
                fix: "send a Host header that matches the request target".into(),
                status: 400,
            };
            self.log_denial(peer, "CONNECT", Destination::new(&shown, port), &d);
            self.reply_and_close(&mut client.io, 400, &format!("corral: {why}\n"))
                .await;
            return None;
        }
        self.tunnel_decided(client, host, port, peer, "CONNECT", Kind::Connect, true)
            .await
    }

    /// A connection a jail process made directly to an address the stub resolver handed out
    /// for `host` (corral-net's `netcap.rs`, `network.dns = "stub"`): decided, resolved,
    /// checked, dialled and audited exactly as `CONNECT host:port`, as method `CAPTURE`,
    /// without the CONNECT exchange: a denial or a failure closes the connection. Port 80 goes
    /// through the plain-HTTP path instead, each request pinned to `host` (its `Host` header
    /// must name it), answered and audited as proxied requests are.
    pub async fn capture<S>(self: Arc<Self>, stream: S, client: String, host: Host, port: u16)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            self.refusals.hit("the stub's capture", reason::CONNECTIONS);
            return;
        };
        let stopping = self.open.clone();
        let decide = async {
            if port == 80 {
                // Plain HTTP: the proxy's own HTTP path, every request's Host pinned to the name.
                Box::pin(self.http_pinned(BufConn::new(stream), &client, Some((host, port)))).await
            } else {
                Box::pin(self.tunnel_decided(
                    BufConn::new(stream),
                    host,
                    port,
                    &client,
                    "CAPTURE",
                    Kind::Connect,
                    false,
                ))
                .await
            }
        };
        let decided = tokio::select! {
            t = decide => t,
            () = stopping.stopping() => None,
        };
        match decided.and_then(|t| self.clone().run_tunnel(t, client, permit)) {
            Some(task) => task.await,
            None => {
                self.closed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Relay a decided tunnel until it ends, then log its close line (see [`TunnelTask`]);
    /// `None` when the proxy shuts down meanwhile (the tunnel is closed, its line logged).
    pub(super) fn run_tunnel<S>(
        self: Arc<Self>,
        t: Tunnel<S>,
        peer: String,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Option<TunnelTask<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let m = &t.meta;
        let dest = Dest {
            peer: &peer,
            method: m.method,
            to: m.to(),
            address: m.address,
            started: m.started,
        };
        let Some(owed) = self.open.register(dest) else {
            self.log_close(&peer, m.method, m.to(), m.address, m.early, 0, m.started);
            return None;
        };
        let relay = tunnel(
            t.client,
            t.up,
            self.config.idle_timeout,
            Some(self.pending.clone()),
        );
        Some(TunnelTask {
            relay: RecordedRelay::new(relay, owed, t.meta.early),
            proxy: self,
            _permit: permit,
        })
    }

    /// The decision and tunnel of a CONNECT (answered when `answer`) or a captured connection.
    #[allow(clippy::too_many_arguments)]
    async fn tunnel_decided<S>(
        &self,
        mut client: BufConn<S>,
        host: Host,
        port: u16,
        peer: &str,
        method: &'static str,
        kind: Kind,
        answer: bool,
    ) -> Option<Tunnel<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let shown = host_display(&host);
        let (rules, decided) =
            Box::pin(self.decide_asking(&mut client, (&host, port, kind), method, peer)).await?;
        let decided = decided.and_then(|a| self.interceptable(&host, a));
        let (rule, per_request) = match decided {
            Ok(x) => x,
            Err(d) => {
                self.log_denial(peer, method, Destination::new(&shown, port), &d);
                if answer {
                    let body = Self::denial_body(method, &authority_string(&host, port), &d);
                    self.reply_and_close(&mut client.io, d.status, &body).await;
                }
                return None;
            }
        };
        let (mut up, address) = match Box::pin(self.dial(&rules, &host, port)).await {
            Ok(x) => x,
            Err(r) if answer => {
                self.refuse(&mut client.io, peer, method, &host, port, r)
                    .await;
                return None;
            }
            Err(r) => {
                // No channel to answer on: the refusal is logged and the connection closed.
                let mut sink = tokio::io::sink();
                self.refuse(&mut sink, peer, method, &host, port, r).await;
                return None;
            }
        };
        if !self.log_decision(
            peer,
            method,
            Destination::new(&shown, port),
            Some(address),
            Decision::Allow,
            &rule,
        ) {
            // Fail closed: no tunnel the log does not show.
            if answer {
                self.reply_and_close(&mut client.io, 503, Self::UNRECORDED)
                    .await;
            }
            return None;
        }
        let started = Instant::now();
        if answer
            && client
                .io
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .is_err()
        {
            // The client went away: the connection dialled for it is closed, and recorded.
            self.log_close(
                peer,
                method,
                Destination::new(&shown, port),
                address,
                0,
                0,
                started,
            );
            return None;
        }
        // A host decided by method and path: TLS terminated with the run's CA, each request
        // decided (and, for a secret-bound one, its placeholder swapped after).
        if per_request {
            let dest = (&host, port, address, kind);
            Box::pin(self.intercept_paths(client, up, dest, peer, method, started)).await;
            return None;
        }
        // A secret-bound name (never an IP literal): the gateway terminates TLS and swaps the
        // placeholder, over the connection dialled above to the checked address.
        if self.gateway.as_ref().is_some_and(|g| g.binds(&host, port)) {
            let dest = (&host, port, address);
            Box::pin(self.intercept(client, up, dest, peer, method, started)).await;
            return None;
        }
        // Bytes the client sent after the CONNECT head (a TLS hello, say) go first.
        let BufConn { io, buf } = client;
        let early = buf.len() as u64;
        if early > 0 && up.write_all(&buf).await.is_err() {
            self.log_close(
                peer,
                method,
                Destination::new(&shown, port),
                address,
                0,
                0,
                started,
            );
            return None;
        }
        Some(Tunnel {
            client: io,
            up,
            meta: TunnelMeta {
                method,
                host: shown,
                port,
                address,
                started,
                early,
            },
        })
    }
}
