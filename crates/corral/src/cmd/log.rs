//! `corral log [--follow] [--blocked] [--json]`: the current project's audit log.

use std::fs::File;
use std::io::{self, BufRead, BufReader, IsTerminal, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use corral_audit::{AuditLog, Decision, Event, Record, printable};

use crate::cli::LogArgs;

/// The current project's root, as the policy resolver finds it (git root, else cwd).
pub fn project_root() -> anyhow::Result<PathBuf> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    Ok(corral_policy::resolve::project_root(&cwd))
}

pub fn run(args: LogArgs) -> anyhow::Result<ExitCode> {
    let root = project_root()?;
    let log = AuditLog::for_project(&root).context("cannot locate the audit log")?;
    let color =
        io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let mut printer = Printer {
        json: args.json,
        blocked: args.blocked,
        color,
        header_done: false,
    };
    let mut rotated = log.path().as_os_str().to_owned();
    rotated.push(".1");
    let stdout = io::stdout();
    let mut out = stdout.lock();
    if !args.follow {
        let mut any = false;
        for path in [PathBuf::from(&rotated), log.path().to_path_buf()] {
            if let Some(f) = open_if_exists(&path)? {
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
    color: bool,
    header_done: bool,
}

impl Printer {
    fn line(&mut self, out: &mut impl Write, line: &str) -> anyhow::Result<()> {
        if line.trim().is_empty() {
            return Ok(());
        }
        let record: Option<Record> = serde_json::from_str(line).ok();
        if self.blocked && !record.as_ref().is_some_and(Record::is_blocked) {
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
                "{:<12} {:<16} {:<5} {:<8} {:<40} RULE",
                "TIME", "JAIL", "KIND", "DECISION", "TARGET"
            )?;
            self.header_done = true;
        }
        writeln!(out, "{}", self.row(&r))?;
        Ok(())
    }

    fn row(&self, r: &Record) -> String {
        // "2026-11-29T21:40:01.123Z" -> "21:40:01.123"
        let time = r.time.get(11..23).unwrap_or(&r.time).to_string();
        let (kind, decision, target, rule) = match &r.event {
            Event::Net(n) => {
                let target = format!("{} {}:{}", n.method, n.host, n.port);
                if n.phase == "close" {
                    (
                        "net",
                        "close".to_string(),
                        target,
                        format!("↑{} ↓{} {}ms", n.bytes_up, n.bytes_down, n.duration_ms),
                    )
                } else {
                    ("net", decision_word(n.decision), target, n.rule.clone())
                }
            }
            Event::Exec(e) => {
                let rule = match (&e.reason, e.exit_code, e.signal) {
                    (Some(r), _, _) => r.clone(),
                    (None, Some(c), _) => format!("exit {c} in {}ms", e.duration_ms),
                    (None, None, Some(s)) => format!("signal {s}"),
                    _ => String::new(),
                };
                ("exec", decision_word(e.decision), e.command.join(" "), rule)
            }
            Event::Jail(j) => (
                "jail",
                "-".to_string(),
                j.event.clone(),
                match (j.exit_code, j.detail.get("error").and_then(|e| e.as_str())) {
                    (Some(c), _) => format!("exit {c}"),
                    (None, Some(e)) => e.to_string(),
                    (None, None) => String::new(),
                },
            ),
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
            "{time:<12} {:<16} {kind:<5} {decision_cell} {target:<40} {rule}",
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
