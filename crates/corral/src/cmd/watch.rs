//! `corral watch`: a terminal view of the project's running jails and their audit log, with one
//! key each to allow a denied destination for the run (the jail's control socket, control.rs),
//! add it to the project's `corral.toml`, or deny it there (the edit `corral allow`/`deny` make,
//! cmd/rules.rs). Running jails apply file edits by themselves (live.rs); `corral watch` also
//! asks each to reload at once.
//!
//! What the jail sent (hosts, rules) is shown through `corral_audit::printable`, so no escape
//! sequence of the agent's reaches the user's terminal.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use corral_audit::{AuditLog, Decision, Event, JailEvent, NetEvent, NetPhase, Record, printable};
use crossterm::event::{self, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table, TableState};

use super::rules::{Rule, Target};
use crate::cli::WatchArgs;
use crate::control;
use corral_net::ask::Question;

/// The most rows kept in memory (at least; `-n` may ask for more).
const KEEP: usize = 2000;

pub fn run(args: WatchArgs) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal as _;
    if !(std::io::stdin().is_terminal() && std::io::stdout().is_terminal()) {
        anyhow::bail!(
            "corral watch draws on a terminal and reads its keys: run it in one (a tmux pane \
             over ssh works); to follow the log in a pipe: corral log --follow"
        );
    }
    let root = super::log::project_root()?;
    let log = AuditLog::for_project(&root).context("cannot locate the audit log")?;
    let mut app = App {
        keep: args.lines.max(KEEP),
        policy: root.join("corral.toml"),
        root,
        rows: VecDeque::new(),
        tail: Tail::new(log.path()),
        jails: Vec::new(),
        asks: Vec::new(),
        selected: None,
        status:
            "keys: a allow for this run · p add to corral.toml · d deny in corral.toml · q quit"
                .into(),
    };
    app.tail.read_new(&mut app.rows, app.keep)?;
    let skip = app.rows.len().saturating_sub(args.lines);
    app.rows.drain(..skip);
    app.jails = control::list(&app.root);
    let mut terminal = ratatui::try_init().context("cannot set up the terminal")?;
    let result = app.event_loop(&mut terminal);
    ratatui::restore();
    result.map(|()| ExitCode::SUCCESS)
}

struct App {
    /// How many rows are kept.
    keep: usize,
    root: PathBuf,
    policy: PathBuf,
    rows: VecDeque<Record>,
    tail: Tail,
    jails: Vec<control::Entry>,
    /// The questions the running jails hold connections for (`network.on_deny = "ask"`),
    /// with the jail's socket: the keys answer the first one while there is one.
    asks: Vec<(control::Entry, Question)>,
    /// The selected row; `None` follows the latest denial.
    selected: Option<usize>,
    status: String,
}

impl App {
    fn event_loop(&mut self, terminal: &mut ratatui::DefaultTerminal) -> anyhow::Result<()> {
        let mut ticks = 0u32;
        loop {
            terminal
                .draw(|f| self.draw(f))
                .context("cannot draw on the terminal")?;
            if event::poll(Duration::from_millis(200)).context("cannot read the terminal")?
                && let event::Event::Key(key) = event::read().context("cannot read a key")?
                && key.kind == KeyEventKind::Press
                && !self.key(key)
            {
                return Ok(());
            }
            let excess = self.tail.read_new(&mut self.rows, self.keep)?;
            if let Some(s) = self.selected.as_mut() {
                *s = s.saturating_sub(excess);
            }
            ticks += 1;
            if ticks.is_multiple_of(5) {
                self.jails = control::list(&self.root);
            }
            self.asks = pending_questions(&self.jails);
        }
    }

    /// Handle one key; `false` to quit.
    fn key(&mut self, key: KeyEvent) -> bool {
        let last = self.rows.len().saturating_sub(1);
        match key.code {
            KeyCode::Char('q') => return false,
            KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => return false,
            KeyCode::Up | KeyCode::Char('k') => {
                self.selected = Some(self.selected.unwrap_or(last).saturating_sub(1));
            }
            KeyCode::Down | KeyCode::Char('j') => {
                self.selected = self.selected.map(|s| (s + 1).min(last));
            }
            KeyCode::Esc | KeyCode::End => self.selected = None,
            KeyCode::Char('a' | 'p' | 'd' | 'r') if !self.asks.is_empty() => {
                self.status = self.answer(key.code);
                self.asks = pending_questions(&self.jails);
            }
            KeyCode::Char('a') => self.status = self.act(Action::AllowRun),
            KeyCode::Char('p') => self.status = self.act(Action::Edit(Rule::Allow)),
            KeyCode::Char('d') => self.status = self.act(Action::Edit(Rule::Deny)),
            _ => {}
        }
        true
    }

    /// The denial a key acts on: the selected row when it is one, else the latest.
    fn target_row(&self) -> Option<&Record> {
        match self.selected {
            Some(i) => self.rows.get(i).filter(|r| denial(r).is_some()),
            None => self.rows.iter().rev().find(|r| denial(r).is_some()),
        }
    }

    fn act(&self, action: Action) -> String {
        let Some(record) = self.target_row() else {
            return "no denial selected".into();
        };
        let n = denial(record).expect("a denial");
        let raw = destination(n);
        let target = match Target::parse(&raw) {
            Ok(t) if !raw.starts_with('*') => t,
            _ => return format!("{} is not a host corral can allow", printable(&raw)),
        };
        let shown = printable(&raw);
        match action {
            Action::AllowRun => match self.jails.iter().find(|j| j.jail == record.jail) {
                // A container run's decisions are the shared proxy container's, recorded
                // under the proxy's own id.
                None if self.jails.iter().any(|j| j.engine.is_some()) => format!(
                    "{} is not a running native jail; allow for this run only is not available \
                     in container runs (the project's proxy container is shared): press p",
                    record.jail
                ),
                None => format!("jail {} is not running: nothing to allow", record.jail),
                Some(j) => match control::request(&j.socket, &format!("allow {raw}")) {
                    Ok(answer) => format!("{}: {}", j.jail, printable(&answer)),
                    Err(e) => format!("{}: {}", j.jail, printable(&format!("{e:#}"))),
                },
            },
            Action::Edit(rule) => match super::rules::edit_project(&self.policy, rule, &[target]) {
                Ok(edit) => {
                    let mut s = format!(
                        "{} {shown} in {}",
                        match rule {
                            Rule::Allow => "allowed",
                            Rule::Deny => "denied",
                        },
                        self.policy.display()
                    );
                    if !edit.trusted {
                        s.push_str(
                            " (the file is not trusted: running jails keep their rules until \
                             you run `corral trust`)",
                        );
                    }
                    for j in &self.jails {
                        let _ = control::request(&j.socket, "reload");
                    }
                    s
                }
                Err(e) => printable(&format!("{e:#}")),
            },
        }
    }

    /// Answer the first pending question: `a` allow for this run, `p` add to corral.toml and
    /// allow, `d`/`r` refuse now.
    fn answer(&self, key: KeyCode) -> String {
        let Some((jail, q)) = self.asks.first() else {
            return "no question pending".into();
        };
        let raw = question_destination(q);
        let shown = printable(&raw);
        let request = |line: &str| match control::request(&jail.socket, line) {
            Ok(answer) => format!("{}: {}", jail.jail, printable(&answer)),
            Err(e) => format!("{}: {}", jail.jail, printable(&format!("{e:#}"))),
        };
        match key {
            KeyCode::Char('d' | 'r') => request(&format!("refuse {}:{}", q.host, q.port)),
            KeyCode::Char('p') => {
                let target = match Target::parse(&raw) {
                    Ok(t) => t,
                    Err(_) => return format!("{shown} is not a host corral can allow"),
                };
                let edited = match super::rules::edit_project(&self.policy, Rule::Allow, &[target])
                {
                    Ok(_) => format!("allowed {shown} in {}; ", self.policy.display()),
                    Err(e) => format!("{}; ", printable(&format!("{e:#}"))),
                };
                for j in &self.jails {
                    let _ = control::request(&j.socket, "reload");
                }
                edited + &request(&format!("allow {raw}"))
            }
            _ => request(&format!("allow {raw}")),
        }
    }

    fn draw(&self, f: &mut ratatui::Frame) {
        let shown_asks = self.asks.len().min(MAX_ASKS_SHOWN);
        let [head, body, foot] = Layout::vertical([
            Constraint::Length(2 + shown_asks as u16),
            Constraint::Min(3),
            Constraint::Length(2),
        ])
        .areas(f.area());
        let jails = if self.jails.is_empty() {
            "no running jail".to_string()
        } else {
            self.jails
                .iter()
                .map(|j| match &j.engine {
                    Some(engine) => format!("{} ({engine}, pid {})", j.jail, j.pid),
                    None => format!("{} (pid {})", j.jail, j.pid),
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut lines = vec![
            Line::from(format!("corral watch  {}", self.root.display())),
            Line::from(format!("running: {jails}")),
        ];
        let asking = Style::default()
            .fg(Color::Yellow)
            .add_modifier(Modifier::BOLD | Modifier::REVERSED);
        for (i, (jail, q)) in self.asks.iter().take(shown_asks).enumerate() {
            let keys = match i {
                0 => "  a allow for this run · p add to corral.toml · d/r refuse",
                _ => "",
            };
            let text = format!(
                "ASK {} {}:{} ({}, {} s left){keys}",
                q.method, q.host, q.port, jail.jail, q.remaining
            );
            lines.push(Line::styled(printable(&text), asking));
        }
        f.render_widget(Paragraph::new(lines), head);
        let target = self.target_row().map(|r| r as *const Record);
        let rows: Vec<Row> = self
            .rows
            .iter()
            .map(|r| {
                let picked = target == Some(r as *const Record);
                row(r, picked)
            })
            .collect();
        let mut state = TableState::default();
        state.select(Some(
            self.selected.unwrap_or(self.rows.len().saturating_sub(1)),
        ));
        let table = Table::new(
            rows,
            [
                Constraint::Length(8),
                Constraint::Length(16),
                Constraint::Length(6),
                Constraint::Percentage(35),
                Constraint::Fill(1),
            ],
        )
        .header(
            Row::new(["TIME", "JAIL", "", "TARGET", "RULE"])
                .style(Style::default().add_modifier(Modifier::BOLD)),
        )
        .block(Block::default().borders(Borders::TOP | Borders::BOTTOM));
        let table = if self.selected.is_some() {
            table.row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
        } else {
            table
        };
        f.render_stateful_widget(table, body, &mut state);
        f.render_widget(
            Paragraph::new(vec![
                Line::from(
                    "a allow for this run  p add to corral.toml  d deny in corral.toml  \
                     up/down select  q quit",
                ),
                Line::from(self.status.clone()),
            ]),
            foot,
        );
    }
}

/// Questions shown at once at the top (the rest wait their turn).
const MAX_ASKS_SHOWN: usize = 5;

/// The pending questions of the running jails, oldest first per jail.
fn pending_questions(jails: &[control::Entry]) -> Vec<(control::Entry, Question)> {
    let mut out = Vec::new();
    for j in jails {
        let Ok(answer) = control::request(&j.socket, "asks") else {
            continue;
        };
        let Some(json) = answer.strip_prefix("ok ") else {
            continue;
        };
        for q in serde_json::from_str::<Vec<Question>>(json).unwrap_or_default() {
            out.push((j.clone(), q));
        }
    }
    out
}

/// What to allow for a question, as [`destination`] writes it for a denial.
fn question_destination(q: &Question) -> String {
    let host = q.host.trim_start_matches('[').trim_end_matches(']');
    destination(&NetEvent {
        method: q.method.clone(),
        host: host.to_string(),
        port: q.port,
        ..NetEvent::default()
    })
}

enum Action {
    AllowRun,
    Edit(Rule),
}

/// The network denial a record is, if it is one.
fn denial(r: &Record) -> Option<&NetEvent> {
    match &r.event {
        Event::Net(n) if n.phase == NetPhase::Decision && n.decision == Some(Decision::Deny) => {
            Some(n)
        }
        _ => None,
    }
}

/// What to allow for a denied request: the host, with its port unless it is the default port
/// of the request kind (CONNECT and SOCKS 443, plain HTTP 80), as the proxy's hint writes it.
fn destination(n: &NetEvent) -> String {
    let host = if n.host.contains(':') {
        format!("[{}]", n.host)
    } else {
        n.host.clone()
    };
    let default = match n.method.as_str() {
        "CONNECT" | "SOCKS5" => 443,
        _ => 80,
    };
    if n.port == default {
        host
    } else {
        format!("{host}:{}", n.port)
    }
}

fn row(r: &Record, picked: bool) -> Row<'static> {
    let time = r.time.get(11..19).unwrap_or(&r.time).to_string();
    let (word, target, rule, style) = match &r.event {
        Event::Net(n) => {
            let (word, style) = match n.decision {
                Some(Decision::Deny) => (
                    "DENY",
                    Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
                ),
                Some(Decision::Allow) => ("allow", Style::default().fg(Color::Green)),
                None => ("-", Style::default()),
            };
            let target = format!("{} {}:{}", n.method, n.host, n.port);
            (word, target, n.rule.clone(), style)
        }
        Event::Exec(e) => (
            "exec",
            e.command.join(" "),
            e.reason.clone().unwrap_or_default(),
            Style::default().add_modifier(Modifier::DIM),
        ),
        Event::Jail(j) => (
            "jail",
            j.name().to_string(),
            j.summary(),
            Style::default().fg(Color::Cyan),
        ),
    };
    let style = if picked {
        style.add_modifier(Modifier::UNDERLINED)
    } else {
        style
    };
    Row::new([
        time,
        r.jail.clone(),
        word.to_string(),
        printable(&target),
        printable(&rule),
    ])
    .style(style)
}

/// Whether a record is one `corral watch` shows: network decisions, commands, lifecycle events.
fn shown(r: &Record) -> bool {
    match &r.event {
        Event::Net(n) => n.phase == NetPhase::Decision,
        Event::Exec(_) => true,
        Event::Jail(j) => !matches!(j, JailEvent::Changes { .. }),
    }
}

/// The audit log read as it grows; a rotated log (renamed, a new file started) is followed.
struct Tail {
    path: PathBuf,
    file: Option<(BufReader<File>, u64)>,
    partial: String,
}

impl Tail {
    fn new(path: &Path) -> Tail {
        Tail {
            path: path.to_path_buf(),
            file: None,
            partial: String::new(),
        }
    }

    /// Append the records written since the last call to `rows`, keeping the last `keep`; how
    /// many were dropped from the front.
    fn read_new(&mut self, rows: &mut VecDeque<Record>, keep: usize) -> anyhow::Result<usize> {
        let mut dropped = 0;
        loop {
            if self.file.is_none() {
                match File::open(&self.path) {
                    Ok(f) => {
                        let ino = f.metadata().map(|m| m.ino()).unwrap_or(0);
                        self.file = Some((BufReader::new(f), ino));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(dropped),
                    Err(e) => {
                        return Err(e)
                            .with_context(|| format!("cannot open {}", self.path.display()));
                    }
                }
            }
            let Some((reader, ino)) = self.file.as_mut() else {
                return Ok(dropped);
            };
            while reader
                .read_line(&mut self.partial)
                .with_context(|| format!("reading {}", self.path.display()))?
                > 0
            {
                if !self.partial.ends_with('\n') {
                    break;
                }
                if let Ok(r) = serde_json::from_str::<Record>(self.partial.trim_end())
                    && shown(&r)
                {
                    rows.push_back(r);
                    if rows.len() > keep {
                        rows.pop_front();
                        dropped += 1;
                    }
                }
                self.partial.clear();
            }
            let rotated = std::fs::metadata(&self.path).map_or(true, |m| m.ino() != *ino);
            if !rotated {
                return Ok(dropped);
            }
            self.file = None;
            self.partial.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(method: &str, host: &str, port: u16) -> NetEvent {
        NetEvent {
            method: method.into(),
            host: host.into(),
            port,
            ..NetEvent::default()
        }
    }

    #[test]
    fn the_destination_keeps_the_port_only_when_it_is_not_the_default() {
        assert_eq!(
            destination(&net("CONNECT", "github.com", 443)),
            "github.com"
        );
        assert_eq!(destination(&net("GET", "github.com", 80)), "github.com");
        assert_eq!(
            destination(&net("GET", "github.com", 443)),
            "github.com:443"
        );
        assert_eq!(destination(&net("SOCKS5", "::1", 8080)), "[::1]:8080");
        assert_eq!(
            destination(&net("CONNECT", "127.0.0.1", 8443)),
            "127.0.0.1:8443"
        );
    }
}
