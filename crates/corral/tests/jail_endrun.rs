//! The end of a run tells the truth: a jailed command that leaves the terminal concealing
//! (SGR 8), in line-drawing characters and on the alternate screen, and prints its own fake
//! "corral: nothing changed", does not hide corral's real change summary: corral resets the
//! terminal before its own lines, lists the names that run code on the host first, and escapes
//! a bidirectional override in a name.

mod jail_support;

use std::io::Read;

use jail_support::*;

/// What the jail leaves the terminal in, and the fake line it prints in that state.
const HOSTILE: &str = r#"printf '\033[?1049h\033(0\033[8mcorral: nothing changed\n'"#;

/// The state a terminal is in after `bytes`, as far as the test looks: text concealed, G0 the
/// DEC line-drawing set, on the alternate screen. A model of the few sequences involved, so
/// the test can show what the user would see where corral's lines start.
#[derive(Debug, Default, PartialEq, Eq)]
struct Screen {
    concealed: bool,
    line_drawing: bool,
    alternate: bool,
}

fn screen_after(bytes: &[u8]) -> Screen {
    let mut s = Screen::default();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != 0x1b {
            i += 1;
            continue;
        }
        match bytes.get(i + 1) {
            Some(b'[') => {
                let end = (i + 2..bytes.len())
                    .find(|&k| (0x40..=0x7e).contains(&bytes[k]))
                    .unwrap_or(bytes.len() - 1);
                let params = String::from_utf8_lossy(&bytes[i + 2..end]).into_owned();
                match bytes[end] {
                    b'm' => {
                        for p in params.split(';') {
                            match p {
                                "" | "0" | "28" => s.concealed = false,
                                "8" => s.concealed = true,
                                _ => {}
                            }
                        }
                    }
                    b'h' if params == "?1049" || params == "?47" => s.alternate = true,
                    b'l' if params == "?1049" || params == "?47" => s.alternate = false,
                    _ => {}
                }
                i = end + 1;
            }
            Some(b'(') => {
                s.line_drawing = bytes.get(i + 2) == Some(&b'0');
                i += 3;
            }
            _ => i += 2,
        }
    }
    s
}

/// Run `script` in a jail under a terminal of the test's; everything the terminal got.
fn at_terminal(w: &World, script: &str) -> String {
    let mut c = w.corral();
    c.args(["run", "--network", "none", "--", "sh", "-c", script]);
    let (mut master, slave, mut child) = under_pty(c, 24, 80);
    drop(slave);
    let mut seen = Vec::new();
    let mut buf = [0u8; 8192];
    // EIO once corral (the last holder of the slave) is gone.
    while let Ok(n) = master.read(&mut buf) {
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    let status = child.wait().unwrap();
    let text = String::from_utf8_lossy(&seen).into_owned();
    assert!(status.success(), "corral failed: {status}\n{text:?}");
    text
}

#[test]
fn the_summary_is_seen_whatever_the_jail_left_on_the_terminal() {
    let w = World::new();
    let script = format!(
        "touch .envrc; for i in $(seq 1 200); do : > f$i; done; \
         : > \"$(printf 'evil\\342\\200\\256txt.sh')\"; echo END; {HOSTILE}"
    );
    let out = at_terminal(&w, &script);
    let summary = out
        .find("corral: changed in")
        .unwrap_or_else(|| panic!("no change summary: {out:?}"));
    let fake = out
        .find("corral: nothing changed")
        .expect("the jail's fake line");
    let reset = out
        .find(corral_session::endlines::TERMINAL_RESET)
        .unwrap_or_else(|| panic!("no terminal reset: {out:?}"));
    assert!(fake < reset && reset < summary, "{out:?}");

    // Where corral's lines start, the terminal shows them; without the reset it would not:
    // the control, the same bytes with the reset taken out.
    assert_eq!(
        screen_after(&out.as_bytes()[..summary]),
        Screen::default(),
        "{out:?}"
    );
    let without = out.replacen(corral_session::endlines::TERMINAL_RESET, "", 1);
    let summary_without = without.find("corral: changed in").unwrap();
    assert_eq!(
        screen_after(&without.as_bytes()[..summary_without]),
        Screen {
            concealed: true,
            line_drawing: true,
            alternate: true
        },
        "the jail's sequences did not reach the terminal: {out:?}"
    );

    // The blank line between the jail's output and corral's (the terminal's CR before each
    // LF), then `.envrc` first by name (not folded into "and N more"), the bidirectional
    // override escaped.
    let ours = &out[reset + corral_session::endlines::TERMINAL_RESET.len()..];
    assert!(ours.starts_with("\r\n\x1b#5corral: changed in"), "{ours:?}");
    let lines: Vec<&str> = ours
        .split("\r\n")
        .map(|l| l.trim_start_matches("\x1b#5"))
        .filter(|l| l.starts_with("corral:"))
        .collect();
    assert!(
        lines[0].ends_with("; 1 that can run code on the host, listed first"),
        "{lines:#?}"
    );
    assert_eq!(
        lines[1],
        format!(
            "corral:   created  .envrc {}",
            corral_session::changes::HOST_CODE_MARK
        ),
        "{lines:#?}"
    );
    assert!(
        lines.last().unwrap().starts_with("corral:   and "),
        "{lines:#?}"
    );
    assert!(!ours.contains('\u{202e}'), "{ours:?}");
    let details = w
        .audit_records()
        .into_iter()
        .find(|r| r["event"] == "changes")
        .expect("a changes event");
    let created = details["detail"]["created"].as_array().unwrap();
    assert_eq!(created.len(), 202, "{created:?}");
    assert!(
        created.iter().any(|n| n == "evil\u{202e}txt.sh"),
        "{created:?}"
    );
    // Next (the rest in order), the name with the override, escaped.
    assert_eq!(
        lines[2], "corral:   created  evil\\u{202e}txt.sh",
        "{lines:#?}"
    );
}

/// Without a terminal on stderr, nothing but corral's lines: no reset, no blank line.
#[test]
fn no_reset_when_stderr_is_no_terminal() {
    let w = World::new();
    let out = w.sh("none", &format!("touch .envrc; {HOSTILE}"));
    assert_eq!(out.code, 0, "{}", out.both());
    assert!(!out.stderr.contains('\x1b'), "{:?}", out.stderr);
    let last = out.stderr.lines().last().unwrap();
    assert_eq!(
        last,
        format!(
            "corral: changed in {}: created .envrc {}",
            w.project.display(),
            corral_session::changes::HOST_CODE_MARK
        )
    );
}
