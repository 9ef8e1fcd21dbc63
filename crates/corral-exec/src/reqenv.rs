//! Which variables a request may set: an allow-list of names that change how a command shows its
//! output or its locale, never which file runs, what code it loads or where it reads its
//! configuration from.
//!
//! A request's `env` is written by the jail. Whatever the command is (git, cargo, make, a shell),
//! a variable outside this list is refused: `HOME` and `XDG_CONFIG_HOME` pointed at the project
//! make git read a config the jail wrote (an alias, `core.pager`, `core.fsmonitor`), and the next
//! tool's variable that does the same is not on anyone's list yet. So the list names what may
//! pass, and everything else is a refusal naming the variable.

/// How a variable's value is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    /// Any value (it is read as a word or a number, never as a path).
    Any,
    /// A name that must not be a path: glibc takes a locale name starting with `/` as the
    /// directory to load locale data from, ncurses a terminal name with `/` as a file.
    Name,
    /// A time zone: a zone name (`Europe/Paris`) or a POSIX rule (`CET-1CEST`), not an absolute
    /// path (`/x`, `:/x`) or one that climbs (`..`).
    TimeZone,
}

/// The names a request may set, exactly (case-sensitive, as the programs read them).
const ALLOWED: &[(&str, Value)] = &[
    // Terminal and colour.
    ("TERM", Value::Name),
    ("COLORTERM", Value::Any),
    ("NO_COLOR", Value::Any),
    ("FORCE_COLOR", Value::Any),
    ("CLICOLOR", Value::Any),
    ("CLICOLOR_FORCE", Value::Any),
    ("COLUMNS", Value::Any),
    ("LINES", Value::Any),
    // Locale and time.
    ("LANG", Value::Name),
    ("LANGUAGE", Value::Name),
    ("TZ", Value::TimeZone),
    // "Running in CI" switches.
    ("CI", Value::Any),
    // Rust's logging, backtraces and test harness.
    ("RUST_LOG", Value::Any),
    ("RUST_BACKTRACE", Value::Any),
    ("RUST_LIB_BACKTRACE", Value::Any),
    ("RUST_TEST_THREADS", Value::Any),
    ("RUST_TEST_NOCAPTURE", Value::Any),
];

/// Prefixes of names a request may set: the locale categories (`LC_ALL`, `LC_CTYPE`, ...) and
/// cargo's terminal output (`CARGO_TERM_COLOR`, `CARGO_TERM_VERBOSE`, ...).
const ALLOWED_PREFIXES: &[(&str, Value)] = &[("LC_", Value::Name), ("CARGO_TERM_", Value::Any)];

/// Why a request's variable is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvRefusal {
    #[error(
        "the request sets {name}, which a request may not set: only variables that change how a \
         command shows its output pass ({list}); anything else could change which program runs, \
         what code it loads or which configuration it reads (see docs/executor.md)"
    )]
    Name { name: String, list: String },
    #[error(
        "the request sets {name} to {value:?}, a path; {name} may name a {what} but not a file \
         or directory (see docs/executor.md)"
    )]
    Value {
        name: String,
        value: String,
        what: &'static str,
    },
}

/// The rule for `name`, if it is on the list.
fn rule(name: &str) -> Option<Value> {
    if let Some((_, v)) = ALLOWED.iter().find(|(n, _)| *n == name) {
        return Some(*v);
    }
    ALLOWED_PREFIXES
        .iter()
        .find(|(p, _)| name.len() > p.len() && name.starts_with(p))
        .map(|(_, v)| *v)
}

/// Whether `value` passes `rule`.
fn value_ok(rule: Value, value: &str) -> bool {
    match rule {
        Value::Any => true,
        Value::Name => !value.contains('/'),
        Value::TimeZone => {
            let zone = value.strip_prefix(':').unwrap_or(value);
            !zone.starts_with('/') && !zone.contains("..")
        }
    }
}

/// The allowed names, for messages and docs.
pub fn allowed_names() -> String {
    let mut names: Vec<String> = ALLOWED.iter().map(|(n, _)| n.to_string()).collect();
    names.extend(ALLOWED_PREFIXES.iter().map(|(p, _)| format!("{p}*")));
    names.join(", ")
}

/// Check one variable of a request.
pub fn check_var(name: &str, value: &str) -> Result<(), EnvRefusal> {
    let Some(r) = rule(name) else {
        return Err(EnvRefusal::Name {
            name: name.into(),
            list: allowed_names(),
        });
    };
    if value_ok(r, value) {
        return Ok(());
    }
    Err(EnvRefusal::Value {
        name: name.into(),
        value: value.into(),
        what: match r {
            Value::TimeZone => "time zone",
            Value::Name | Value::Any => "name",
        },
    })
}

/// Check every variable of a request; the first one refused (in name order) is the answer.
pub fn check<'a>(
    env: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), EnvRefusal> {
    env.into_iter().try_for_each(|(n, v)| check_var(n, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_request_may_set() {
        for (name, value) in [
            ("TERM", "xterm-256color"),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "en_US.UTF-8"),
            ("LANGUAGE", "fr:en"),
            ("TZ", "Europe/Paris"),
            ("TZ", ":Europe/Paris"),
            ("TZ", "CET-1CEST"),
            ("CI", "true"),
            ("NO_COLOR", "1"),
            ("RUST_LOG", "debug,hyper=info"),
            ("RUST_BACKTRACE", "1"),
            ("CARGO_TERM_COLOR", "always"),
        ] {
            assert_eq!(check_var(name, value), Ok(()), "{name}={value}");
        }
    }

    #[test]
    fn everything_else_is_refused_naming_the_variable() {
        for name in [
            "HOME",
            "XDG_CONFIG_HOME",
            "XDG_DATA_HOME",
            "GIT_CONFIG_GLOBAL",
            "GIT_DIR",
            "PATH",
            "LD_PRELOAD",
            "BASH_ENV",
            "ENV",
            "NODE_OPTIONS",
            "PYTHONPATH",
            "HTTPS_PROXY",
            "http_proxy",
            "LOCPATH",
            "TERMINFO",
            "GCONV_PATH",
            "RUSTC_WRAPPER",
            "CARGO_HOME",
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER",
            // Case matters: programs read the exact name, and the list holds the exact name.
            "term",
            "lc_all",
            // A prefix alone is not a name on the list.
            "LC_",
            "CARGO_TERM_",
            "GREETING",
        ] {
            match check_var(name, "x") {
                Err(EnvRefusal::Name { name: n, list }) => {
                    assert_eq!(n, name);
                    assert!(list.starts_with("TERM, COLORTERM"), "{list}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn names_that_would_be_read_as_paths_are_refused() {
        for (name, value) in [
            ("LANG", "/project/evil-locale"),
            ("LC_ALL", "/tmp/x"),
            ("LC_CTYPE", "../../x"),
            ("LANGUAGE", "fr:/tmp/x"),
            ("TERM", "/project/evil-terminfo"),
            ("TZ", "/project/zone"),
            ("TZ", ":/project/zone"),
            ("TZ", "../../../project/zone"),
        ] {
            let refusal = check_var(name, value).unwrap_err();
            assert!(
                matches!(&refusal, EnvRefusal::Value { name: n, .. } if n == name),
                "{name}={value}: {refusal:?}"
            );
        }
        assert_eq!(
            check_var("TZ", "/x").unwrap_err().to_string(),
            "the request sets TZ to \"/x\", a path; TZ may name a time zone but not a file or \
             directory (see docs/executor.md)"
        );
    }

    #[test]
    fn the_first_refused_variable_is_named() {
        let env: std::collections::BTreeMap<String, String> = [
            ("CI", "1"),
            ("HOME", "/project"),
            ("XDG_CONFIG_HOME", "/project"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert!(matches!(check(&env), Err(EnvRefusal::Name { name, .. }) if name == "HOME"));
        assert_eq!(check(&std::collections::BTreeMap::new()), Ok(()));
    }
}
