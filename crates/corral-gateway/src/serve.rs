//! One intercepted connection: the jail's TLS terminated, then the proxy's own request loop
//! (`corral_http1::exchange`: one buffered connection, one relay, one set of limits, timeouts
//! and error statuses) with the gateway's per-request steps: each request checked (origin-form
//! only, `Host` must name the destination, no CONNECT or TRACE), its credential headers
//! swapped, `Accept-Encoding: identity` asked, the swap audited once the head was really sent,
//! and each response's headers and body scrubbed of every real value before they reach the
//! jail.

use std::net::SocketAddr;

use corral_audit::Decision;
use corral_http1::exchange::{
    self, Done, Flow, HeadRefusal, Moved, Outgoing, Requests, identity_only, serve_requests,
};
use corral_http1::io::{BufConn, Replacer, error_response};
use corral_http1::{Header, RequestHead, Version, connection_tokens, header_values};
use corral_policy::domain::Host;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::encodings;
use crate::ws::FrameScrubber;
use crate::{
    Dest, Gateway, GatewayError, HANDSHAKE, InterceptStats, Refusal, RequestGate,
    path_without_query,
};

/// What the jail is told a refusal comes from.
const PREFIX: &str = "corral credential gateway: ";

/// The gateway's steps in the shared request loop, and the connection's state between
/// requests.
struct Intercepted<'a, U, F> {
    gw: &'a Gateway,
    /// The TLS connection to the real host, opened at the first request.
    up: Option<BufConn<tokio_rustls::client::TlsStream<U>>>,
    connect: Option<F>,
    moved: Moved,
    requests: u64,
    name: &'a str,
    host: &'a Host,
    port: u16,
    addr: SocketAddr,
    client: &'a str,
    /// The proxy's per-request decision, for a host decided by method and path.
    gate: Option<&'a dyn RequestGate>,
    /// Why the connection ended early (refusals are answered and audited already).
    error: Option<GatewayError>,
}

impl<U, F> Intercepted<'_, U, F> {
    fn stats(&self) -> InterceptStats {
        InterceptStats {
            requests: self.requests,
            bytes_up: self.moved.up,
            bytes_down: self.moved.down,
        }
    }
}

impl Gateway {
    pub(crate) async fn serve_inner<S, U, F, Fut>(
        &self,
        client: S,
        (host, port, addr): (&Host, u16, SocketAddr),
        client_label: &str,
        gate: Option<&dyn RequestGate>,
        connect: F,
    ) -> Result<InterceptStats, GatewayError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
        U: AsyncRead + AsyncWrite + Unpin + Send,
        F: FnOnce() -> Fut + Send,
        Fut: std::future::Future<Output = Result<U, GatewayError>> + Send,
    {
        let name = match host {
            Host::Name(n) if self.binds(host, port) => n.clone(),
            // Decided per request by the proxy: any name the run CA may sign for.
            Host::Name(n) if gate.is_some() && self.inner.ca.permits(n) => n.clone(),
            _ => {
                return Err(GatewayError::NotBound {
                    host: host.to_string(),
                    port,
                });
            }
        };
        let tls = self
            .accept_tls(client, &name, host, port, addr, client_label)
            .await?;
        let mut down = BufConn::new(tls);
        let mut steps = Intercepted {
            gw: self,
            up: None,
            connect: Some(connect),
            moved: Moved::default(),
            requests: 0,
            name: &name,
            host,
            port,
            addr,
            client: client_label,
            gate,
            error: None,
        };
        let upgraded = serve_requests(&mut down, &mut steps, self.timeouts, &self.budget)
            .await
            .is_some();
        if let Some(e) = steps.error.take() {
            return Err(e);
        }
        let stats = steps.stats();
        if upgraded {
            return Ok(splice(down, steps.up, stats, self.scrubber(), self.timeouts.idle).await);
        }
        let _ = down.io.shutdown().await;
        Ok(stats)
    }

    /// Terminate the jail's TLS for `name`: the SNI must be that name.
    async fn accept_tls<S>(
        &self,
        client: S,
        name: &str,
        host: &Host,
        port: u16,
        addr: SocketAddr,
        client_label: &str,
    ) -> Result<tokio_rustls::server::TlsStream<S>, GatewayError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let client_tls = |source| GatewayError::ClientTls {
            host: name.to_string(),
            source,
        };
        let acceptor =
            tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), client);
        let start = tokio::time::timeout(HANDSHAKE, acceptor)
            .await
            .map_err(|_| client_tls(std::io::ErrorKind::TimedOut.into()))?
            .map_err(client_tls)?;
        let sni = start
            .client_hello()
            .server_name()
            .map(|s| s.trim_end_matches('.').to_ascii_lowercase());
        if sni.as_deref() != Some(name) {
            let reason = format!(
                "TLS SNI {} does not match the CONNECT host {name}",
                sni.as_deref().unwrap_or("(none)")
            );
            let d = Dest {
                client: client_label,
                host,
                port,
                addr: Some(addr),
            };
            return Err(self.refused(&d, "CONNECT", reason));
        }
        let config = self.inner.ca.server_config(name)?;
        tokio::time::timeout(HANDSHAKE, start.into_stream(config))
            .await
            .map_err(|_| client_tls(std::io::ErrorKind::TimedOut.into()))?
            .map_err(client_tls)
    }

    /// Audit a refusal and turn it into the error `serve` returns.
    pub(crate) fn refused(&self, d: &Dest<'_>, method: &str, reason: String) -> GatewayError {
        self.record(
            d,
            method,
            Decision::Deny,
            format!("credential gateway: {reason}"),
            None,
        );
        GatewayError::Refused {
            host: d.host.to_string(),
            port: d.port,
            reason,
        }
    }

    /// Why a request inside the tunnel is refused, if it is.
    fn check_request(req: &RequestHead, host: &Host, port: u16) -> Result<(), Refusal> {
        let refusal = |status, message: &str| {
            Err(Refusal {
                status,
                message: format!("{PREFIX}{message}"),
            })
        };
        if req.method.eq_ignore_ascii_case("CONNECT") {
            return refusal(405, "CONNECT inside a tunnel is not allowed");
        }
        if req.method.eq_ignore_ascii_case("TRACE") {
            return refusal(
                405,
                "TRACE is not allowed on a secret-bound host (the origin would echo the real credential back)",
            );
        }
        if !(req.target.starts_with('/') || (req.target == "*" && req.method == "OPTIONS")) {
            return refusal(400, "only origin-form request targets inside a tunnel");
        }
        Self::check_host(&req.headers, host, port, true)
    }
}

impl<D, U, F, Fut> Requests<D> for Intercepted<'_, U, F>
where
    D: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
    F: FnOnce() -> Fut + Send,
    Fut: std::future::Future<Output = Result<U, GatewayError>> + Send,
{
    /// A `101` was relayed: the caller splices the streams.
    type Handoff = ();

    async fn refuse_head(&mut self, client: &mut BufConn<D>, r: HeadRefusal) {
        self.error = Some(self.refuse(client, None, r.status, r.why).await);
    }

    async fn request(&mut self, client: &mut BufConn<D>, req: RequestHead) -> Flow<()> {
        match self.forward(client, req).await {
            Ok(flow) => flow,
            Err(e) => {
                self.error = Some(e);
                Flow::Close
            }
        }
    }
}

impl<U, F, Fut> Intercepted<'_, U, F>
where
    U: AsyncRead + AsyncWrite + Unpin + Send,
    F: FnOnce() -> Fut + Send,
    Fut: std::future::Future<Output = Result<U, GatewayError>> + Send,
{
    /// Answer `status` with `why`, close, audit.
    async fn refuse<D>(
        &mut self,
        client: &mut BufConn<D>,
        req: Option<&RequestHead>,
        status: u16,
        why: String,
    ) -> GatewayError
    where
        D: AsyncWrite + Unpin,
    {
        let body = format!("{PREFIX}{why}\n");
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            client.io.write_all(&error_response(status, &body)),
        )
        .await;
        let _ = client.io.shutdown().await;
        let (method, reason) = match req {
            Some(r) => (
                r.method.as_str(),
                format!("{} {}: {why}", r.method, path_without_query(&r.target)),
            ),
            None => ("CONNECT", why),
        };
        let d = Dest {
            client: self.client,
            host: self.host,
            port: self.port,
            addr: Some(self.addr),
        };
        self.gw.refused(&d, method, reason)
    }

    /// Answer the gate's refusal and close (the gate audited it).
    async fn refuse_gated<D>(&mut self, client: &mut BufConn<D>, r: Refusal) -> GatewayError
    where
        D: AsyncWrite + Unpin,
    {
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            client.io.write_all(&error_response(r.status, &r.message)),
        )
        .await;
        let _ = client.io.shutdown().await;
        GatewayError::Refused {
            host: self.host.to_string(),
            port: self.port,
            reason: r.message.trim_end().to_string(),
        }
    }

    /// One request: checked, its credentials swapped, then exchanged on the shared loop's
    /// terms (`corral_http1::exchange`), the response scrubbed.
    async fn forward<D>(
        &mut self,
        client: &mut BufConn<D>,
        mut req: RequestHead,
    ) -> Result<Flow<()>, GatewayError>
    where
        D: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let gw = self.gw;
        if let Err(r) = Gateway::check_request(&req, self.host, self.port) {
            let why = r.message.trim_start_matches(PREFIX).to_string();
            return Err(self.refuse(client, Some(&req), r.status, why).await);
        }
        // The proxy's decision by method and path: the target it decided on is the one sent.
        if let Some(gate) = self.gate {
            match gate.decide(&req.method, &req.target) {
                Ok(target) => req.target = target,
                Err(r) => return Err(self.refuse_gated(client, r).await),
            }
        }
        let report = gw.rewrite_headers(&req.target, &mut req.headers, self.host, self.port, false);
        // Responses are scrubbed byte by byte: ask for them uncompressed, and no compressed
        // websocket frames either.
        identity_only(&mut req.headers);
        req.headers
            .retain(|h| !h.name.eq_ignore_ascii_case("sec-websocket-extensions"));
        let upgrade = websocket_upgrade(&mut req.headers);
        let client_close = req.version == Version::Http10
            || connection_tokens(&req.headers).iter().any(|t| t == "close");
        // `Expect: 100-continue` is answered here, so the body flows without a round trip.
        let expect_continue =
            header_values(&req.headers, "expect").any(|v| v.eq_ignore_ascii_case(b"100-continue"));
        req.headers
            .retain(|h| !h.name.eq_ignore_ascii_case("expect"));
        if let Some(connect) = self.connect.take() {
            let raw = connect().await?;
            self.up = Some(BufConn::new(
                gw.tls_upstream(self.name, self.addr, raw).await?,
            ));
        }
        let Some(up) = self.up.as_mut() else {
            unreachable!("connected just above")
        };
        // A sign-in's token endpoint: the refresh is answered by the gateway itself (its real
        // refresh token in, the new tokens kept and replaced), and the connection ends there.
        if let Some(s) = gw.token_endpoint(self.host, self.port, &req.target) {
            let d = Dest {
                client: self.client,
                host: self.host,
                port: self.port,
                addr: Some(self.addr),
            };
            let mut stats = InterceptStats::default();
            let done = gw
                .refresh_exchange(s, (client, up), req, &d, &mut stats)
                .await;
            self.requests += stats.requests;
            self.moved.up += stats.bytes_up;
            self.moved.down += stats.bytes_down;
            done?;
            return Ok(Flow::Close);
        }
        let head = req.to_bytes();
        let out = Outgoing {
            head: &head,
            method: &req.method,
            framing: req.framing,
            version: req.version,
            expect_continue,
            client_close,
            upgrade,
            idle: gw.timeouts.idle,
            budget: &gw.budget,
        };
        let mut scrub = gw.scrubber();
        let (label, host, port, addr) = (self.client, self.host, self.port, self.addr);
        // Only once the head is written was the real value really sent.
        let target = (req.method.as_str(), req.target.as_str());
        let sent = || gw.audit_report(&report, label, target, host, port, Some(addr));
        let done = exchange::exchange(client, up, out, Some(&mut scrub), sent, &mut self.moved);
        match done.await {
            Ok(Done::Upgraded) => {
                self.requests += 1;
                Ok(Flow::Handoff(()))
            }
            Ok(Done::Replied {
                origin_close,
                close,
            }) => {
                self.requests += 1;
                Ok(if origin_close || close {
                    Flow::Close
                } else {
                    Flow::Continue
                })
            }
            Err(e) => {
                // The origin may hold an incomplete request: its connection goes.
                self.up = None;
                match e.answer(self.name) {
                    Some((status, why)) => Err(self.refuse(client, Some(&req), status, why).await),
                    None => Err(relay_err(self.name, std::io::Error::other(e.to_string()))),
                }
            }
        }
    }
}

impl Gateway {
    /// Every real value, and every encoding of one the gateway produced, mapped back to what
    /// the jail sent: the replacer every answer from a secret-bound host goes through.
    pub fn scrubber(&self) -> Replacer {
        let mut r = Replacer::default();
        for s in &self.inner.secrets {
            for (real, ph) in encodings::scrub_pairs(s.real.as_bytes(), s.placeholder.as_bytes()) {
                r.add(real, ph);
            }
        }
        let produced = self
            .inner
            .produced
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (real, sent) in produced.iter() {
            r.add(real.clone(), sent.clone());
            r.add(encodings::url_safe(real), encodings::url_safe(sent));
        }
        for s in &self.inner.signin {
            add_signin_pairs(&mut r, s);
        }
        r
    }
}

/// Every token `s` holds for the run (current and replaced), in each of its encodings.
pub(crate) fn add_signin_pairs(r: &mut Replacer, s: &crate::signin::Signin) {
    for (real, ph) in s.scrub_pairs() {
        for (real, ph) in encodings::scrub_pairs(&real, &ph) {
            r.add(real, ph);
        }
    }
}

/// Whether the request asks for a websocket upgrade, the one protocol the gateway splices (it
/// scrubs it frame by frame, [`FrameScrubber`]); `Upgrade` is then just `websocket`. Any other
/// `Upgrade` is taken off the request with its `Connection` token, so the origin answers in
/// HTTP/1.1 (it may ignore the field anyway, RFC 9110 §7.8) and a `101` is refused.
fn websocket_upgrade(headers: &mut Vec<Header>) -> bool {
    let asked = connection_tokens(headers).iter().any(|t| t == "upgrade");
    let websocket = header_values(headers, "upgrade")
        .flat_map(|v| v.split(|&b| b == b','))
        .any(|p| p.trim_ascii().eq_ignore_ascii_case(b"websocket"));
    headers.retain(|h| !h.name.eq_ignore_ascii_case("upgrade"));
    if asked && websocket {
        headers.push(Header {
            name: "Upgrade".into(),
            value: b"websocket".to_vec(),
        });
        return true;
    }
    for h in headers.iter_mut() {
        if h.name.eq_ignore_ascii_case("connection") {
            let kept: Vec<&[u8]> = h
                .value
                .split(|&b| b == b',')
                .map(<[u8]>::trim_ascii)
                .filter(|t| !t.is_empty() && !t.eq_ignore_ascii_case(b"upgrade"))
                .collect();
            h.value = kept.join(b", ".as_slice());
        }
    }
    headers.retain(|h| !(h.name.eq_ignore_ascii_case("connection") && h.value.is_empty()));
    false
}

fn relay_err(host: &str, source: std::io::Error) -> GatewayError {
    GatewayError::Relay {
        host: host.to_string(),
        source,
    }
}

/// After a `101`: the two streams spliced until both close or nothing moves for the idle
/// timeout. The swap happened on the upgrade request; what the origin sends still goes through
/// the scrubber message by message ([`FrameScrubber`]: a value split across a frame and its
/// continuation is caught; compressed frames cannot come, the upgrade request had
/// `Sec-WebSocket-Extensions` removed).
async fn splice<D, U>(
    down: BufConn<D>,
    up: Option<BufConn<U>>,
    mut stats: InterceptStats,
    scrub: Replacer,
    idle: std::time::Duration,
) -> InterceptStats
where
    D: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
{
    use tokio::io::AsyncReadExt;
    let Some(upstream) = up else {
        return stats;
    };
    let mut scrub = FrameScrubber::new(scrub);
    let (mut dr, mut dw) = tokio::io::split(down.io);
    let (mut ur, mut uw) = tokio::io::split(upstream.io);
    let mut out = Vec::new();
    scrub.feed(&upstream.buf, &mut out);
    if uw.write_all(&down.buf).await.is_err() || dw.write_all(&out).await.is_err() {
        return stats;
    }
    stats.bytes_up += down.buf.len() as u64;
    stats.bytes_down += upstream.buf.len() as u64;
    let (mut from_jail, mut from_origin) = (true, true);
    let (mut bj, mut bo) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
    while from_jail || from_origin {
        tokio::select! {
            r = dr.read(&mut bj), if from_jail => match r {
                Ok(n) if n > 0 => {
                    if uw.write_all(&bj[..n]).await.is_err() {
                        break;
                    }
                    stats.bytes_up += n as u64;
                }
                _ => {
                    from_jail = false;
                    let _ = uw.shutdown().await;
                }
            },
            r = ur.read(&mut bo), if from_origin => {
                out.clear();
                match r {
                    Ok(n) if n > 0 => {
                        scrub.feed(&bo[..n], &mut out);
                        stats.bytes_down += n as u64;
                    }
                    _ => {
                        from_origin = false;
                        scrub.finish(&mut out);
                    }
                }
                if dw.write_all(&out).await.is_err() || dw.flush().await.is_err() {
                    break;
                }
                if !from_origin {
                    let _ = dw.shutdown().await;
                }
            },
            () = tokio::time::sleep(idle) => break,
        }
    }
    stats
}
