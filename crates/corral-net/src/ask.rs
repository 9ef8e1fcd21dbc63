//! Questions about destinations the allow list does not name (`network.on_deny = "ask"`).
//!
//! With "ask", a CONNECT, SOCKS5 or plain-HTTP request that only the allow list refuses (not a
//! deny rule, not the address checks) is held while `corral watch` asks the user: the question
//! is published here (the run's control socket lists and answers it; the jail cannot reach that
//! socket), and the connection waits for an answer or the timeout.
//!
//! Invariants:
//! - one question per `host:port`, however many connections wait on it;
//! - at most [`MAX_HELD`] connections held per proxy (one proxy per jail); beyond it a request
//!   is refused at once, and so is one whose hold the proxy's head budget cannot cover
//!   ([`HELD_BYTES`] each);
//! - a held connection whose client goes away stops waiting; a question nobody waits on any
//!   more is withdrawn (no answer needed);
//! - an answer "allow" only wakes the connections: they decide again with the rules in force
//!   (the run-only allow the control socket added), so a deny rule still wins;
//! - a destination refused in `corral watch` is refused at once for the rest of the run.
//!
//! Whoever tells the user where to answer (the terminal title, a line, a desktop notification:
//! corral-run's `held.rs`) follows the questions through [`Asks::watch`]: a wake-up that never
//! blocks the proxy and never queues (at most one pending), after which it reads [`Asks::list`].

use std::collections::BTreeSet;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use corral_policy::domain::Host;

use crate::rules::{Kind, Rules, host_display};

/// Connections a proxy holds at once for questions.
pub const MAX_HELD: usize = 64;
/// Bytes of the proxy's head budget a held connection counts for: the early bytes it may keep
/// (read to notice the client going away) and its state.
pub const HELD_BYTES: usize = 8 * 1024;
/// Destinations refused in `corral watch` remembered for the run (beyond it they are asked
/// again).
const REFUSED_KEPT: usize = 1000;

/// The user's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Allow,
    Refuse,
}

/// A pending question, as the control socket lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Question {
    pub id: u64,
    /// The first request's method (`CONNECT`, `SOCKS5`, `GET`, ...).
    pub method: String,
    pub host: String,
    pub port: u16,
    /// Why the rules refuse it (`not in network.allow`).
    pub rule: String,
    /// Connections waiting on it.
    pub held: usize,
    /// Seconds left before it is refused.
    pub remaining: u64,
}

struct Pending {
    id: u64,
    method: String,
    host: Host,
    port: u16,
    kind: Kind,
    rule: String,
    deadline: Instant,
    held: usize,
    answer: watch::Sender<Option<Answer>>,
}

impl Pending {
    fn key(&self) -> (String, u16) {
        (host_display(&self.host), self.port)
    }
}

#[derive(Default)]
struct State {
    next: u64,
    pending: Vec<Pending>,
    held: usize,
    refused: BTreeSet<(String, u16)>,
    /// The watcher's wake-up ([`Asks::watch`]).
    watcher: Option<SyncSender<()>>,
}

impl State {
    /// Wake the watcher: the pending questions changed. A wake-up already pending covers this
    /// one (the watcher reads the list once awake), so this never blocks nor queues.
    fn changed(&self) {
        if let Some(w) = &self.watcher {
            let _ = w.try_send(());
        }
    }
}

/// The questions of one proxy.
#[derive(Default)]
pub struct Asks {
    state: Mutex<State>,
}

/// Why a connection is not held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotHeld {
    /// [`MAX_HELD`] connections are held already.
    Full,
    /// The user refused this destination earlier in the run.
    Refused,
}

/// How a hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Refused,
    TimedOut,
}

/// One held connection's place in a question; leaving it when dropped.
pub struct Hold {
    asks: Arc<Asks>,
    id: u64,
    /// Whether this connection asked it (the others joined).
    pub first: bool,
    deadline: Instant,
    answer: watch::Receiver<Option<Answer>>,
}

impl Asks {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hold a connection to `host:port` on its question (asked now unless pending already).
    pub fn hold(
        self: &Arc<Self>,
        (host, port, kind): (&Host, u16, Kind),
        method: &str,
        rule: &str,
        timeout: Duration,
    ) -> Result<Hold, NotHeld> {
        let mut st = self.lock();
        let key = (host_display(host), port);
        if st.refused.contains(&key) {
            return Err(NotHeld::Refused);
        }
        if st.held >= MAX_HELD {
            return Err(NotHeld::Full);
        }
        st.held += 1;
        if let Some(p) = st.pending.iter_mut().find(|p| p.key() == key) {
            p.held += 1;
            return Ok(Hold {
                asks: self.clone(),
                id: p.id,
                first: false,
                deadline: p.deadline,
                answer: p.answer.subscribe(),
            });
        }
        st.next += 1;
        let id = st.next;
        let (tx, rx) = watch::channel(None);
        let deadline = Instant::now() + timeout;
        st.pending.push(Pending {
            id,
            method: method.to_string(),
            host: host.clone(),
            port,
            kind,
            rule: rule.to_string(),
            deadline,
            held: 1,
            answer: tx,
        });
        st.changed();
        Ok(Hold {
            asks: self.clone(),
            id,
            first: true,
            deadline,
            answer: rx,
        })
    }

    /// Follow the questions: the receiver wakes (at least once) after each change of the
    /// pending questions (one asked, answered, timed out or withdrawn); [`Asks::list`] then
    /// says what is pending. One watcher at a time (a new call replaces the previous one);
    /// [`Asks::unwatch`] ends it (its receiver then sees the channel closed).
    pub fn watch(&self) -> Receiver<()> {
        let (tx, rx) = sync_channel(1);
        self.lock().watcher = Some(tx);
        rx
    }

    /// Stop waking the watcher: its receiver sees the channel closed.
    pub fn unwatch(&self) {
        self.lock().watcher = None;
    }

    /// The pending questions, oldest first.
    pub fn list(&self) -> Vec<Question> {
        let now = Instant::now();
        self.lock()
            .pending
            .iter()
            .map(|p| Question {
                id: p.id,
                method: p.method.clone(),
                host: host_display(&p.host),
                port: p.port,
                rule: p.rule.clone(),
                held: p.held,
                remaining: p.deadline.saturating_duration_since(now).as_secs(),
            })
            .collect()
    }

    /// Refuse the questions about `host` (`HOST` or `HOST:PORT`, as listed); how many there
    /// were. The destination is refused at once for the rest of the run.
    pub fn refuse(&self, host: &str) -> usize {
        let mut st = self.lock();
        let matching: Vec<(String, u16)> = st
            .pending
            .iter()
            .map(Pending::key)
            .filter(|(h, p)| host == h || host == format!("{h}:{p}"))
            .collect();
        for key in &matching {
            if st.refused.len() < REFUSED_KEPT {
                st.refused.insert(key.clone());
            }
        }
        st.pending.retain(|p| {
            let hit = matching.contains(&p.key());
            if hit {
                p.answer.send_replace(Some(Answer::Refuse));
            }
            !hit
        });
        if !matching.is_empty() {
            st.changed();
        }
        matching.len()
    }

    /// Wake the questions the rules now allow (after a run-only allow or a policy reload);
    /// how many. Their connections decide again with the rules in force.
    pub fn settle(&self, rules: &Rules) -> usize {
        let mut st = self.lock();
        let before = st.pending.len();
        st.pending.retain(|p| {
            let allowed = rules.check_name(&p.host, p.port, p.kind).is_ok();
            if allowed {
                p.answer.send_replace(Some(Answer::Allow));
            }
            !allowed
        });
        if st.pending.len() != before {
            st.changed();
        }
        before - st.pending.len()
    }

    /// Connections held now.
    pub fn held(&self) -> usize {
        self.lock().held
    }
}

impl Hold {
    /// Wait for the answer or the deadline.
    pub async fn wait(&mut self) -> Outcome {
        let deadline = tokio::time::Instant::from_std(self.deadline);
        let answered = async {
            loop {
                if let Some(a) = *self.answer.borrow_and_update() {
                    return a;
                }
                if self.answer.changed().await.is_err() {
                    // Withdrawn without an answer (cannot happen while this hold exists).
                    return Answer::Refuse;
                }
            }
        };
        match tokio::time::timeout_at(deadline, answered).await {
            Ok(Answer::Allow) => Outcome::Allowed,
            Ok(Answer::Refuse) => Outcome::Refused,
            Err(_) => Outcome::TimedOut,
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut st = self.asks.lock();
        st.held -= 1;
        // The question goes when nobody waits on it any more (answered questions went already).
        let id = self.id;
        if let Some(i) = st.pending.iter().position(|p| p.id == id) {
            st.pending[i].held -= 1;
            if st.pending[i].held == 0 {
                st.pending.remove(i);
                st.changed();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_policy::domain::DomainPattern;

    fn name(n: &str) -> Host {
        Host::Name(n.into())
    }

    const T: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn one_question_per_destination_withdrawn_when_nobody_waits() {
        let asks = Arc::new(Asks::default());
        let h = name("a.example");
        let one = asks
            .hold((&h, 443, Kind::Connect), "CONNECT", "r", T)
            .unwrap();
        let two = asks
            .hold((&h, 443, Kind::Connect), "CONNECT", "r", T)
            .unwrap();
        let other = asks
            .hold((&h, 8443, Kind::Connect), "CONNECT", "r", T)
            .unwrap();
        assert!(one.first && !two.first && other.first);
        let listed = asks.list();
        assert_eq!(listed.len(), 2);
        assert_eq!(
            (listed[0].host.as_str(), listed[0].port, listed[0].held),
            ("a.example", 443, 2)
        );
        drop(one);
        assert_eq!(asks.list()[0].held, 1);
        drop(two);
        drop(other);
        assert!(asks.list().is_empty());
        assert_eq!(asks.held(), 0);
    }

    #[tokio::test]
    async fn the_held_connections_are_bounded() {
        let asks = Arc::new(Asks::default());
        let held: Vec<Hold> = (0..MAX_HELD)
            .map(|i| {
                let h = name(&format!("h{i}.example"));
                asks.hold((&h, 443, Kind::Connect), "CONNECT", "r", T)
                    .unwrap()
            })
            .collect();
        let h = name("h0.example");
        assert_eq!(
            asks.hold((&h, 443, Kind::Connect), "CONNECT", "r", T).err(),
            Some(NotHeld::Full)
        );
        drop(held);
        assert!(
            asks.hold((&h, 443, Kind::Connect), "CONNECT", "r", T)
                .is_ok()
        );
    }

    #[tokio::test]
    async fn an_allow_wakes_only_what_the_rules_now_allow_and_a_refusal_sticks() {
        let asks = Arc::new(Asks::default());
        let (a, b) = (name("a.example"), name("b.example"));
        let mut ha = asks
            .hold((&a, 443, Kind::Connect), "CONNECT", "r", T)
            .unwrap();
        let mut hb = asks
            .hold((&b, 443, Kind::Connect), "CONNECT", "r", T)
            .unwrap();
        // The answer "allow" for a host the rules still deny (a deny rule wins) wakes nothing.
        let denied = Rules {
            allow: vec![DomainPattern::parse("a.example").unwrap()],
            deny: vec![DomainPattern::parse("a.example").unwrap()],
            ..Rules::default()
        };
        assert_eq!(asks.settle(&denied), 0);
        let allowed = Rules {
            allow: vec![DomainPattern::parse("a.example").unwrap()],
            ..Rules::default()
        };
        assert_eq!(asks.settle(&allowed), 1);
        assert_eq!(ha.wait().await, Outcome::Allowed);
        assert_eq!(asks.refuse("b.example:443"), 1);
        assert_eq!(hb.wait().await, Outcome::Refused);
        assert!(asks.list().is_empty());
        assert_eq!(
            asks.hold((&b, 443, Kind::Connect), "CONNECT", "r", T).err(),
            Some(NotHeld::Refused)
        );
    }

    #[tokio::test]
    async fn the_watcher_wakes_on_each_change_without_a_queue() {
        use std::sync::mpsc::TryRecvError;
        let asks = Arc::new(Asks::default());
        let rx = asks.watch();
        let (a, b) = (name("a.example"), name("b.example"));
        // Two questions asked before the watcher looks: one wake-up, two questions listed.
        let ha = asks
            .hold((&a, 443, Kind::Connect), "CONNECT", "r", T)
            .unwrap();
        let hb = asks
            .hold((&b, 443, Kind::Connect), "CONNECT", "r", T)
            .unwrap();
        assert_eq!(rx.try_recv(), Ok(()));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        assert_eq!(asks.list().len(), 2);
        // Joining a pending question changes nothing.
        let ha2 = asks
            .hold((&a, 443, Kind::Connect), "CONNECT", "r", T)
            .unwrap();
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        // A refusal, and a question withdrawn when its last connection goes, each wake it.
        assert_eq!(asks.refuse("b.example"), 1);
        assert_eq!(rx.try_recv(), Ok(()));
        drop(hb);
        drop(ha);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        drop(ha2);
        assert_eq!(rx.try_recv(), Ok(()));
        assert!(asks.list().is_empty());
        asks.unwatch();
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    }

    #[tokio::test]
    async fn no_answer_is_a_refusal_at_the_deadline() {
        let asks = Arc::new(Asks::default());
        let h = name("a.example");
        let mut hold = asks
            .hold(
                (&h, 443, Kind::Connect),
                "CONNECT",
                "r",
                Duration::from_secs(2),
            )
            .unwrap();
        assert_eq!(hold.wait().await, Outcome::TimedOut);
    }
}
