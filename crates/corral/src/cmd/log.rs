//! `corral log [--follow] [--blocked] [--json] [--since WHEN] [-n N]`: the current project's
//! audit log. Times are shown in UTC, as they are stored.

use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use corral_audit::{AuditLog, Decision, Event, Record, printable};

use crate::cli::LogArgs;

/// The current project's root, as the policy resolver finds it (git root, else cwd).
pub fn project_root() -> anyhow::Result<PathBuf> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    Ok(corral_policy::resolve::project_root(&cwd))
}

pub fn run(args: LogArgs) -> anyhow::Result<ExitCode> {
    let since = args.since.as_deref().map(since_time).transpose()?;
    let root = project_root()?;
    let log = AuditLog::for_project(&root).context("cannot locate the audit log")?;
    let color =
        io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let mut printer = Printer {
        json: args.json,
        blocked: args.blocked,
        since,
        skip: 0,
        color,
        header_done: false,
    };
    let mut rotated = log.path().as_os_str().to_owned();
    rotated.push(".1");
    let rotated = PathBuf::from(rotated);
    // The files read from their start: both when printing, the current one when following.
    let files: Vec<&Path> = if args.follow {
        vec![log.path()]
    } else {
        vec![&rotated, log.path()]
    };
    if let Some(n) = args.lines {
        // -n: skip what comes before the last N entries shown.
        printer.skip = printer.count(&files)?.saturating_sub(n);
    }
    let stdout = io::stdout();
    let mut out = stdout.lock();
    if !args.follow {
        let mut any = false;
        for path in files {
            if let Some(f) = open_if_exists(path)? {
                any = true;
                for line in BufReader::new(f).lines() {
                    let line = line.with_context(|| format!("reading {}", path.display()))?;
                    printer.line(&mut out, &line)?;
                }
            }
        }
        if !any {
            eprintln!(
                "corral: no audit log yet for {} (expected at {})",
                root.display(),
                log.path().display()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    follow(log.path(), &mut printer, &mut out)
}

/// `--since WHEN`: a duration ago (what `humantime` reads: `10m`, `2h`, `1day`), or a UTC time
/// as RFC 3339 writes it, with a space for the `T` and the seconds optional, or a date alone.
fn since_time(when: &str) -> anyhow::Result<SystemTime> {
    if let Ok(d) = corral_policy::config::HumanDuration::parse(when) {
        return Ok(SystemTime::now()
            .checked_sub(Duration::from_millis(d.0))
            .unwrap_or(SystemTime::UNIX_EPOCH));
    }
    let w = when.trim();
    let candidates = [
        w.to_string(),
        format!("{w}:00"),
        format!("{w} 00:00:00"),
        format!("{w}T00:00:00Z"),
    ];
    candidates
        .iter()
        .find_map(|c| {
            humantime::parse_rfc3339(c)
                .or_else(|_| humantime::parse_rfc3339_weak(c))
                .ok()
        })
        .with_context(|| {
            format!(
                "--since {when:?}: expected a duration ago (10m, 2h, 1day) or a UTC time \
                 (2026-11-29, \"2026-11-29 21:40\", 2026-11-29T21:40:01Z)"
            )
        })
}

fn open_if_exists(path: &Path) -> anyhow::Result<Option<File>> {
    match File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot open {}", path.display())),
    }
}

/// Print the current file, then new lines as they are appended; when the writer rotates the
/// file (renames it to `.1` and starts a new one), finish the old one and continue with the new.
fn follow(path: &Path, printer: &mut Printer, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let mut current: Option<(BufReader<File>, u64)> = None;
    let mut partial = String::new();
    loop {
        if current.is_none()
            && let Some(f) = open_if_exists(path)?
        {
            let ino = f.metadata().map(|m| m.ino()).unwrap_or(0);
            current = Some((BufReader::new(f), ino));
        }
        let mut rotated = false;
        if let Some((reader, ino)) = current.as_mut() {
            loop {
                let n = reader
                    .read_line(&mut partial)
                    .with_context(|| format!("reading {}", path.display()))?;
                if n == 0 {
                    break;
                }
                if partial.ends_with('\n') {
                    printer.line(out, partial.trim_end_matches('\n'))?;
                    partial.clear();
                }
            }
            out.flush()?;
            rotated = std::fs::metadata(path)
                .map(|m| m.ino() != *ino)
                .unwrap_or(true);
        }
        if rotated {
            // The old file was read to its end above; the new one starts from its beginning.
            current = None;
            partial.clear();
            continue;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

struct Printer {
    json: bool,
    blocked: bool,
    /// `--since`: entries before it are not shown.
    since: Option<SystemTime>,
    /// `-n`: entries still to pass over before the first one shown.
    skip: usize,
    color: bool,
    header_done: bool,
}

impl Printer {
    /// The entry of `line` when it is shown (--blocked, --since); `Some(None)` for a line that
    /// is not a record, which only --json shows (as stored).
    fn wanted(&self, line: &str) -> Option<Option<Record>> {
        if line.trim().is_empty() {
            return None;
        }
        let record: Option<Record> = serde_json::from_str(line).ok();
        if self.blocked && !record.as_ref().is_some_and(Record::is_blocked) {
            return None;
        }
        if let Some(since) = self.since {
            let time = record
                .as_ref()
                .and_then(|r| humantime::parse_rfc3339(&r.time).ok());
            if time.is_none_or(|t| t < since) {
                return None;
            }
        }
        if record.is_none() && !self.json {
            return None;
        }
        Some(record)
    }

    /// How many entries of `files` would be shown.
    fn count(&self, files: &[&Path]) -> anyhow::Result<usize> {
        let mut n = 0;
        for path in files {
            if let Some(f) = open_if_exists(path)? {
                for line in BufReader::new(f).lines() {
                    let line = line.with_context(|| format!("reading {}", path.display()))?;
                    n += usize::from(self.wanted(&line).is_some());
                }
            }
        }
        Ok(n)
    }

    fn line(&mut self, out: &mut impl Write, line: &str) -> anyhow::Result<()> {
        let Some(record) = self.wanted(line) else {
            return Ok(());
        };
        if self.skip > 0 {
            self.skip -= 1;
            return Ok(());
        }
        if self.json {
            writeln!(out, "{line}")?;
            return Ok(());
        }
        let Some(r) = record else { return Ok(()) };
        if !self.header_done {
            writeln!(
                out,
                "{:<23} {:<16} {:<5} {:<8} {:<40} RULE",
                "TIME (UTC)", "JAIL", "KIND", "DECISION", "TARGET"
            )?;
            self.header_done = true;
        }
        writeln!(out, "{}", self.row(&r))?;
        Ok(())
    }

    fn row(&self, r: &Record) -> String {
        // "2026-11-29T21:40:01.123Z" -> "2026-11-29 21:40:01.123"
        let time = match r.time.get(..23) {
            Some(t) if t.is_char_boundary(10) => t.replacen('T', " ", 1),
            _ => r.time.clone(),
        };
        let (kind, decision, target, rule) = match &r.event {
            Event::Net(n) => {
                let path = n.path.as_deref().unwrap_or("");
                let target = format!("{} {}:{}{path}", n.method, n.host, n.port);
                if n.phase == corral_audit::NetPhase::Close {
                    (
                        "net",
                        "close".to_string(),
                        target,
                        format!("↑{} ↓{} {}ms", n.bytes_up, n.bytes_down, n.duration_ms),
                    )
                } else if n.phase == corral_audit::NetPhase::Refused {
                    // Connections refused before any decision, counted: the listener, how many.
                    let rule = format!("×{} {}", n.count, n.rule);
                    ("net", "refused".to_string(), n.host.clone(), rule)
                } else if n.phase == corral_audit::NetPhase::Ask {
                    // A held request's question (network.on_deny = "ask"): its decision follows.
                    ("net", "ask".to_string(), target, n.rule.clone())
                } else {
                    ("net", decision_word(n.decision), target, n.rule.clone())
                }
            }
            Event::Exec(e) => {
                let rule = match (&e.reason, e.exit_code, e.signal) {
                    _ if e.phase == corral_audit::ExecPhase::Start => "started".to_string(),
                    (Some(r), _, _) => r.clone(),
                    (None, Some(c), _) => format!("exit {c} in {}ms", e.duration_ms),
                    (None, None, Some(s)) => format!("signal {s}"),
                    _ => String::new(),
                };
                ("exec", decision_word(e.decision), e.command.join(" "), rule)
            }
            Event::Jail(j) => ("jail", "-".to_string(), j.name().to_string(), j.summary()),
        };
        // Hosts, commands and reasons can carry what the jail sent: no control, invisible or
        // look-alike character of theirs reaches the reader's terminal (a forged row, an
        // escape sequence, a name that reads as another; corral_audit::printable).
        let (target, rule) = (printable(&target), printable(&rule));
        let decision_cell = format!("{decision:<8}");
        let decision_cell = if self.color {
            match decision.as_str() {
                "deny" => format!("\x1b[31m{decision_cell}\x1b[0m"),
                "allow" => format!("\x1b[32m{decision_cell}\x1b[0m"),
                _ => format!("\x1b[2m{decision_cell}\x1b[0m"),
            }
        } else {
            decision_cell
        };
        format!(
            "{time:<23} {:<16} {kind:<5} {decision_cell} {target:<40} {rule}",
            r.jail
        )
    }
}

fn decision_word(d: Option<Decision>) -> String {
    match d {
        Some(Decision::Allow) => "allow".into(),
        Some(Decision::Deny) => "deny".into(),
        None => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_and_invisible_characters_from_the_jail_are_escaped() {
        assert_eq!(printable("example.org"), "example.org");
        assert_eq!(printable("a\u{1b}[2J\nforged\r"), "a\\u{1b}[2J\\nforged\\r");
        assert_eq!(
            printable("git\u{ad}hub\u{ff0e}com"),
            "git\\u{ad}hub\\u{ff0e}com"
        );
    }
}
