//! Harness profiles: data (TOML files compiled in), not code. Each says how to run one harness
//! in a jail: its command, state directories, variables, model API hosts, secrets, how it loads
//! the executor skill and its Dockerfile for the container engines. The files under
//! `crates/corral-policy/profiles/` cite where each fact was looked up.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::config::{
    EnvSection, NetworkSection, SecretEntry, SecretSpec, Spanned, parse_toml, pattern_at,
};
use crate::domain::DomainPattern;
use crate::error::PolicyError;
use crate::plan::{ConfigFormat, GuardedKeys};

/// The built-in profiles, by name, in the order `corral` lists them.
const BUILTIN: &[(&str, &str)] = &[
    ("pi", include_str!("../profiles/pi.toml")),
    ("claude", include_str!("../profiles/claude.toml")),
    ("codex", include_str!("../profiles/codex.toml")),
    ("gemini", include_str!("../profiles/gemini.toml")),
    ("opencode", include_str!("../profiles/opencode.toml")),
    ("aider", include_str!("../profiles/aider.toml")),
    ("shell", include_str!("../profiles/shell.toml")),
];

/// The names of the built-in profiles.
pub fn names() -> Vec<&'static str> {
    BUILTIN.iter().map(|(n, _)| *n).collect()
}

/// A harness profile, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    pub description: String,
    /// The harness's command (argv[0] looked up on the caller's PATH).
    pub command: Vec<String>,
    /// The harness image for the container engines.
    pub image: String,
    /// The harness's state directories (`~/` relative to the caller's home): the jail sees
    /// each with corral's layer above (`harness.rs`), never writing the host's.
    pub state_dirs: Vec<String>,
    /// The harness's state files (`~/` relative to the caller's home): the jail sees
    /// corral's copy of each.
    pub state_files: Vec<String>,
    /// Files bound read-only when they exist (the harness's own config).
    pub read_only: Vec<String>,
    /// Paths in the state directories that the harness runs or loads as code (extensions,
    /// hooks, plugins, downloaded tools, settings that name commands): called out by
    /// `corral state diff|apply` (advice; what the jail writes is in corral's layer anyway).
    pub state_code: Vec<String>,
    /// Configuration files the harness writes at run time that hold code among their data:
    /// `corral state diff|apply` call out a change of their code keys.
    pub guard: Vec<GuardEntry>,
    /// Variables passed from the caller when set.
    pub env_pass: Vec<String>,
    /// Variables set (values starting with `~/` are expanded to the home).
    pub env_set: BTreeMap<String, String>,
    /// Model API hosts the harness must reach.
    pub allow: Vec<DomainPattern>,
    /// Secrets served by the gateway, included when the caller has the variable.
    pub secrets: BTreeMap<String, SecretSpec>,
    /// Sign-in credential files served by the gateway (`[signin.NAME]`).
    pub signin: BTreeMap<String, crate::signin::SigninSpec>,
    /// Arguments that make the harness load the executor skill; `{dir}` is the skill directory.
    /// `None` when the harness has no such option.
    pub skill_args: Option<Vec<String>>,
    /// Dockerfile template for `corral image build`.
    pub dockerfile: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    name: String,
    description: String,
    command: Vec<String>,
    image: String,
    #[serde(default)]
    state_dirs: Vec<String>,
    #[serde(default)]
    state_files: Vec<String>,
    #[serde(default)]
    read_only: Vec<String>,
    #[serde(default)]
    state_code: Vec<String>,
    #[serde(default)]
    guard: Vec<GuardSection>,
    env: Option<EnvSection>,
    network: Option<NetworkSection>,
    secrets: Option<BTreeMap<String, Spanned<SecretEntry>>>,
    signin: Option<BTreeMap<String, crate::signin::SigninEntry>>,
    skill: Option<SkillSection>,
    image_build: ImageBuildSection,
}

/// A guarded configuration file of a profile (`[[guard]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardEntry {
    /// `~/`-relative: a state file, or a file directly in a state directory.
    pub file: String,
    pub format: ConfigFormat,
    pub keys: GuardedKeys,
    pub commands: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GuardSection {
    file: String,
    code: Option<Vec<String>>,
    all_but: Option<Vec<String>>,
    #[serde(default)]
    commands: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SkillSection {
    args: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageBuildSection {
    dockerfile: String,
}

/// The built-in profile `name`.
pub fn profile(name: &str) -> Result<Profile, PolicyError> {
    let text = BUILTIN
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            let hint = crate::config::closest(name, names())
                .map(|n| format!("did you mean {n:?}? "))
                .unwrap_or_default();
            PolicyError::Invalid(format!(
                "unknown profile {name:?}: {hint}expected one of {} (use `shell` with `-- CMD` \
                 for any other command)",
                names().join(", ")
            ))
        })?;
    parse_profile(Path::new(&format!("<builtin>/profiles/{name}.toml")), text)
}

/// Parse a profile file (the built-in ones, or a test's).
pub fn parse_profile(file: &Path, text: &str) -> Result<Profile, PolicyError> {
    let f: ProfileFile = parse_toml(file, text)?;
    if f.command.is_empty() {
        return Err(PolicyError::Invalid(format!(
            "{}: profile {:?} has an empty command",
            file.display(),
            f.name
        )));
    }
    let env = f.env.unwrap_or_default();
    let net = f.network.unwrap_or_default();
    let guard = f
        .guard
        .into_iter()
        .map(|g| guard_entry(file, g, &f.state_dirs, &f.state_files))
        .collect::<Result<Vec<_>, _>>()?;
    for c in &f.state_code {
        if !f
            .state_dirs
            .iter()
            .any(|d| Path::new(c).starts_with(d.as_str()))
        {
            return Err(PolicyError::Invalid(format!(
                "{}: state_code {c:?} is not in one of the profile's state_dirs",
                file.display()
            )));
        }
    }
    Ok(Profile {
        name: f.name,
        description: f.description,
        command: f.command,
        image: f.image,
        state_dirs: f.state_dirs,
        state_files: f.state_files,
        read_only: f.read_only,
        state_code: f.state_code,
        guard,
        env_pass: env.pass.into_iter().map(Spanned::into_inner).collect(),
        env_set: env
            .set
            .into_iter()
            .map(|(k, v)| (k, v.into_inner()))
            .collect(),
        allow: net
            .allow
            .iter()
            .map(|a| pattern_at(file, text, a))
            .collect::<Result<_, _>>()?,
        secrets: f
            .secrets
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| Ok((k, v.get_ref().resolve(file, text)?)))
            .collect::<Result<_, PolicyError>>()?,
        signin: f
            .signin
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| Ok((k, v.resolve(file, text)?)))
            .collect::<Result<_, PolicyError>>()?,
        skill_args: f.skill.map(|s| s.args),
        dockerfile: f.image_build.dockerfile,
    })
}

/// Check a `[[guard]]` entry: its file is a state file or directly in a state directory (so
/// corral reaches it through a directory the jail cannot rename), its syntax is known by the
/// file's extension, and it says which keys are code in exactly one way.
fn guard_entry(
    file: &Path,
    g: GuardSection,
    state_dirs: &[String],
    state_files: &[String],
) -> Result<GuardEntry, PolicyError> {
    let bad = |what: &str| {
        PolicyError::Invalid(format!("{}: guard {:?}: {what}", file.display(), g.file))
    };
    let path = Path::new(&g.file);
    let placed = state_files.contains(&g.file)
        || path
            .parent()
            .is_some_and(|p| state_dirs.iter().any(|d| p == Path::new(d)));
    if !placed {
        return Err(bad(
            "must be one of the state_files or a file directly in one of the state_dirs",
        ));
    }
    let format = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => ConfigFormat::Json,
        Some("toml") => ConfigFormat::Toml,
        _ => return Err(bad("expected a .json or .toml file")),
    };
    let keys = match (g.code, g.all_but) {
        (Some(code), None) => GuardedKeys::Code(code),
        (None, Some(data)) => GuardedKeys::AllBut(data),
        _ => return Err(bad("set exactly one of `code` and `all_but`")),
    };
    Ok(GuardEntry {
        file: g.file,
        format,
        keys,
        commands: g.commands,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_profile_parses_and_is_named_after_its_file() {
        for name in names() {
            let p = profile(name).unwrap_or_else(|e| panic!("profile {name}: {e}"));
            assert_eq!(p.name, name);
            assert!(
                p.dockerfile.contains("FROM "),
                "{name}: Dockerfile has no FROM"
            );
            for s in p
                .state_dirs
                .iter()
                .chain(&p.state_files)
                .chain(&p.read_only)
                .chain(&p.state_code)
                .chain(p.guard.iter().map(|g| &g.file))
            {
                assert!(
                    s.starts_with("~/"),
                    "{name}: state path {s:?} is not under ~/"
                );
            }
        }
    }

    #[test]
    fn pi_profile_is_what_the_spec_says() {
        let p = profile("pi").unwrap();
        assert_eq!(p.command, vec!["pi"]);
        assert_eq!(p.state_dirs, vec!["~/.pi/agent"]);
        assert_eq!(p.env_set["PI_CODING_AGENT_DIR"], "~/.pi/agent");
        assert_eq!(p.env_set["PI_OFFLINE"], "1");
        assert_eq!(
            p.skill_args,
            Some(vec!["--skill".to_string(), "{dir}".to_string()])
        );
        assert!(p.allow.iter().any(|a| a.to_string() == "api.anthropic.com"));
    }

    #[test]
    fn unknown_profile_names_the_choices() {
        let e = profile("pie").unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown profile \"pie\": did you mean \"pi\"? expected one of pi, claude, codex, \
             gemini, opencode, aider, shell (use `shell` with `-- CMD` for any other command)"
        );
        let e = profile("claud").unwrap_err().to_string();
        assert!(e.contains("did you mean \"claude\"?"), "{e}");
        // Nothing close: no guess.
        let e = profile("make").unwrap_err().to_string();
        assert!(!e.contains("did you mean"), "{e}");
        let e = profile("ls").unwrap_err().to_string();
        assert!(!e.contains("did you mean"), "{e}");
    }
}
