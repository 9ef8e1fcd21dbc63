//! `corral allow HOST[:PORT]...` and `corral deny HOST...`: add network rules to the project's
//! `corral.toml` (or, with `--user`, the user config) from outside the jail.
//!
//! Several hosts may be named at once; all are checked before the file is touched. A URL is
//! refused with the host it names (`http://x.org/a` -> "a scheme is not a host: write x.org").
//! An address gets one answer whether it is private or public: the proxy checks a destination
//! twice, by the name the client asked for (`network.allow`) and by the address it connects to
//! (`network.allow_cidrs` for loopback, private, link-local... ranges), so `corral allow
//! 10.0.0.1` writes both `network.allow += "10.0.0.1"` and `network.allow_cidrs +=
//! "10.0.0.1/32"` (`/128` for IPv6), and `corral deny` of it takes the address out of
//! `allow_cidrs` again. A CIDR (`corral allow 10.0.0.0/8`) goes to `allow_cidrs` alone: it lets
//! allowed names resolve into that range.
//!
//! The file is edited with toml_edit, so every comment, blank line and the key order stay as the
//! user wrote them; only the one array gains an element. The pattern is validated by the same
//! `DomainPattern::parse` the policy loader uses (same error text) and written in its canonical
//! form. Adding a rule that is already there changes nothing. Allowing a pattern that the other
//! list names exactly (`deny` for `allow`, and back) takes it out of that list, since the user
//! has just said the opposite. The new content is written and synced beside the file first; an
//! existing file is then rewritten in place (a running jail's read-only bind of it stays), a new
//! one renamed into place, keeping its permissions.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use corral_policy::domain::DomainPattern;
use corral_policy::pathrule::PathRule;
use ipnet::IpNet;
use toml_edit::{Array, DocumentMut, Item, Table, Value};

use crate::cli::RuleArgs;
pub use corral_run::target::Target;

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

/// What one edit of one list did, for the message and the tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The list: `network.allow`, `network.deny` or `network.allow_cidrs`.
    pub list: String,
    /// The canonical entry.
    pub pattern: String,
    /// It was added to `list`.
    pub added: bool,
    /// It was in `list` already (the list is left as it was).
    pub present: bool,
    /// The list it was taken out of, when it was in the opposite one.
    pub removed_from: Option<String>,
}

impl Outcome {
    fn changed(&self) -> bool {
        self.added || self.removed_from.is_some()
    }
}

pub fn run(rule: Rule, args: RuleArgs) -> anyhow::Result<ExitCode> {
    // Every argument is checked before the file is touched.
    let targets: Vec<Target> = args
        .hosts
        .iter()
        .map(|h| Target::parse(h))
        .collect::<anyhow::Result<_>>()?;
    if rule == Rule::Deny
        && let Some(r) = targets.iter().find_map(|t| t.rule.as_ref())
    {
        bail!(
            "{:?}: network.deny takes hosts only; to refuse some paths of a host, allow only the paths it may use (corral allow 'GET host/path/**')",
            r.to_string()
        );
    }
    let file = if args.user {
        user_config_path()?
    } else {
        let cwd = std::env::current_dir().context("cannot read the current directory")?;
        corral_policy::resolve::project_root(&cwd).join("corral.toml")
    };
    let (outcomes, created) = if args.user {
        edit_file(&file, rule, &targets)?
    } else {
        let edit = edit_project(&file, rule, &targets)?;
        if !edit.trusted {
            eprintln!(
                "corral: {} stays untrusted: you have not trusted the rest of it; review it, \
                 then run `corral trust` (corral run refuses what it grants until then)",
                file.display()
            );
        }
        (edit.outcomes, edit.created)
    };
    report(&file, &outcomes, created)?;
    Ok(ExitCode::SUCCESS)
}

/// What an edit of the project's `corral.toml` did.
pub struct ProjectEdit {
    pub outcomes: Vec<Outcome>,
    pub created: bool,
    /// The new content is trusted (the file is new, or its previous content was trusted).
    pub trusted: bool,
}

/// Add `targets` to the project's policy file `file` (`corral allow`/`deny`, `corral watch`):
/// the edit of [`edit_file`], then the trust carried over to the new content when the old one
/// was trusted (the user's own command changed only this).
pub fn edit_project(file: &Path, rule: Rule, targets: &[Target]) -> anyhow::Result<ProjectEdit> {
    let before = match std::fs::read(file) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
    };
    let (outcomes, created) = edit_file(file, rule, targets)?;
    // The project's file, edited by the user's own command, is still trusted if it was; one
    // never trusted is not trusted now either (its other lines were never reviewed).
    let trusted = if before.is_some() || created {
        super::trust::carry_over(file, before.as_deref())?
    } else {
        true
    };
    Ok(ProjectEdit {
        outcomes,
        created,
        trusted,
    })
}

/// One line per change on standard output.
fn report(file: &Path, outcomes: &[Outcome], created: bool) -> anyhow::Result<()> {
    let shown = file.display();
    let mut created = created;
    for o in outcomes {
        if let Some(from) = &o.removed_from {
            outln!("removed {:?} from {from} in {shown}", o.pattern)?;
        }
        let list = &o.list;
        if o.added {
            let verb = if std::mem::take(&mut created) {
                "created"
            } else {
                "updated"
            };
            outln!("{verb} {shown}: {list} += {:?}", o.pattern)?;
        } else if o.present {
            outln!("{list} in {shown} already has {:?}", o.pattern)?;
        } else if o.removed_from.is_none() {
            outln!(
                "{list} in {shown} does not have {:?}: nothing to take out (loopback, private \
                 and link-local addresses are refused unless listed there; deny a public host by \
                 name)",
                o.pattern
            )?;
        }
    }
    Ok(())
}

/// `$XDG_CONFIG_HOME/corral/config.toml`, else `~/.config/corral/config.toml`.
fn user_config_path() -> anyhow::Result<PathBuf> {
    let (env, home) = corral_run::trust::env_home()?;
    Ok(corral_policy::resolve::default_user_config(&env, &home))
}

/// Add `targets` to the rule's lists of the TOML file at `path`, creating it when missing:
/// what each edit did, and whether the file was created.
pub fn edit_file(
    path: &Path,
    rule: Rule,
    targets: &[Target],
) -> anyhow::Result<(Vec<Outcome>, bool)> {
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
    let (new_text, outcomes) = edit_targets(&text, rule, targets)
        .with_context(|| format!("cannot add the rule to {}", target.display()))?;
    if new_text != text {
        write_atomic(&target, &new_text)?;
    }
    Ok((outcomes, created && new_text != text))
}

/// The edit of one pattern, on text: the new text and what changed.
#[cfg(test)]
fn edit_text(text: &str, rule: Rule, pattern: &DomainPattern) -> anyhow::Result<(String, Outcome)> {
    let target = Target {
        pattern: Some(pattern.clone()),
        cidr: None,
        rule: None,
    };
    let (text, mut outcomes) = edit_targets(text, rule, std::slice::from_ref(&target))?;
    Ok((text, outcomes.remove(0)))
}

/// Every target's edits, on text: its pattern into `network.<rule>` (out of the opposite
/// list), its address range into `network.allow_cidrs` (allow) or out of it (deny).
pub fn edit_targets(
    text: &str,
    rule: Rule,
    targets: &[Target],
) -> anyhow::Result<(String, Vec<Outcome>)> {
    let mut doc: DocumentMut = text
        .parse()
        .context("the file is not valid TOML; fix it first (corral plan shows where)")?;
    let fresh = text.trim().is_empty();
    let mut outcomes = Vec::new();
    for t in targets {
        if let Some(r) = t.rule.as_ref().filter(|_| rule == Rule::Allow) {
            let same = |s: &str| PathRule::parse(s).is_ok_and(|p| &p == r);
            let edit = Edit {
                entry: &r.to_string(),
                add_to: Some(rule.key()),
                remove_from: None,
                same: &same,
            };
            outcomes.extend(edit.apply(&mut doc, fresh)?);
        }
        if let Some(pattern) = &t.pattern {
            let same = |s: &str| DomainPattern::parse(s).is_ok_and(|p| &p == pattern);
            let edit = Edit {
                entry: &pattern.to_string(),
                add_to: Some(rule.key()),
                remove_from: Some(rule.opposite().key()),
                same: &same,
            };
            outcomes.extend(edit.apply(&mut doc, fresh)?);
        }
        if let Some(cidr) = t.cidr {
            let same = |s: &str| s.parse::<IpNet>().is_ok_and(|c| c.trunc() == cidr);
            let (add_to, remove_from) = match rule {
                Rule::Allow => (Some(CIDRS), None),
                Rule::Deny => (None, Some(CIDRS)),
            };
            let entry = cidr.to_string();
            let edit = Edit {
                entry: &entry,
                add_to,
                remove_from,
                same: &same,
            };
            match edit.apply(&mut doc, fresh)? {
                Some(o) => outcomes.push(o),
                // `corral deny 10.0.0.0/8` with nothing to take out: said, not silent.
                None if t.pattern.is_none() => outcomes.push(Outcome {
                    list: format!("network.{CIDRS}"),
                    pattern: entry,
                    added: false,
                    present: false,
                    removed_from: None,
                }),
                None => {}
            }
        }
    }
    if !outcomes.iter().any(Outcome::changed) {
        return Ok((text.to_string(), outcomes));
    }
    Ok((doc.to_string(), outcomes))
}

/// The address ranges the proxy lets a destination's address be in (private, loopback, ...).
const CIDRS: &str = "allow_cidrs";

/// One entry's edit of the `[network]` table: taken out of `remove_from`, added to `add_to`;
/// entries compare by `same` (their parsed form, so `Example.com.` is `example.com`).
struct Edit<'a> {
    entry: &'a str,
    add_to: Option<&'static str>,
    remove_from: Option<&'static str>,
    same: &'a dyn Fn(&str) -> bool,
}

impl Edit<'_> {
    /// What it did; nothing for a removal from a list that did not hold it.
    fn apply(&self, doc: &mut DocumentMut, fresh: bool) -> anyhow::Result<Option<Outcome>> {
        if self.add_to.is_some() && !doc.contains_key("network") {
            let mut t = Table::new();
            if !fresh {
                t.decor_mut().set_prefix("\n");
            }
            doc.insert("network", Item::Table(t));
        }
        let inline = doc.get("network").is_some_and(Item::is_inline_table);
        let Some(network) = doc.get_mut("network") else {
            return Ok(None);
        };
        let network = network
            .as_table_like_mut()
            .context("`network` is not a table")?;
        let mut removed_from = None;
        if let Some(key) = self.remove_from
            && let Some(item) = network.get_mut(key)
        {
            let arr = item
                .as_array_mut()
                .with_context(|| format!("`network.{key}` is not an array"))?;
            let before = arr.len();
            remove_matching(arr, self.same);
            if arr.len() != before {
                removed_from = Some(format!("network.{key}"));
            }
        }
        let Some(key) = self.add_to else {
            return Ok(removed_from.map(|from| Outcome {
                list: from.clone(),
                pattern: self.entry.to_string(),
                added: false,
                present: false,
                removed_from: Some(from),
            }));
        };
        if !network.contains_key(key) {
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
            network.insert(key, Item::Value(new));
        }
        let arr = network
            .get_mut(key)
            .and_then(Item::as_array_mut)
            .with_context(|| format!("`network.{key}` is not an array"))?;
        let present = arr.iter().any(|v| v.as_str().is_some_and(self.same));
        if !present {
            push_keeping_layout(arr, self.entry);
        }
        Ok(Some(Outcome {
            list: format!("network.{key}"),
            pattern: self.entry.to_string(),
            added: !present,
            present,
            removed_from,
        }))
    }
}

/// Remove every element `same` holds for, keeping the others' layout.
fn remove_matching(arr: &mut Array, same: &dyn Fn(&str) -> bool) {
    let mut i = 0;
    while i < arr.len() {
        let hit = arr.get(i).and_then(Value::as_str).is_some_and(same);
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

/// Write `text` to `path`, keeping the old mode. The new content is first written and synced
/// beside it. A new file is then renamed into place. An existing one is rewritten in place (the
/// same inode): a running jail binds it read-only, and a rename over it would detach that bind
/// in the jail's mount namespace (the kernel drops mounts whose dentry goes away), leaving the
/// new file writable from the jail. A failure part-way names the copy that holds the content.
fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let existing = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file());
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
        if existing {
            return Ok(());
        }
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        bail!("cannot write {}: {e}", path.display());
    }
    if existing {
        let in_place = (|| -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(path)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()
        })();
        if let Err(e) = in_place {
            bail!(
                "cannot write {}: {e}; the new content is in {}",
                path.display(),
                tmp.display()
            );
        }
        let _ = std::fs::remove_file(&tmp);
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
    fn a_rule_by_path_goes_into_network_allow_in_canonical_form() {
        let t = Target::parse("GET API.github.com/repos/myorg/**").unwrap();
        assert_eq!((t.pattern.clone(), t.cidr), (None, None));
        let (text, outcomes) = edit_targets("", Rule::Allow, std::slice::from_ref(&t)).unwrap();
        assert_eq!(
            text,
            "[network]\nallow = [\"GET api.github.com/repos/myorg/**\"]\n"
        );
        assert!(outcomes[0].added);
        // Already there in another spelling: left as it is.
        let (again, outcomes) = edit_targets(
            "[network]\nallow = [\"GET api.github.com/repos/myorg/**\"]\n",
            Rule::Allow,
            &[t],
        )
        .unwrap();
        assert_eq!(again, text);
        assert!(outcomes[0].present);
        // CIDRs keep their meaning; a bad rule says what is wrong with it.
        assert!(Target::parse("10.0.0.0/8").unwrap().cidr.is_some());
        let e = Target::parse("github.com/a?b").unwrap_err().to_string();
        assert!(e.contains("query"), "{e}");
    }

    #[test]
    fn allow_takes_the_pattern_out_of_deny_and_back() {
        let text = "[network]\nallow = [\"a.com\"]\ndeny = [\"gist.github.com\", \"b.com\"]\n";
        let (t, o) = edit(text, Rule::Allow, "gist.github.com");
        assert!(o.removed_from.is_some() && o.added);
        assert_eq!(
            t,
            "[network]\nallow = [\"a.com\", \"gist.github.com\"]\ndeny = [\"b.com\"]\n"
        );
        let (t, o) = edit(&t, Rule::Deny, "gist.github.com");
        assert!(o.removed_from.is_some() && o.added);
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
