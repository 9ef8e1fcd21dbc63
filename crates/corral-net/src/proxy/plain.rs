//! Plain HTTP: absolute-form requests on one client connection, pinned to one host, through
//! the request loop shared with the credential gateway.

use super::*;

/// The upstream side of a kept-alive client connection: pinned to one host.
struct Pinned {
    host: Host,
    port: u16,
    up: Option<Upstream>,
}

pub(super) struct Upstream {
    conn: BufConn<TcpStream>,
    bytes_up: u64,
    bytes_down: u64,
    /// Its close record (written when the connection is dropped, with the counts last set).
    owed: Owed,
}

/// The proxy's steps in the shared request loop (`corral_http1::exchange`, the loop the
/// credential gateway runs too): plain-HTTP requests on one client connection, pinned to one
/// host; a CONNECT on a fresh connection is handed back.
struct PlainHttp<'a> {
    proxy: &'a Proxy,
    peer: &'a str,
    pinned: Option<Pinned>,
    /// A captured port-80 connection's destination: origin-form targets are taken as for it.
    captured: Option<(Host, u16)>,
}

impl<S> Requests<S> for PlainHttp<'_>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    /// A CONNECT: the caller decides its tunnel.
    type Handoff = RequestHead;

    async fn refuse_head(&mut self, client: &mut BufConn<S>, r: HeadRefusal) {
        let proxy = self.proxy;
        if r.over_budget {
            let limit = proxy.buffers.limit();
            proxy.refusals.hit(LISTENER, reason::HEADS);
            proxy.heads_refused.hit(|n| {
                format!("corral proxy: {n} request(s) refused in the last 10 s: the jail's partial request heads passed {limit} bytes")
            });
        } else {
            // A head that could not be read (malformed, too large, too slow): one record each,
            // as for any malformed request (the jail paces these: each costs it a connection).
            proxy.log_unreadable(self.peer, &r.why);
        }
        let body = format!("corral: {}\n", r.why);
        proxy.reply_and_close(&mut client.io, r.status, &body).await;
    }

    async fn request(
        &mut self,
        client: &mut BufConn<S>,
        mut req: RequestHead,
    ) -> Flow<RequestHead> {
        let (proxy, peer) = (self.proxy, self.peer);
        if let Some((host, port)) = &self.captured
            && req.target.starts_with('/')
        {
            req.target = format!("http://{}{}", authority_string(host, *port), req.target);
        }
        if req.method == "CONNECT" {
            if self.pinned.is_none() {
                return Flow::Handoff(req);
            }
            let why = "CONNECT on a connection already used for plain HTTP";
            proxy.log_bad(peer, "CONNECT", &req.target, why);
            let body = format!("corral: {why}; open a new connection\n");
            proxy.reply_and_close(&mut client.io, 400, &body).await;
            return Flow::Close;
        }
        match Box::pin(proxy.forward_one(client, req, peer, &mut self.pinned)).await {
            true => Flow::Continue,
            false => Flow::Close,
        }
    }
}

/// What the gateway's step gives a plain-HTTP request: its rewrite (audited once sent) and the
/// scrubber of a secret-bound host's answer.
pub(super) type PlainRewrite<'a> = (
    Option<(&'a corral_gateway::Gateway, corral_gateway::RewriteReport)>,
    Option<http::io::Replacer>,
);

/// Split an absolute-form `http://authority/path` target.
fn split_absolute(target: &str) -> Result<(&str, String), &'static str> {
    let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err("https URLs go through CONNECT, not plain forwarding");
    }
    if !lower.starts_with("http://") {
        return Err("not a proxy request: the request target must be an absolute http:// URL");
    }
    let rest = &target[7..];
    if rest.contains('#') {
        return Err("fragment in request target");
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    check_authority_chars(authority)?;
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    Ok((authority, path))
}

pub(super) fn check_authority_chars(authority: &str) -> Result<(), &'static str> {
    if authority.is_empty() {
        return Err("empty authority");
    }
    if authority.contains('@') {
        return Err("credentials in the authority are not accepted");
    }
    if authority.contains(['%', '/', '\\']) {
        return Err("invalid character in the authority (zone id or escape)");
    }
    Ok(())
}

/// Whether the client's Host header (if any) names the same host and port as the target.
pub(super) fn host_header_agrees(
    req: &RequestHead,
    host: &Host,
    port: u16,
    default_port: u16,
) -> Result<(), String> {
    match http::single_header(&req.headers, "host", "multiple Host headers") {
        Err(e) => Err(e.to_string()),
        Ok(None) => Ok(()),
        Ok(Some(v)) => {
            let raw = std::str::from_utf8(v).map_err(|_| "non-ASCII Host header".to_string())?;
            check_authority_chars(raw).map_err(|e| format!("Host header: {e}"))?;
            let (h, p) = parse_authority(raw).map_err(|e| format!("Host header: {e}"))?;
            if &h == host && p.unwrap_or(default_port) == port {
                Ok(())
            } else {
                Err(format!(
                    "Host header names {raw}, the request target names {}:{port}",
                    host_display(host)
                ))
            }
        }
    }
}

pub(super) fn authority_string(host: &Host, port: u16) -> String {
    format!("{}:{port}", host_display(host))
}

impl Proxy {
    pub(super) async fn http<S>(&self, client: BufConn<S>, peer: &str) -> Option<Tunnel<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        self.http_pinned(client, peer, None).await
    }

    /// Plain HTTP requests, on a connection pinned from the start to `captured` (a captured
    /// port-80 connection: origin-form requests are taken as requests for that host, and the
    /// `Host` header must name it) or to the first host allowed. The loop is the one the
    /// credential gateway runs too (`corral_http1::exchange`); a CONNECT ends it.
    pub(super) async fn http_pinned<S>(
        &self,
        mut client: BufConn<S>,
        peer: &str,
        captured: Option<(Host, u16)>,
    ) -> Option<Tunnel<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let mut steps = PlainHttp {
            proxy: self,
            peer,
            pinned: captured.clone().map(|(host, port)| Pinned {
                host,
                port,
                up: None,
            }),
            captured,
        };
        let t = http::io::Timeouts {
            head: self.config.header_timeout,
            idle: self.config.idle_timeout,
        };
        let connect = serve_requests(&mut client, &mut steps, t, &self.buffers).await;
        if let Some(mut p) = steps.pinned.take() {
            self.drop_upstream(&mut p);
        }
        Box::pin(self.connect(client, connect?, peer)).await
    }

    /// Close the pinned upstream connection, if any (its `close` line is logged).
    fn drop_upstream(&self, p: &mut Pinned) {
        if let Some(up) = p.up.take() {
            up.owed.close(up.bytes_up, up.bytes_down);
        }
    }

    /// The request cannot be completed: the upstream connection is closed (so the origin never
    /// completes a half-sent request), the client gets `status` and `body`, then a close.
    /// Returns `false`: the client connection does not continue.
    async fn abandon<S: AsyncWrite + Unpin>(
        &self,
        io: &mut S,
        p: &mut Pinned,
        status: u16,
        body: &str,
    ) -> bool {
        self.drop_upstream(p);
        self.reply_and_close(io, status, body).await;
        false
    }

    /// Forward one plain-HTTP request and its response. Returns whether the client connection
    /// stays open for another request.
    async fn forward_one<S>(
        &self,
        client: &mut BufConn<S>,
        mut req: RequestHead,
        peer: &str,
        pinned: &mut Option<Pinned>,
    ) -> bool
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Some((host, port, mut path)) = self.plain_target(client, &req, peer, pinned).await
        else {
            return false;
        };
        let shown = host_display(&host);
        let method = std::mem::take(&mut req.method);
        let p = pinned.get_or_insert_with(|| Pinned {
            host: host.clone(),
            port,
            up: None,
        });
        if !self
            .open_pinned(client, p, (&method, &mut path), peer)
            .await
        {
            return false;
        }
        let Some(address) = p.up.as_ref().map(|u| u.owed.address()) else {
            return false;
        };
        // The gateway's step: placeholders swapped (or refused), answers of a secret-bound
        // host scrubbed of every real value and asked for uncompressed, so they can be.
        let mut headers = std::mem::take(&mut req.headers);
        let Some((rewritten, mut scrub)) = self
            .gateway_step(client, (&method, &path), &mut headers, (&host, port), peer)
            .await
        else {
            return false;
        };
        let client_close = req.version == Version::Http10
            || http::connection_tokens(&headers)
                .iter()
                .any(|t| t == "close");
        let expect_continue = http::header_values(&headers, "expect")
            .any(|v| v.eq_ignore_ascii_case(b"100-continue"));
        let host_header = match (&host, port) {
            (_, 80) => shown.clone(),
            _ => authority_string(&host, port),
        };
        let head = http::serialize_request(&method, &path, &host_header, &headers, req.framing);
        let out = Outgoing {
            head: &head,
            method: &method,
            framing: req.framing,
            version: req.version,
            expect_continue,
            client_close,
            upgrade: false,
            idle: self.config.idle_timeout,
            budget: &self.buffers,
        };
        let sent = || {
            if let Some((gw, report)) = &rewritten {
                gw.plain_sent(report, (&method, &path), (&host, port), peer, address);
            }
        };
        let Some(up) = p.up.as_mut() else {
            return false;
        };
        let mut moved = Moved::default();
        let done = exchange(client, &mut up.conn, out, scrub.as_mut(), sent, &mut moved).await;
        up.bytes_up += moved.up;
        up.bytes_down += moved.down;
        up.owed.set_bytes(up.bytes_up, up.bytes_down);
        self.exchanged(client, peer, p, done, (&method, &shown))
            .await
    }

    /// The host, port and origin-form path of a plain-HTTP request, checked (absolute-form
    /// `http://` target, `Host` agreeing with it, the connection's pinned host); `None` when
    /// refused (answered and logged).
    async fn plain_target<S>(
        &self,
        client: &mut BufConn<S>,
        req: &RequestHead,
        peer: &str,
        pinned: &Option<Pinned>,
    ) -> Option<(Host, u16, String)>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let method = &req.method;
        let (authority, path) = match split_absolute(&req.target) {
            Ok(x) => x,
            Err(why) => {
                self.log_bad(peer, method, &req.target, why);
                self.reply_and_close(&mut client.io, 400, &format!("corral: {why}\n"))
                    .await;
                return None;
            }
        };
        let (host, port) = match parse_authority(authority) {
            Ok((h, p)) => (h, p.unwrap_or(80)),
            Err(e) => {
                self.log_bad(peer, method, authority, &e.to_string());
                let body = format!("corral: invalid host in {:?}: {e}\n", req.target);
                self.reply_and_close(&mut client.io, 400, &body).await;
                return None;
            }
        };
        let shown = host_display(&host);
        if let Err(why) = host_header_agrees(req, &host, port, 80) {
            let d = Denial {
                rule: why.clone(),
                fix: "send a Host header that matches the request target".into(),
                status: 400,
            };
            self.log_denial(peer, method, Destination::new(&shown, port), &d);
            self.reply_and_close(&mut client.io, 400, &format!("corral: {why}\n"))
                .await;
            return None;
        }
        if let Some(p) = pinned.as_ref()
            && (p.host != host || p.port != port)
        {
            let d = Denial {
                rule: format!("connection pinned to {}", authority_string(&p.host, p.port)),
                fix: "open a new connection for another host".into(),
                status: 403,
            };
            self.log_denial(peer, method, Destination::new(&shown, port), &d);
            let body = Self::denial_body(method, &authority_string(&host, port), &d);
            self.reply_and_close(&mut client.io, 403, &body).await;
            return None;
        }
        Some((host, port, path))
    }

    /// Decide a request to the pinned host with the rules in force, dial it if the connection
    /// has no upstream yet, and record the decision; `false` when refused (answered, logged).
    async fn open_pinned<S>(
        &self,
        client: &mut BufConn<S>,
        p: &mut Pinned,
        (method, path): (&str, &mut String),
        peer: &str,
    ) -> bool
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let (host, port) = (p.host.clone(), p.port);
        let shown = host_display(&host);
        let dest = (&host, port, Kind::Http);
        let Some((rules, decided)) = Box::pin(self.decide_asking(client, dest, method, peer)).await
        else {
            return false;
        };
        let rule = match decided {
            Ok(Allowed::Host(r)) => r,
            // Decided by method and path: the normalised path decided on is the one sent.
            Ok(Allowed::Paths(set)) => {
                let dest = (&host, port, Kind::Http);
                match self.decide_request(peer, dest, None, method, path) {
                    Ok(target) => *path = target,
                    Err((status, body)) => {
                        self.reply_and_close(&mut client.io, status, &body).await;
                        return false;
                    }
                }
                format!("{set} (each request decided)")
            }
            Err(d) => {
                self.log_denial(peer, method, Destination::new(&shown, port), &d);
                let body = Self::denial_body(method, &authority_string(&host, port), &d);
                self.reply_and_close(&mut client.io, d.status, &body).await;
                return false;
            }
        };
        if p.up.is_none() {
            match Box::pin(self.dial(&rules, &host, port)).await {
                Ok((s, address)) => {
                    let dest = Dest {
                        peer,
                        method,
                        to: Destination::new(&shown, port),
                        address,
                        started: Instant::now(),
                    };
                    let Some(owed) = self.open.register(dest) else {
                        self.refuse_ending(&mut client.io, peer, method, dest.to, address)
                            .await;
                        return false;
                    };
                    p.up = Some(Upstream {
                        conn: BufConn::new(s),
                        bytes_up: 0,
                        bytes_down: 0,
                        owed,
                    });
                }
                Err(r) => {
                    self.refuse(&mut client.io, peer, method, &host, port, r)
                        .await;
                    return false;
                }
            }
        }
        let address = p.up.as_ref().map(|u| u.owed.address());
        let allowed = Decision::Allow;
        if !self.log_decision(
            peer,
            method,
            Destination::new(&shown, port),
            address,
            allowed,
            &rule,
        ) {
            // Fail closed: nothing is sent that the log does not show.
            return self.abandon(&mut client.io, p, 503, Self::UNRECORDED).await;
        }
        true
    }

    /// After an exchange: whether the client connection goes on. A failed exchange drops the
    /// upstream connection (the origin never completes a half-sent request) and answers what
    /// still can be.
    async fn exchanged<S>(
        &self,
        client: &mut BufConn<S>,
        peer: &str,
        p: &mut Pinned,
        done: Result<Done, ExchangeError>,
        (method, shown): (&str, &str),
    ) -> bool
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        match done {
            Ok(Done::Replied {
                origin_close,
                close,
            }) => {
                if origin_close {
                    self.drop_upstream(p);
                }
                if close {
                    let _ = client.io.shutdown().await;
                }
                !close
            }
            Ok(Done::Upgraded) => {
                // Not asked for (`upgrade: false`): the exchange refuses a 101 itself.
                self.abandon(&mut client.io, p, 502, "corral: unexpected upgrade\n")
                    .await
            }
            Err(e) => match e.answer(shown) {
                Some((status, why)) => {
                    let body = format!("corral: {why}\n");
                    if let ExchangeError::RequestBody(_) = e {
                        self.log_bad(peer, method, shown, &body);
                    }
                    self.abandon(&mut client.io, p, status, &body).await
                }
                None => {
                    // A truncated response or a client gone: close both.
                    self.drop_upstream(p);
                    let _ = client.io.shutdown().await;
                    false
                }
            },
        }
    }
}
