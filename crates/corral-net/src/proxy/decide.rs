//! Deciding a request: the rules (by name, by method and path), asking the user when
//! `network.on_deny = "ask"`, and answering a refusal.

use super::*;

/// Why a request was not served, for the answer and the log.
pub(super) enum Refusal {
    /// A policy decision (logged as deny, answered 403 unless `status` says otherwise).
    Denied(Denial),
    /// The request was allowed but could not be served (resolution, connect, upstream).
    Failed { rule: String, status: u16 },
}

/// Bytes taken from a [`Budget`], given back when dropped.
struct ReservedBudget<'a>(&'a Budget, usize);

impl Drop for ReservedBudget<'_> {
    fn drop(&mut self) {
        self.0.give(self.1);
    }
}

/// Ends when the client closes its side or fails; what it sends meanwhile is kept in its
/// buffer, up to [`HELD_BYTES`] (beyond, it is not read and this waits forever).
async fn client_gone<S: AsyncRead + Unpin>(client: &mut BufConn<S>) {
    use tokio::io::AsyncReadExt as _;
    loop {
        let room = HELD_BYTES.saturating_sub(client.buf.len());
        if room == 0 {
            return std::future::pending().await;
        }
        match (&mut client.io)
            .take(room as u64)
            .read_buf(&mut client.buf)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

impl Proxy {
    pub(super) fn denial_body(method: &str, target: &str, d: &Denial) -> String {
        format!(
            "corral: blocked {method} {target} ({})\n{}\nOr permanently, in the project's corral.toml: corral allow HOST[:PORT]\n",
            d.rule, d.fix
        )
    }

    /// Decide one request to a host decided by method and path: the normalised target to
    /// send, recorded; or the refusal (recorded, counted in the summary, and its answer).
    pub(super) fn decide_request(
        &self,
        peer: &str,
        (host, port, kind): (&Host, u16, Kind),
        address: Option<SocketAddr>,
        method: &str,
        target: &str,
    ) -> Result<String, (u16, String)> {
        let shown = host_display(host);
        match self
            .rules()
            .check_request((host, port, kind), method, target)
        {
            Ok((n, rule)) => {
                let allow = Decision::Allow;
                if self.log_request(
                    peer,
                    method,
                    Destination::new(&shown, port),
                    &n.path(),
                    address,
                    allow,
                    &rule,
                ) {
                    Ok(n.target())
                } else {
                    Err((503, Self::UNRECORDED.to_string()))
                }
            }
            Err(d) => {
                let path = target.split(['?', '#']).next().unwrap_or(target);
                let deny = Decision::Deny;
                let _ = self.log_request(
                    peer,
                    method,
                    Destination::new(&shown, port),
                    path,
                    address,
                    deny,
                    &d.rule,
                );
                let authority = authority_string(host, port);
                self.note_blocked(method, &format!("{authority}{path}"), &d.rule, &d.fix);
                let body = format!(
                    "corral: blocked {method} {authority}{path}: {}\n{}\n",
                    d.rule, d.fix
                );
                Err((d.status, body))
            }
        }
    }

    /// The name-level decision with the rules in force; with `network.on_deny = "ask"`, a
    /// request only the allow list refuses is held until `corral watch` answers (see
    /// `ask.rs`), then decided again with the rules then in force. `None` when the client went
    /// away while held (recorded).
    pub(super) async fn decide_asking<S>(
        &self,
        client: &mut BufConn<S>,
        (host, port, kind): (&Host, u16, Kind),
        method: &str,
        peer: &str,
    ) -> Option<(Arc<Rules>, Result<Allowed, Denial>)>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let rules = self.rules();
        let d = match rules.check_name(host, port, kind) {
            Ok(a) => return Some((rules, Ok(a))),
            Err(d) => d,
        };
        let secs = self.ask_timeout.load(Ordering::Relaxed);
        if secs == 0 || !Self::askable(&rules, host, port, &d) {
            return Some((rules, Err(d)));
        }
        match self
            .held(client, (host, port, kind), method, peer, &d, secs)
            .await
        {
            Some(Ok(())) => {}
            Some(Err(why)) => {
                let d = Denial {
                    rule: format!("{}; {why}", d.rule),
                    ..d
                };
                return Some((rules, Err(d)));
            }
            None => {
                let gone = Denial {
                    rule: format!("{}; the client went away while asked", d.rule),
                    ..d
                };
                self.log_denial(
                    peer,
                    method,
                    Destination::new(&host_display(host), port),
                    &gone,
                );
                return None;
            }
        }
        let rules = self.rules();
        let decided = rules.check_name(host, port, kind);
        Some((rules, decided))
    }

    /// Whether a denial may become a question: the allow list alone refused (no deny rule
    /// names the destination), and an address literal passes the address checks.
    fn askable(rules: &Rules, host: &Host, port: u16, d: &Denial) -> bool {
        let denied = rules.deny.iter().any(|p| p.matches(host, port));
        let address_ok = match host {
            Host::Name(_) => true,
            Host::Ip(ip) => check_destination(*ip, &rules.allow_cidrs).is_ok(),
        };
        d.status == 403 && !denied && address_ok
    }

    /// Hold the connection on its question: `Ok` when the answer allows it, `Err(why)` when it
    /// is refused (answer, timeout, bounds), `None` when the client went away. Bytes the client
    /// sends meanwhile are kept (up to [`HELD_BYTES`], counted in the head budget).
    pub(super) async fn held<S>(
        &self,
        client: &mut BufConn<S>,
        dest: (&Host, u16, Kind),
        method: &str,
        peer: &str,
        d: &Denial,
        secs: u32,
    ) -> Option<Result<(), String>>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        if !self.buffers.take(HELD_BYTES) {
            return Some(Err(
                "not asked: the proxy's budget for held connections is spent".into(),
            ));
        }
        let _budget = ReservedBudget(&self.buffers, HELD_BYTES);
        let timeout = Duration::from_secs(secs.into());
        let mut hold = match self.asks.hold(dest, method, &d.rule, timeout) {
            Ok(h) => h,
            Err(NotHeld::Full) => {
                let max = crate::ask::MAX_HELD;
                return Some(Err(format!(
                    "not asked: {max} connections wait for an answer already"
                )));
            }
            Err(NotHeld::Refused) => return Some(Err("refused in corral watch".into())),
        };
        if hold.first {
            let (host, port, _) = dest;
            let _ = self.log(NetEvent {
                phase: NetPhase::Ask,
                client: peer.into(),
                method: method.into(),
                host: host_display(host),
                port,
                rule: d.rule.clone(),
                ..Default::default()
            });
        }
        let outcome = tokio::select! {
            o = hold.wait() => o,
            () = client_gone(client) => return None,
        };
        Some(match outcome {
            Outcome::Allowed => Ok(()),
            Outcome::Refused => Err("refused in corral watch".into()),
            Outcome::TimedOut => Err(format!("asked, no answer within {secs} s")),
        })
    }

    pub(super) async fn refuse<S: AsyncWrite + Unpin>(
        &self,
        io: &mut S,
        peer: &str,
        method: &str,
        host: &Host,
        port: u16,
        r: Refusal,
    ) {
        let shown = host_display(host);
        match r {
            Refusal::Denied(d) => {
                self.log_denial(peer, method, Destination::new(&shown, port), &d);
                let body = Self::denial_body(method, &authority_string(host, port), &d);
                self.reply_and_close(io, d.status, &body).await;
            }
            Refusal::Failed { rule, status } => {
                let _ = self.log_decision(
                    peer,
                    method,
                    Destination::new(&shown, port),
                    None,
                    Decision::Allow,
                    &format!("allowed, but {rule}"),
                );
                self.note_failed(method, &format!("{shown}:{port}"), &rule);
                self.reply_and_close(
                    io,
                    status,
                    &format!(
                        "corral: {method} {}: {rule}\n",
                        authority_string(host, port)
                    ),
                )
                .await;
            }
        }
    }
}
