//! `corral watch`: a terminal view of the project's running jails and their audit log, with one
//! key each to allow a denied destination for the run (the jail's control socket, control.rs),
//! add it to the project's `corral.toml`, or deny it there (the edit `corral allow`/`deny` make,
//! cmd/rules.rs). Running jails apply file edits by themselves (live.rs); `corral watch` also
//! asks each to reload at once.
//!
//! What the jail sent (hosts, rules) is shown through `corral_audit::printable`, so no escape
//! sequence of the agent's reaches the user's terminal. A destination always shows its
//! registrable domain and port, its middle left out behind a marker when the screen is too
//! narrow (fit.rs); a name the screen could not show whole is not allowed by a key.

mod fit;

use std::cell::Cell;

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
use corral_net::ask::Question;
use corral_run::control;

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
        review: None,
        selected: None,
        width: Cell::new(0),
        status:
            "keys: a allow for this run · p add to corral.toml · d deny in corral.toml · q quit"
                .into(),
    };
    app.tail.read_new(&mut app.rows, app.keep)?;
    let skip = app.rows.len().saturating_sub(args.lines);
    app.rows.drain(..skip);
    app.jails = control::list(&app.root);
    app.review = review_line(&app.root);
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
    /// A review run's pending changes (`corral run --review`): a count and their stat.
    review: Option<String>,
    /// The selected row; `None` follows the latest denial.
    selected: Option<usize>,
    /// The terminal's width at the last draw: what the keys act on was laid out in it.
    width: Cell<u16>,
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
            // The change set is read whole (each file hashed): every 5 s.
            if ticks.is_multiple_of(25) {
                self.review = review_line(&self.root);
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
        if !matches!(action, Action::Edit(Rule::Deny)) {
            let cols = target_columns(self.width.get());
            if let Err(refusal) = shown_whole(&n.method, &n.host, n.port, cols) {
                return refusal;
            }
        }
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
        if matches!(key, KeyCode::Char('a' | 'p'))
            && let Err(refusal) = ask_parts(self.width.get(), jail, q, 0).1
        {
            return refusal;
        }
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
        self.width.set(f.area().width);
        let shown_asks = self.asks.len().min(MAX_ASKS_SHOWN);
        let review_rows = u16::from(self.review.is_some());
        let [head, body, foot] = Layout::vertical([
            Constraint::Length(2 + review_rows + shown_asks as u16),
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
        if let Some(review) = &self.review {
            lines.push(Line::styled(
                review.clone(),
                Style::default().fg(Color::Cyan),
            ));
        }
        let asking = Style::default()
            .fg(Color::Yellow)
            .add_modifier(Modifier::BOLD | Modifier::REVERSED);
        for (i, (jail, q)) in self.asks.iter().take(shown_asks).enumerate() {
            let (text, _) = ask_parts(f.area().width, jail, q, i);
            lines.push(Line::styled(text, asking));
        }
        f.render_widget(Paragraph::new(lines), head);
        let target = self.target_row().map(|r| r as *const Record);
        let target_cols = target_columns(f.area().width);
        let rows: Vec<Row> = self
            .rows
            .iter()
            .map(|r| {
                let picked = target == Some(r as *const Record);
                row(r, picked, target_cols)
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
                Constraint::Length(target_cols as u16),
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

/// The pending review of `root`, in one line: how many changes, of which kind, the first of
/// them, and the commands; none without a review.
fn review_line(root: &Path) -> Option<String> {
    use corral_session::review::upper::What;
    let paths = corral_session::review::Paths::for_project(root).ok()?;
    if !paths.pending() {
        return None;
    }
    let changes = match corral_session::review::upper::changes(&paths, &[]) {
        Ok(c) => c,
        Err(e) => return Some(format!("review: cannot read the change set: {e:#}")),
    };
    let count = |w: What| changes.iter().filter(|c| c.what == w).count();
    let first = corral_session::review::show::stat_lines(&changes, 3).join(" · ");
    Some(format!(
        "review: {} pending ({} added, {} modified, {} deleted): {first}  [corral diff · accept · discard]",
        changes.len(),
        count(What::Added),
        count(What::Modified),
        count(What::Deleted),
    ))
}

/// Questions shown at once at the top (the rest wait their turn).
const MAX_ASKS_SHOWN: usize = 5;

/// The keys of the first question.
const ASK_KEYS: &str = "  a allow for this run · p add to corral.toml · d/r refuse";

/// The columns of the table's TARGET column in a terminal `width` wide: a fixed share, and
/// none below 60 columns (where the fixed columns would squeeze it).
fn target_columns(width: u16) -> usize {
    if width < 60 {
        0
    } else {
        usize::from(width) * 35 / 100
    }
}

/// The `n`th question's line in a terminal `width` wide (its destination fitted into what the
/// rest of the line leaves, never losing its registrable domain and port), and whether a key
/// may allow it: an error saying why not when the destination was not shown whole.
fn ask_parts(
    width: u16,
    jail: &control::Entry,
    q: &Question,
    n: usize,
) -> (String, Result<(), String>) {
    let prefix = format!("ASK {} ", printable(&q.method));
    let suffix = format!(
        " ({}, {} s left){}",
        printable(&jail.jail),
        q.remaining,
        if n == 0 { ASK_KEYS } else { "" }
    );
    let cols = usize::from(width).saturating_sub(fit::width(&prefix) + fit::width(&suffix));
    let fitted = fit::fit(&printable(&q.host), q.port, cols);
    let verdict = match fitted.whole {
        true => Ok(()),
        false => Err(too_long(&q.host, q.port)),
    };
    (format!("{prefix}{}{suffix}", fitted.text), verdict)
}

/// Whether a denial's destination shows whole in `cols` columns as `METHOD HOST:PORT`.
fn shown_whole(method: &str, host: &str, port: u16, cols: usize) -> Result<(), String> {
    let method = printable(method);
    let fitted = fit::fit(
        &printable(host),
        port,
        cols.saturating_sub(fit::width(&method) + 1),
    );
    match fitted.whole {
        true => Ok(()),
        false => Err(too_long(host, port)),
    }
}

/// Why a key did not allow a destination the screen showed only in part.
fn too_long(host: &str, port: u16) -> String {
    format!(
        "not allowed: {}:{port} ({} characters) was not shown whole; widen the terminal or run \
         `corral allow NAME`",
        fit::registrable(&printable(host)),
        host.chars().count()
    )
}

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

fn row(r: &Record, picked: bool, target_cols: usize) -> Row<'static> {
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
            let method = printable(&n.method);
            let cols = target_cols.saturating_sub(fit::width(&method) + 1);
            let fitted = fit::fit(&printable(&n.host), n.port, cols);
            // Made printable before it is fitted, so the marker is the only thing left out.
            let target = format!("{method} {}", fitted.text);
            (word, target, n.rule.clone(), style)
        }
        Event::Exec(e) => (
            "exec",
            printable(&e.command.join(" ")),
            e.reason.clone().unwrap_or_default(),
            Style::default().add_modifier(Modifier::DIM),
        ),
        Event::Jail(j) => (
            "jail",
            printable(j.name()),
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
        target,
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

    /// A 253-character name that starts like api.github.com, asked about on an 80-column
    /// screen: the line shows its registrable domain, port and keys, and `a` is refused; on a
    /// screen wide enough for the whole name it is allowed.
    #[test]
    fn a_question_shows_the_domain_and_port_and_is_not_allowed_unless_whole() {
        let host = format!(
            "api.github.com.{}.{}.{}.{}.attacker.example",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(29)
        );
        let jail = control::Entry {
            jail: "j1".into(),
            pid: 1,
            project: PathBuf::from("/p"),
            started: String::new(),
            socket: PathBuf::from("/s"),
            engine: None,
        };
        let q = Question {
            id: 1,
            method: "CONNECT".into(),
            host: host.clone(),
            port: 8443,
            rule: "not in network.allow".into(),
            held: 1,
            remaining: 30,
        };
        let (text, verdict) = ask_parts(160, &jail, &q, 0);
        let keys = " (j1, 30 s left)  a allow for this run · p add to corral.toml · d/r refuse";
        let name_cols = 160 - "ASK CONNECT ".len() - fit::width(keys);
        assert_eq!(
            text,
            format!(
                "ASK CONNECT {}{}….attacker.example:8443{keys}",
                "api.github.com.",
                "a".repeat(name_cols - 15 - 1 - 22)
            )
        );
        assert_eq!(fit::width(&text), 160);
        let refusal = verdict.unwrap_err();
        assert!(
            refusal.starts_with("not allowed: attacker.example:8443 (253 characters)"),
            "{refusal}"
        );
        // Wide enough for all of it: shown whole, and a key may allow it.
        let (text, verdict) = ask_parts(400, &jail, &q, 0);
        assert!(text.contains(&format!("{host}:8443")), "{text}");
        assert_eq!(verdict, Ok(()));
        // A denial row's target column follows the same rule.
        assert!(shown_whole("CONNECT", &host, 8443, target_columns(120)).is_err());
        assert!(shown_whole("CONNECT", "api.github.com", 443, target_columns(120)).is_ok());
        assert!(shown_whole("CONNECT", "api.github.com", 443, target_columns(59)).is_err());
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
