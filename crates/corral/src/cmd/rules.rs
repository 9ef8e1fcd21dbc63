//! `corral allow HOST[:PORT]` and `corral deny HOST`: add a network rule to the project's
//! `corral.toml` (or, with `--user`, the user config) from outside the jail.
//!
//! The file is edited with toml_edit, so every comment, blank line and the key order stay as the
//! user wrote them; only the one array gains an element. The pattern is validated by the same
//! `DomainPattern::parse` the policy loader uses (same error text) and written in its canonical
//! form. Adding a rule that is already there changes nothing. Allowing a pattern that the other
//! list names exactly (`deny` for `allow`, and back) takes it out of that list, since the user
//! has just said the opposite. The file is replaced atomically (written beside it, then renamed),
//! keeping its permissions.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use corral_policy::domain::DomainPattern;
use toml_edit::{Array, DocumentMut, Item, Table, Value};

use crate::cli::RuleArgs;

/// Which list a rule goes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    Allow,
    Deny,
}

impl Rule {
    fn key(self) -> &'static str {
        match self {
            Rule::Allow => "allow",
            Rule::Deny => "deny",
        }
    }

    fn opposite(self) -> Rule {
        match self {
            Rule::Allow => Rule::Deny,
            Rule::Deny => Rule::Allow,
        }
    }
}

/// What an edit did, for the message and the tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The canonical pattern.
    pub pattern: String,
    /// False when the rule was already there (the file is left untouched).
    pub added: bool,
    /// The same pattern was taken out of the opposite list.
    pub removed_from_opposite: bool,
    pub created_file: bool,
}

pub fn run(rule: Rule, args: RuleArgs) -> anyhow::Result<ExitCode> {
    let pattern = DomainPattern::parse(&args.host)?;
    let file = if args.user {
        user_config_path()?
    } else {
        let cwd = std::env::current_dir().context("cannot read the current directory")?;
        corral_policy::resolve::project_root(&cwd).join("corral.toml")
    };
    let before = match std::fs::read(&file) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
    };
    let outcome = edit_file(&file, rule, &pattern)?;
    if !args.user {
        // The project's file, edited by the user's own command: still trusted if it was.
        super::trust::carry_over(&file, before.as_deref())?;
    }
    let list = format!("network.{}", rule.key());
    let shown = file.display();
    if outcome.removed_from_opposite {
        println!(
            "removed {:?} from network.{} in {shown}",
            outcome.pattern,
            rule.opposite().key()
        );
    }
    if outcome.added {
        let verb = if outcome.created_file {
            "created"
        } else {
            "updated"
        };
        println!("{verb} {shown}: {list} += {:?}", outcome.pattern);
    } else {
        println!("{list} in {shown} already has {:?}", outcome.pattern);
    }
    Ok(ExitCode::SUCCESS)
}

/// `$XDG_CONFIG_HOME/corral/config.toml`, else `~/.config/corral/config.toml`.
fn user_config_path() -> anyhow::Result<PathBuf> {
    let (env, home) = super::trust::env_home()?;
    Ok(corral_policy::resolve::default_user_config(&env, &home))
}

/// Add `pattern` to `network.<rule>` of the TOML file at `path`, creating it when missing.
pub fn edit_file(path: &Path, rule: Rule, pattern: &DomainPattern) -> anyhow::Result<Outcome> {
    // Edit the file a symlink points at, not the link.
    let target = match std::fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => path.to_path_buf(),
        Err(e) => return Err(e).with_context(|| format!("cannot resolve {}", path.display())),
    };
    let (text, created) = match std::fs::read_to_string(&target) {
        Ok(t) => (t, false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (String::new(), true),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", target.display())),
    };
    let (new_text, mut outcome) = edit_text(&text, rule, pattern)
        .with_context(|| format!("cannot add the rule to {}", target.display()))?;
    outcome.created_file = created;
    if new_text != text {
        write_atomic(&target, &new_text)?;
    }
    Ok(outcome)
}

/// The edit itself, on text: the new text and what changed.
pub fn edit_text(
    text: &str,
    rule: Rule,
    pattern: &DomainPattern,
) -> anyhow::Result<(String, Outcome)> {
    let mut doc: DocumentMut = text
        .parse()
        .context("the file is not valid TOML; fix it first (corral plan shows where)")?;
    let canonical = pattern.to_string();
    let fresh = text.trim().is_empty();

    if !doc.contains_key("network") {
        let mut t = Table::new();
        if !fresh {
            t.decor_mut().set_prefix("\n");
        }
        doc.insert("network", Item::Table(t));
    }
    let inline = doc.get("network").is_some_and(Item::is_inline_table);
    let network = doc
        .get_mut("network")
        .and_then(Item::as_table_like_mut)
        .context("`network` is not a table")?;

    let mut removed_from_opposite = false;
    if let Some(item) = network.get_mut(rule.opposite().key()) {
        let arr = item
            .as_array_mut()
            .with_context(|| format!("`network.{}` is not an array", rule.opposite().key()))?;
        let before = arr.len();
        remove_pattern(arr, pattern);
        removed_from_opposite = arr.len() != before;
    }

    if !network.contains_key(rule.key()) {
        let mut new = Value::Array(Array::new());
        if inline {
            // `{ mode = "proxy" }`: the space before `}` follows the new last value instead.
            if let Some((_, Item::Value(last))) = network.iter_mut().last() {
                let suffix = raw(last.decor().suffix());
                last.decor_mut().set_suffix("");
                new.decor_mut().set_prefix(" ");
                new.decor_mut().set_suffix(suffix);
            }
        }
        network.insert(rule.key(), Item::Value(new));
    }
    let arr = network
        .get_mut(rule.key())
        .and_then(Item::as_array_mut)
        .with_context(|| format!("`network.{}` is not an array", rule.key()))?;
    let present = arr.iter().any(|v| {
        v.as_str()
            .and_then(|s| DomainPattern::parse(s).ok())
            .is_some_and(|p| &p == pattern)
    });
    if !present {
        push_keeping_layout(arr, &canonical);
    }
    let outcome = Outcome {
        pattern: canonical,
        added: !present,
        removed_from_opposite,
        created_file: false,
    };
    if present && !removed_from_opposite {
        return Ok((text.to_string(), outcome));
    }
    Ok((doc.to_string(), outcome))
}

/// Remove every element that parses to `pattern`, keeping the others' layout.
fn remove_pattern(arr: &mut Array, pattern: &DomainPattern) {
    let mut i = 0;
    while i < arr.len() {
        let hit = arr
            .get(i)
            .and_then(Value::as_str)
            .and_then(|s| DomainPattern::parse(s).ok())
            .is_some_and(|p| &p == pattern);
        if hit {
            let removed = arr.remove(i);
            // A new first element takes the old first one's prefix (no space after `[` in an
            // inline array, the newline and indentation in a multi-line one).
            if i == 0
                && let Some(next) = arr.get_mut(0)
            {
                let prefix = raw(removed.decor().prefix());
                next.decor_mut().set_prefix(prefix);
            }
        } else {
            i += 1;
        }
    }
}

fn raw(r: Option<&toml_edit::RawString>) -> String {
    r.and_then(|r| r.as_str()).unwrap_or("").to_string()
}

/// Append `s` to `arr` in the array's own layout: one per line when it is multi-line (with the
/// same indentation, a comment after the previous last element staying on its line), inline
/// otherwise.
fn push_keeping_layout(arr: &mut Array, s: &str) {
    let mut v = Value::from(s);
    let n = arr.len();
    if n == 0 {
        let trailing = raw(Some(arr.trailing()));
        if trailing.contains('\n') {
            v.decor_mut().set_prefix("\n    ");
            arr.push_formatted(v);
            arr.set_trailing_comma(true);
        } else {
            v.decor_mut().set_prefix("");
            v.decor_mut().set_suffix("");
            arr.push_formatted(v);
        }
        return;
    }
    let last = arr.get_mut(n - 1).expect("non-empty");
    let last_prefix = raw(last.decor().prefix());
    let last_suffix = raw(last.decor().suffix());
    let multiline = last_prefix.contains('\n');
    let indent = match last_prefix.rfind('\n') {
        Some(i) => format!("\n{}", &last_prefix[i + 1..]),
        None => " ".to_string(),
    };
    if arr.trailing_comma() || last_suffix.is_empty() {
        v.decor_mut().set_prefix(indent);
        v.decor_mut().set_suffix("");
    } else if let (true, Some(nl)) = (last_suffix.contains('#'), last_suffix.find('\n')) {
        // `"b"  # note\n]`: the comment stays after "b", the new element goes on the next line.
        let (comment, rest) = last_suffix.split_at(nl + 1);
        arr.get_mut(n - 1)
            .expect("non-empty")
            .decor_mut()
            .set_suffix("");
        let line_indent = indent.trim_start_matches('\n');
        v.decor_mut().set_prefix(format!("{comment}{line_indent}"));
        v.decor_mut().set_suffix(format!("\n{rest}"));
    } else {
        // Whitespace (or the newline before `]`) after the last element moves after the new one.
        arr.get_mut(n - 1)
            .expect("non-empty")
            .decor_mut()
            .set_suffix("");
        v.decor_mut()
            .set_prefix(if multiline { indent } else { " ".to_string() });
        v.decor_mut().set_suffix(last_suffix);
    }
    arr.push_formatted(v);
}

/// Write `text` to `path` by writing a sibling and renaming it over, keeping the old mode.
fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mode = std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o644);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "corral.toml".into());
    let tmp = dir.join(format!(".{name}.corral-{}.tmp", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        bail!("cannot write {}: {e}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(text: &str, rule: Rule, p: &str) -> (String, Outcome) {
        edit_text(text, rule, &DomainPattern::parse(p).unwrap()).unwrap()
    }

    #[test]
    fn empty_file_gets_a_network_table() {
        let (t, o) = edit("", Rule::Allow, "Example.COM");
        assert_eq!(t, "[network]\nallow = [\"example.com\"]\n");
        assert!(o.added);
    }

    #[test]
    fn multiline_with_trailing_comma() {
        let text = "[network]\nallow = [\n    \"a.com\",  # first\n    \"b.com\",\n]\n";
        let (t, _) = edit(text, Rule::Allow, "c.com");
        assert_eq!(
            t,
            "[network]\nallow = [\n    \"a.com\",  # first\n    \"b.com\",\n    \"c.com\",\n]\n"
        );
    }

    #[test]
    fn multiline_without_trailing_comma_keeps_the_last_comment_in_place() {
        let text = "[network]\nallow = [\n  \"a.com\",\n  \"b.com\"  # last\n]\n";
        let (t, _) = edit(text, Rule::Allow, "c.com");
        assert_eq!(
            t,
            "[network]\nallow = [\n  \"a.com\",\n  \"b.com\",  # last\n  \"c.com\"\n]\n"
        );
        let text = "[network]\nallow = [\n  \"a.com\",\n  \"b.com\"\n]\n";
        let (t, _) = edit(text, Rule::Allow, "c.com");
        assert_eq!(
            t,
            "[network]\nallow = [\n  \"a.com\",\n  \"b.com\",\n  \"c.com\"\n]\n"
        );
    }

    #[test]
    fn inline_arrays_stay_inline() {
        let (t, _) = edit(
            "[network]\nallow = [\"a.com\", \"b.com\"]\n",
            Rule::Allow,
            "c.com",
        );
        assert_eq!(t, "[network]\nallow = [\"a.com\", \"b.com\", \"c.com\"]\n");
        let (t, _) = edit("[network]\nallow = []\n", Rule::Allow, "c.com");
        assert_eq!(t, "[network]\nallow = [\"c.com\"]\n");
        let (t, _) = edit("[network]\nallow = [\n]\n", Rule::Allow, "c.com");
        assert_eq!(t, "[network]\nallow = [\n    \"c.com\",\n]\n");
    }

    #[test]
    fn duplicates_are_not_added() {
        let text = "[network]\nallow = [\"Example.com.\"]  # keep\n";
        let (t, o) = edit(text, Rule::Allow, "example.com");
        assert_eq!(t, text);
        assert!(!o.added);
        // Different port: a different rule.
        let (t, o) = edit(text, Rule::Allow, "example.com:8443");
        assert!(o.added);
        assert_eq!(
            t,
            "[network]\nallow = [\"Example.com.\", \"example.com:8443\"]  # keep\n"
        );
    }

    #[test]
    fn allow_takes_the_pattern_out_of_deny_and_back() {
        let text = "[network]\nallow = [\"a.com\"]\ndeny = [\"gist.github.com\", \"b.com\"]\n";
        let (t, o) = edit(text, Rule::Allow, "gist.github.com");
        assert!(o.removed_from_opposite && o.added);
        assert_eq!(
            t,
            "[network]\nallow = [\"a.com\", \"gist.github.com\"]\ndeny = [\"b.com\"]\n"
        );
        let (t, o) = edit(&t, Rule::Deny, "gist.github.com");
        assert!(o.removed_from_opposite && o.added);
        assert_eq!(
            t,
            "[network]\nallow = [\"a.com\"]\ndeny = [\"b.com\", \"gist.github.com\"]\n"
        );
    }

    #[test]
    fn inline_network_table_and_dotted_keys() {
        let (t, _) = edit("network = { mode = \"proxy\" }\n", Rule::Allow, "a.com");
        assert_eq!(t, "network = { mode = \"proxy\", allow = [\"a.com\"] }\n");
        let (t, _) = edit("network.mode = \"proxy\"\n", Rule::Deny, "a.com");
        assert_eq!(t, "network.mode = \"proxy\"\nnetwork.deny = [\"a.com\"]\n");
    }

    #[test]
    fn refuses_what_it_cannot_edit() {
        let p = DomainPattern::parse("a.com").unwrap();
        assert!(edit_text("network = 1\n", Rule::Allow, &p).is_err());
        assert!(edit_text("[network]\nallow = \"a.com\"\n", Rule::Allow, &p).is_err());
        assert!(edit_text("[network\n", Rule::Allow, &p).is_err());
    }
}
