//! What the proxy records: audit lines of decisions, denials and closed connections, the
//! end-of-run summaries of blocked and failed destinations, refusals while the run ends.

use super::*;

/// One line of the end-of-run summary: a blocked destination and how often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub method: String,
    pub target: String,
    pub rule: String,
    pub fix: String,
    pub count: u64,
}

impl Blocked {
    /// `corral: blocked CONNECT github.com:443 ×3 (not in network.allow) — allow with: ...`
    /// What the jail chose is escaped as `corral log` escapes it ([`corral_audit::printable`]).
    pub fn summary_line(&self) -> String {
        use corral_audit::printable as p;
        format!(
            "corral: blocked {} {} ×{} ({}) — {}",
            p(&self.method),
            p(&self.target),
            self.count,
            p(&self.rule),
            p(&self.fix)
        )
    }

    /// An allowed destination that could not be reached:
    /// `corral: failed CONNECT x.org:443 ×2 (cannot resolve x.org: ...)`.
    pub fn failed_line(&self) -> String {
        format!(
            "corral: failed {} {} ×{} ({})",
            self.method, self.target, self.count, self.rule
        )
    }
}

/// (method, target, rule) -> (fix, count).
pub(super) type BlockedMap = BTreeMap<(String, String, String), (String, u64)>;

/// A summary map's lines, most frequent first.
fn summary_of(map: &Mutex<BlockedMap>) -> Vec<Blocked> {
    let map = map.lock().unwrap_or_else(|e| e.into_inner());
    let mut out: Vec<Blocked> = map
        .iter()
        .map(|((method, target, rule), (fix, count))| Blocked {
            method: method.clone(),
            target: target.clone(),
            rule: rule.clone(),
            fix: fix.clone(),
            count: *count,
        })
        .collect();
    out.sort_by_key(|b| std::cmp::Reverse(b.count));
    out
}

/// Count `[method, target, rule, fix]` into a summary map. The jail chooses the destinations
/// (random names, for one), so the distinct ones kept are bounded ([`BLOCKED_KEPT`]); the rest
/// share one line (`more than N distinct ones {what}`, `see them all with: {command}`), and
/// the audit log still has every one.
pub(super) fn tally(map: &mut BlockedMap, line: [&str; 4], [what, command]: [&str; 2]) {
    let [method, target, rule, fix] = line;
    let mut key = (method.to_string(), target.to_string(), rule.to_string());
    let mut fix = fix.to_string();
    if map.len() >= BLOCKED_KEPT && !map.contains_key(&key) {
        key = (
            "...".into(),
            "other destinations".into(),
            format!("more than {BLOCKED_KEPT} distinct ones {what}"),
        );
        fix = format!("see them all with: {command}");
    }
    let e = map.entry(key).or_insert_with(|| (fix, 0));
    e.1 += 1;
}

/// Distinct blocked destinations the end-of-run summary keeps apart (corral's memory must not
/// grow with what the jail tries); the rest share one line.
pub const BLOCKED_KEPT: usize = 1000;

impl Proxy {
    /// Blocked destinations so far, for the end-of-run summary (most frequent first).
    pub fn blocked_summary(&self) -> Vec<Blocked> {
        summary_of(&self.blocked)
    }

    /// Allowed destinations that could not be reached so far, with the reason (most frequent
    /// first): the jail saw them fail, and only corral knows why.
    pub fn failed_summary(&self) -> Vec<Blocked> {
        summary_of(&self.failed)
    }

    /// Count one allowed request that could not be served into [`Proxy::failed_summary`].
    pub(super) fn note_failed(&self, method: &str, target: &str, reason: &str) {
        let mut map = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        tally(
            &mut map,
            [method, target, reason, ""],
            ["failed", "corral log"],
        );
    }

    /// Write one record; `false` when it could not be written (the caller refuses what it
    /// would have recorded; the failure is counted by the log and said on stderr, at most
    /// once per interval).
    #[must_use]
    pub(super) fn log(&self, ev: NetEvent) -> bool {
        match self.audit.write(&Record::now(&self.jail, Event::Net(ev))) {
            Ok(()) => true,
            Err(e) => {
                self.audit_refused.hit(|n| {
                    format!(
                        "corral proxy: cannot write the audit log ({e}): {n} record(s) lost in the last 10 s; what they would record is refused"
                    )
                });
                false
            }
        }
    }

    /// Write a record decided beside the proxy with its rules (the stub resolver's); `false`
    /// when it could not be written (the caller refuses what it records).
    #[must_use]
    pub fn record(&self, ev: NetEvent) -> bool {
        self.log(ev)
    }

    /// The answer to a request allowed but not recorded.
    pub(super) const UNRECORDED: &str = "corral: the audit log cannot be written, so this request is refused (see corral's stderr)\n";

    #[must_use]
    pub(super) fn log_decision(
        &self,
        client: &str,
        method: &str,
        to: Destination<'_>,
        address: Option<SocketAddr>,
        decision: Decision,
        rule: &str,
    ) -> bool {
        self.log(NetEvent {
            phase: NetPhase::Decision,
            client: client.into(),
            method: method.into(),
            host: to.host.into(),
            port: to.port,
            address: address.map(|a| a.ip().to_string()),
            decision: Some(decision),
            rule: rule.into(),
            ..Default::default()
        })
    }

    pub(super) fn log_denial(&self, client: &str, method: &str, to: Destination<'_>, d: &Denial) {
        // Refused either way; a record that could not be written is counted by the log.
        let _ = self.log_decision(client, method, to, None, Decision::Deny, &d.rule);
        self.note_blocked(method, &to.to_string(), &d.rule, &d.fix);
    }

    /// Count one refusal into the end-of-run summary ([`Proxy::blocked_summary`]). The proxy's
    /// own denials come here; so do those decided beside it with its rules (the stub
    /// resolver's refused names, connections captured to addresses it never handed out), whose
    /// callers write their own audit record.
    ///
    /// The jail chooses the destinations (random names, for one), so the distinct ones kept are
    /// bounded ([`BLOCKED_KEPT`]); the rest are counted in one line, and the audit log still
    /// has every one.
    pub fn note_blocked(&self, method: &str, target: &str, rule: &str, fix: &str) {
        let mut map = self.blocked.lock().unwrap_or_else(|e| e.into_inner());
        let line = [method, target, rule, fix];
        tally(&mut map, line, ["were blocked", "corral log --blocked"]);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn log_close(
        &self,
        client: &str,
        method: &str,
        to: Destination<'_>,
        address: SocketAddr,
        up: u64,
        down: u64,
        started: Instant,
    ) {
        // The connection is over: a close line that cannot be written is counted by the log.
        let _ = self.log(NetEvent {
            phase: NetPhase::Close,
            client: client.into(),
            method: method.into(),
            host: to.host.into(),
            port: to.port,
            address: Some(address.ip().to_string()),
            decision: None,
            rule: String::new(),
            bytes_up: up,
            bytes_down: down,
            duration_ms: started.elapsed().as_millis() as u64,
            ..Default::default()
        });
    }

    /// An allowed connection dialled while the proxy shuts down: closed at once (its close
    /// line logged), the client answered 503, the refusal counted.
    pub(super) async fn refuse_ending<S: AsyncWrite + Unpin>(
        &self,
        io: &mut S,
        peer: &str,
        method: &str,
        to: Destination<'_>,
        address: SocketAddr,
    ) {
        self.refusals.hit(LISTENER, reason::ENDING);
        self.log_close(peer, method, to, address, 0, 0, Instant::now());
        let body = "corral: the run is ending; no new connection\n";
        self.reply_and_close(io, 503, body).await;
    }

    /// A request head that could not be read: logged as a denial of no known method or
    /// destination (`?`), and summarised as `blocked unreadable request`.
    pub(super) fn log_unreadable(&self, peer: &str, why: &str) {
        let rule = format!("malformed: {why}");
        // Refused either way; a record that could not be written is counted by the log.
        let to = Destination::new("?", 0);
        let _ = self.log_decision(peer, "?", to, None, Decision::Deny, &rule);
        self.note_blocked("unreadable", "request", &rule, "fix the client's request");
    }

    /// A malformed-but-parsed request that names a target: logged as a denial.
    pub(super) fn log_bad(&self, peer: &str, method: &str, target: &str, why: &str) {
        self.log_denial(
            peer,
            method,
            Destination::new(target, 0),
            &Denial {
                rule: format!("malformed: {why}"),
                fix: "fix the client's request".into(),
                status: 400,
            },
        );
    }

    /// One audit record for a request decided by method and path; `false` when it could not
    /// be written.
    #[allow(clippy::too_many_arguments)]
    #[must_use]
    pub(super) fn log_request(
        &self,
        client: &str,
        method: &str,
        to: Destination<'_>,
        path: &str,
        address: Option<SocketAddr>,
        decision: Decision,
        rule: &str,
    ) -> bool {
        self.log(NetEvent {
            phase: NetPhase::Decision,
            client: client.into(),
            method: method.into(),
            host: to.host.into(),
            port: to.port,
            path: Some(path.into()),
            address: address.map(|a| a.ip().to_string()),
            decision: Some(decision),
            rule: rule.into(),
            ..Default::default()
        })
    }
}
