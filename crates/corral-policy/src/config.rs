//! The `corral.toml` schema (SPEC section 3), its value types (sizes, durations, executor
//! targets) and loading with errors that point at `FILE:LINE:COL`.
//!
//! Every table rejects unknown keys (`deny_unknown_fields`); an unknown key is reported with the
//! closest known key. Values that need a check beyond their type (sizes, durations, domain
//! patterns, executor targets) are parsed while deserializing, so their errors carry the value's
//! position. Checks that need context (paths relative to the project, the opt-in for an
//! unsandboxed executor) happen in [`crate::resolve`] with the positions kept in [`Spanned`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer};
pub use toml::Spanned;

use crate::domain::DomainPattern;
use crate::error::PolicyError;
use crate::plan::{Access, Dns, Enforce, Engine, ExecutorTarget, NetworkMode};

/// One policy file: the project's `corral.toml`, the user config, or a `--policy` file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    pub profile: Option<Spanned<String>>,
    pub run: Option<RunSection>,
    pub filesystem: Option<FilesystemSection>,
    pub env: Option<EnvSection>,
    pub network: Option<NetworkSection>,
    pub secrets: Option<BTreeMap<String, Spanned<SecretEntry>>>,
    /// `[signin.NAME]`: sign-in credential files served by the gateway.
    pub signin: Option<BTreeMap<String, crate::signin::SigninEntry>>,
    pub limits: Option<LimitsSection>,
    pub executor: Option<ExecutorSection>,
    pub terminal: Option<TerminalSection>,
    /// `[undo]`: the change record's bounds (user config only; corral-changes).
    pub undo: Option<UndoSection>,
}

/// `[undo]`: how much of the change record (`corral undo`, docs/undo.md) is kept per project.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UndoSection {
    /// Runs kept at most (default 20); 0 keeps no record.
    pub keep_runs: Option<usize>,
    /// Bytes the records take at most (default 2g).
    pub max_size: Option<Size>,
}

/// `[terminal]`: what the jail may do to the user's terminal beyond its own screen.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TerminalSection {
    /// Let OSC 52 clipboard writes through (default false).
    pub clipboard: Option<Spanned<bool>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    pub command: Option<Spanned<Vec<String>>>,
    pub engine: Option<Engine>,
    pub image: Option<Spanned<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesystemSection {
    pub project: Option<Access>,
    #[serde(default)]
    pub read_only: Vec<Spanned<String>>,
    #[serde(default)]
    pub read_write: Vec<Spanned<String>>,
    #[serde(default)]
    pub hide: Vec<Spanned<String>>,
    #[serde(default)]
    pub protect: Vec<Spanned<String>>,
    /// Bind the host's harness state read-write instead of corral's layer (user config only).
    pub allow_harness_config: Option<Spanned<bool>>,
    /// The jail may create git repositories where the host sees them (user config only).
    pub allow_new_repositories: Option<Spanned<bool>>,
    /// Hold the run's writes to the project for review (`corral diff`, `accept`, `discard`).
    /// Any layer may turn it on; none turns it off for another.
    pub review: Option<Spanned<bool>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvSection {
    /// Variable names, checked by the resolver so an error points at the entry itself.
    #[serde(default)]
    pub pass: Vec<Spanned<String>>,
    #[serde(default)]
    pub set: BTreeMap<String, Spanned<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    pub mode: Option<Spanned<NetworkMode>>,
    /// Domain patterns, parsed by the resolver so an error points at the entry itself.
    #[serde(default)]
    pub allow: Vec<Spanned<String>>,
    #[serde(default)]
    pub deny: Vec<Spanned<String>>,
    #[serde(default)]
    pub allow_cidrs: Vec<Spanned<IpNet>>,
    #[serde(default)]
    pub host_ports: Vec<Spanned<u16>>,
    pub upstream_proxy: Option<Spanned<ProxyUrl>>,
    #[serde(default)]
    pub publish: Vec<Spanned<u16>>,
    /// `"none"` (default) or `"stub"`.
    pub dns: Option<Spanned<Dns>>,
    /// `"refuse"` (default) or `"ask"`.
    pub on_deny: Option<Spanned<OnDenyMode>>,
    /// Seconds a held connection waits for an answer (`on_deny = "ask"`), 1..=300.
    pub ask_timeout: Option<Spanned<i64>>,
}

/// `network.on_deny` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDenyMode {
    Refuse,
    Ask,
}

/// Seconds a question waits when `network.ask_timeout` is not set.
pub const DEFAULT_ASK_TIMEOUT: u32 = 30;
/// The longest `network.ask_timeout`.
pub const MAX_ASK_TIMEOUT: u32 = 300;

/// `NAME = { from_env = "VAR", hosts = ["api.example.com"] }` under `[secrets]`, as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretEntry {
    pub from_env: EnvName,
    pub hosts: Vec<Spanned<String>>,
}

/// A secret, its host patterns parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretSpec {
    pub from_env: EnvName,
    pub hosts: Vec<DomainPattern>,
}

/// Parse a domain pattern written at `span` of `text` (the content of `file`).
pub fn pattern_at(
    file: &Path,
    text: &str,
    raw: &Spanned<String>,
) -> Result<DomainPattern, PolicyError> {
    DomainPattern::parse(raw.get_ref())
        .map_err(|e| PolicyError::at(file, text, raw.span().start, e.to_string()))
}

impl SecretEntry {
    /// Parse the host patterns, each error at its own entry.
    pub fn resolve(&self, file: &Path, text: &str) -> Result<SecretSpec, PolicyError> {
        Ok(SecretSpec {
            from_env: self.from_env.clone(),
            hosts: self
                .hosts
                .iter()
                .map(|h| pattern_at(file, text, h))
                .collect::<Result<_, _>>()?,
        })
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub memory: Option<MemorySize>,
    pub cpus: Option<Cpus>,
    pub pids: Option<u64>,
    pub enforce: Option<Enforce>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorSection {
    pub target: Option<Spanned<TargetSpec>>,
    /// The explicit opt-in for `target = "host"`; honoured only in the user config.
    pub allow_host: Option<Spanned<bool>>,
    pub allow: Option<Vec<String>>,
    pub timeout: Option<HumanDuration>,
    pub max_output: Option<Size>,
    pub max_concurrent: Option<usize>,
    pub sandbox: Option<ExecutorSandboxSection>,
}

/// `[executor.sandbox]`: the project environment commands run in when `target = "sandbox"`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorSandboxSection {
    #[serde(default)]
    pub read_only: Vec<Spanned<String>>,
    #[serde(default)]
    pub read_write: Vec<Spanned<String>>,
    pub network: Option<NetworkSection>,
}

/// A size in bytes, written as docker writes it: a number (a fraction allowed), an optional
/// space, and a unit: `b`, or `k`, `m`, `g`, `t` alone or followed by `b` or `ib`, in any case
/// (`512m`, `4g`, `4gb`, `4GiB`, `1.5g`, `4096b`). Every unit is binary, as docker's are
/// (`1k` = 1024). A bare number is refused: `memory = 4` is four bytes to docker and almost
/// never what was meant; the unit says it (`4g`, or `4b` for bytes). Zero is refused too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl Size {
    pub fn parse(raw: &str) -> Result<Size, String> {
        let s = raw.trim();
        let bad = || {
            format!(
                "invalid size {raw:?}: expected a number with one of the units b, k, m, g, t \
                 (e.g. 512m, 4g, 4gb, 4GiB, 1.5g)"
            )
        };
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        if num.is_empty() || num.starts_with('.') || num.ends_with('.') {
            return Err(bad());
        }
        let zero = || format!("invalid size {raw:?}: must be more than zero");
        if num.chars().all(|c| c == '0' || c == '.') {
            return Err(zero());
        }
        let mult: u64 = match unit.trim_start().to_ascii_lowercase().as_str() {
            "" => {
                return Err(format!(
                    "invalid size {raw:?}: a number alone is ambiguous; write its unit \
                     (e.g. {num}g or {num}m, or {num}b for bytes)"
                ));
            }
            "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            "t" | "tb" | "tib" => 1 << 40,
            _ => return Err(bad()),
        };
        let bytes = if mult == 1 {
            num.parse::<u64>().map_err(|_| bad())?
        } else {
            let n: f64 = num.parse().map_err(|_| bad())?;
            let bytes = (n * mult as f64).round();
            if !bytes.is_finite() || bytes > u64::MAX as f64 {
                return Err(bad());
            }
            bytes as u64
        };
        if bytes == 0 {
            return Err(zero());
        }
        Ok(Size(bytes))
    }
}

/// How a size is said back in messages: the largest unit it is a whole number of (`16m`),
/// else bytes (`1000b`).
pub fn size_text(bytes: u64) -> String {
    for (mult, unit) in [
        (1u64 << 40, "t"),
        (1 << 30, "g"),
        (1 << 20, "m"),
        (1 << 10, "k"),
    ] {
        if bytes >= mult && bytes.is_multiple_of(mult) {
            return format!("{}{unit}", bytes / mult);
        }
    }
    format!("{bytes}b")
}

/// A size written as a bare TOML integer: refused with the same advice as a bare number.
fn integer_size<E: serde::de::Error>(v: i128) -> E {
    if v <= 0 {
        return E::custom(format!("invalid size {v}: must be more than zero"));
    }
    E::custom(format!(
        "invalid size {v}: a number alone is ambiguous; write it as a string with its unit \
         (e.g. \"{v}g\" or \"{v}m\", or \"{v}b\" for bytes)"
    ))
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size such as \"512m\", \"4g\" or \"1.5g\"")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Size, E> {
                Err(integer_size(v.into()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Size, E> {
                Err(integer_size(v.into()))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Size, E> {
                Size::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// The smallest memory limit corral starts a jail with: docker's own floor (6 MB). Measured
/// here (cgroup v1, as root): below about 1 MiB the jail's set-up process is killed before the
/// command starts and all the user saw was a broken control socket; `sh -c` starts from 1 MiB,
/// `python3 -c 'print(1)'` needs 6 MiB.
pub const MIN_MEMORY: u64 = 6 << 20;

/// `limits.memory` / `--memory`: a [`Size`] of at least [`MIN_MEMORY`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySize(pub u64);

impl MemorySize {
    pub fn parse(raw: &str) -> Result<MemorySize, String> {
        MemorySize::check(Size::parse(raw)?, raw)
    }

    fn check(size: Size, raw: &str) -> Result<MemorySize, String> {
        if size.0 < MIN_MEMORY {
            return Err(format!(
                "memory limit {raw:?} is too small to start a jail: the least is {} (what \
                 docker allows; a command's own process needs about that much to start)",
                size_text(MIN_MEMORY)
            ));
        }
        Ok(MemorySize(size.0))
    }
}

impl<'de> Deserialize<'de> for MemorySize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let size = Size::deserialize(d)?;
        MemorySize::check(size, &size_text(size.0)).map_err(serde::de::Error::custom)
    }
}

/// A duration: whatever `humantime` accepts (`30s`, `10m`, `1h 30m`, `250ms`, `2days`), or a
/// number with a fraction and one of the units `ms`, `s`, `m`, `h` (`1.5h`). A bare number in
/// a string is refused (its unit is not obvious); a TOML integer is a number of seconds. Zero
/// is refused. Held in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub u64);

impl HumanDuration {
    pub fn parse(raw: &str) -> Result<HumanDuration, String> {
        let s = raw.trim();
        let bad = || {
            format!(
                "invalid duration {raw:?}: expected a number with a unit (e.g. 30s, 10m, \
                 1h 30m, 250ms, 1.5h)"
            )
        };
        if let Ok(d) = humantime::parse_duration(s) {
            let ms = d.as_millis();
            return match u64::try_from(ms) {
                Ok(0) => Err(format!("invalid duration {raw:?}: must be at least 1ms")),
                Ok(ms) => Ok(HumanDuration(ms)),
                Err(_) => Err(bad()),
            };
        }
        // A fraction (`1.5h`), which humantime does not take.
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (num, unit) = s.split_at(split);
        let mult: f64 = match unit {
            "ms" => 1.0,
            "s" => 1_000.0,
            "m" => 60_000.0,
            "h" => 3_600_000.0,
            _ => return Err(bad()),
        };
        if num.is_empty() {
            return Err(bad());
        }
        let n: f64 = num.parse().map_err(|_| bad())?;
        let ms = n * mult;
        if !ms.is_finite() || ms < 1.0 || ms > u64::MAX as f64 {
            return Err(bad());
        }
        Ok(HumanDuration(ms.round() as u64))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration such as \"30s\" or \"10m\"")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<HumanDuration, E> {
                match u64::try_from(v) {
                    Ok(0) => Err(E::custom("invalid duration 0: must be at least 1ms")),
                    Ok(s) => Ok(HumanDuration(s.saturating_mul(1000))),
                    Err(_) => Err(E::custom(format!(
                        "invalid duration {v}: must not be negative"
                    ))),
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                HumanDuration::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A CPU count: a positive number (`2`, `0.5`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cpus(pub f64);

impl<'de> Deserialize<'de> for Cpus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Cpus;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a positive number of CPUs such as 2 or 0.5")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Cpus, E> {
                self.visit_f64(v as f64)
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Cpus, E> {
                if v.is_finite() && v > 0.0 {
                    Ok(Cpus(v))
                } else {
                    Err(E::custom(format!(
                        "invalid cpus {v}: expected a positive number such as 2 or 0.5"
                    )))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// Whether a CPU limit of `cpus` fits this machine: more CPUs than this process may run on
/// (its affinity and cgroup quota counted, `std::thread::available_parallelism`) is refused, as
/// docker refuses it. Applied to `--cpus`; a policy file travels between machines and its
/// value is a ceiling the kernel applies as "at most all of them".
pub fn check_cpus_here(cpus: f64) -> Result<(), String> {
    let Ok(n) = std::thread::available_parallelism() else {
        return Ok(());
    };
    if cpus > n.get() as f64 {
        let s = if n.get() == 1 { "" } else { "s" };
        return Err(format!(
            "this machine has {n} CPU{s}: the limit can be at most {n}"
        ));
    }
    Ok(())
}

/// `sandbox`, `compose:SERVICE` or `host`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSpec(pub ExecutorTarget);

impl TargetSpec {
    pub fn parse(raw: &str) -> Result<TargetSpec, String> {
        match raw {
            "sandbox" => Ok(TargetSpec(ExecutorTarget::Sandbox)),
            "host" => Ok(TargetSpec(ExecutorTarget::Host)),
            _ => match raw.strip_prefix("compose:") {
                Some(svc)
                    if !svc.is_empty()
                        && svc
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) =>
                {
                    Ok(TargetSpec(ExecutorTarget::Compose(svc.to_string())))
                }
                _ => Err(format!(
                    "invalid executor target {raw:?}: expected \"sandbox\", \"compose:SERVICE\" \
                     or \"host\""
                )),
            },
        }
    }
}

impl<'de> Deserialize<'de> for TargetSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        TargetSpec::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// An environment variable name: letters, digits and `_`, not starting with a digit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EnvName(pub String);

impl EnvName {
    pub fn parse(raw: &str) -> Result<EnvName, String> {
        let ok = !raw.is_empty()
            && !raw.starts_with(|c: char| c.is_ascii_digit())
            && raw.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if ok {
            Ok(EnvName(raw.to_string()))
        } else {
            Err(format!(
                "invalid variable name {raw:?}: expected letters, digits and _ (not starting \
                 with a digit)"
            ))
        }
    }
}

impl<'de> Deserialize<'de> for EnvName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        EnvName::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// An upstream proxy URL: `http://HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyUrl(pub String);

impl ProxyUrl {
    /// Checked by the one parser of upstream proxy URLs
    /// ([`crate::consts::UpstreamProxy::parse`]); kept as written, without a trailing `/`.
    pub fn parse(raw: &str) -> Result<ProxyUrl, String> {
        crate::consts::UpstreamProxy::parse(raw)?;
        let rest = &raw["http://".len()..];
        Ok(ProxyUrl(format!(
            "http://{}",
            rest.strip_suffix('/').unwrap_or(rest)
        )))
    }
}

impl<'de> Deserialize<'de> for ProxyUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        ProxyUrl::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// Parse `text` (the content of `file`) as a policy file.
pub fn parse_policy(file: &Path, text: &str) -> Result<PolicyFile, PolicyError> {
    parse_toml(file, text)
}

/// Read and parse a policy file.
pub fn load_policy(file: &Path) -> Result<(PolicyFile, String), PolicyError> {
    let text = read_policy_text(file).map_err(|source| PolicyError::Read {
        path: file.to_path_buf(),
        source,
    })?;
    Ok((parse_policy(file, &text)?, text))
}

/// Whether `meta` is the null device (character device 1:3): empty, never blocks.
fn is_dev_null(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    meta.file_type().is_char_device() && meta.rdev() == libc::makedev(1, 3)
}

/// The largest policy file corral reads.
pub const MAX_POLICY_BYTES: u64 = 1 << 20;

/// A policy file's text. The file may come from a hostile repository: it must be a regular file
/// (a committed `corral.toml -> /dev/zero` or a FIFO must not hang corral; the open does not
/// block and the type is checked on the opened descriptor) of at most [`MAX_POLICY_BYTES`].
fn read_policy_text(file: &Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(file)?;
    let meta = f.metadata()?;
    if is_dev_null(&meta) {
        // `--policy /dev/null`: explicitly no policy file (the executor corral run starts
        // gets its settings as flags).
        return Ok(String::new());
    }
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut text = String::new();
    f.take(MAX_POLICY_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_POLICY_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {MAX_POLICY_BYTES} bytes"
        )));
    }
    Ok(text)
}

/// Deserialize TOML, turning the parser's error into `FILE:LINE:COL: message`, with the closest
/// known key suggested for an unknown one.
pub(crate) fn parse_toml<T: serde::de::DeserializeOwned>(
    file: &Path,
    text: &str,
) -> Result<T, PolicyError> {
    toml::from_str(text).map_err(|e| {
        let offset = e.span().map(|s| s.start).unwrap_or(0);
        PolicyError::at(file, text, offset, explain(e.message()))
    })
}

/// Reword serde's messages for people: suggest the closest key for an unknown one.
fn explain(message: &str) -> String {
    let message = message.trim_end();
    if let Some(rest) = message.strip_prefix("unknown field `")
        && let Some((name, tail)) = rest.split_once('`')
    {
        let known: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
        let closest = closest(name, known.iter().copied());
        let expected = if known.is_empty() {
            "no keys are allowed here".to_string()
        } else {
            format!(
                "expected one of {}",
                known
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        return match closest {
            Some(k) => format!("unknown key `{name}`: did you mean `{k}`? ({expected})"),
            None => format!("unknown key `{name}` ({expected})"),
        };
    }
    message.to_string()
}

/// The candidate closest to `name`, when it is close enough to be a typo of it (at most half
/// its length away, 2 always allowed, but never every character of it: `ls` is not a typo of
/// `pi`): what "did you mean" suggests, for keys and profile names alike.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|k| (edit_distance(name, k), k))
        .filter(|(d, k)| *d <= (k.len().max(name.len()) / 2).max(2) && *d < name.chars().count())
        .min()
        .map(|(_, k)| k)
}

/// Levenshtein distance, for key suggestions.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_that_is_a_fifo_a_device_or_huge_is_refused_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("corral.toml");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let e = load_policy(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");

        let zero = dir.path().join("zero.toml");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let e = load_policy(&zero).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");

        // The null device is an explicitly empty policy (`--policy /dev/null`).
        let (_, text) = load_policy(Path::new("/dev/null")).unwrap();
        assert_eq!(text, "");

        let huge = dir.path().join("huge.toml");
        std::fs::write(&huge, "#".repeat(MAX_POLICY_BYTES as usize + 1)).unwrap();
        let e = load_policy(&huge).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
    }

    #[test]
    fn sizes_as_docker_writes_them() {
        for (raw, want) in [
            ("512m", 512 << 20),
            ("4g", 4 << 30),
            ("4G", 4 << 30),
            ("4gb", 4 << 30),
            ("4GB", 4 << 30),
            ("4GiB", 4 << 30),
            ("4 g", 4 << 30),
            ("1.5g", 3 << 29),
            ("64k", 64 << 10),
            ("2t", 2 << 40),
            ("4096b", 4096),
            ("4096B", 4096),
        ] {
            assert_eq!(Size::parse(raw), Ok(Size(want)), "{raw:?}");
        }
        for bad in [
            "",
            "g",
            "-1g",
            "4 g x",
            "1e3m",
            "0.0000001k",
            "4gibb",
            "4x",
            ".5g",
            "5.g",
            "1.5b",
        ] {
            assert!(Size::parse(bad).is_err(), "{bad:?} should be rejected");
        }
        // A bare number says what to write instead; zero says zero.
        assert_eq!(
            Size::parse("4").unwrap_err(),
            "invalid size \"4\": a number alone is ambiguous; write its unit (e.g. 4g or 4m, \
             or 4b for bytes)"
        );
        assert_eq!(
            Size::parse("0").unwrap_err(),
            "invalid size \"0\": must be more than zero"
        );
        assert_eq!(
            Size::parse("0m").unwrap_err(),
            "invalid size \"0m\": must be more than zero"
        );
    }

    #[test]
    fn memory_has_a_floor_and_files_need_the_unit() {
        assert_eq!(MemorySize::parse("6m"), Ok(MemorySize(6 << 20)));
        let e = MemorySize::parse("4m").unwrap_err();
        assert!(
            e.contains("too small to start a jail: the least is 6m (what"),
            "{e}"
        );
        let f = Path::new("corral.toml");
        let e = parse_policy(f, "[limits]\nmemory = 4\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "corral.toml:2:10: invalid size 4: a number alone is ambiguous; write it as a \
             string with its unit (e.g. \"4g\" or \"4m\", or \"4b\" for bytes)"
        );
        let e = parse_policy(f, "[limits]\nmemory = \"1m\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("corral.toml:2:10: memory limit \"1m\" is too small"),
            "{e}"
        );
        let p = parse_policy(f, "[limits]\nmemory = \"4GiB\"\n").unwrap();
        assert_eq!(p.limits.unwrap().memory, Some(MemorySize(4 << 30)));
    }

    #[test]
    fn size_text_is_the_largest_whole_unit() {
        assert_eq!(size_text(16 << 20), "16m");
        assert_eq!(size_text(3 << 29), "1536m");
        assert_eq!(size_text(1000), "1000b");
    }

    #[test]
    fn cpus_above_this_machine_are_refused() {
        let n = std::thread::available_parallelism().unwrap().get();
        assert_eq!(check_cpus_here(n as f64), Ok(()));
        assert_eq!(check_cpus_here(0.5), Ok(()));
        let e = check_cpus_here(n as f64 + 0.5).unwrap_err();
        assert!(e.contains(&format!("at most {n}")), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(HumanDuration::parse("30s"), Ok(HumanDuration(30_000)));
        assert_eq!(HumanDuration::parse("10m"), Ok(HumanDuration(600_000)));
        assert_eq!(HumanDuration::parse("1.5h"), Ok(HumanDuration(5_400_000)));
        assert_eq!(HumanDuration::parse("250ms"), Ok(HumanDuration(250)));
        // What humantime accepts.
        assert_eq!(HumanDuration::parse("1h 30m"), Ok(HumanDuration(5_400_000)));
        assert_eq!(
            HumanDuration::parse("2days"),
            Ok(HumanDuration(172_800_000))
        );
        assert_eq!(HumanDuration::parse("5min"), Ok(HumanDuration(300_000)));
        assert_eq!(HumanDuration::parse("1h30m"), Ok(HumanDuration(5_400_000)));
        for bad in ["10", "10 parsecs", "s", "", "-1s", "0s", "1.5x"] {
            assert!(
                HumanDuration::parse(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn targets() {
        assert_eq!(
            TargetSpec::parse("compose:app").unwrap().0,
            ExecutorTarget::Compose("app".into())
        );
        assert!(TargetSpec::parse("compose:").is_err());
        assert!(TargetSpec::parse("compose:a b").is_err());
        assert!(TargetSpec::parse("vm").is_err());
    }

    #[test]
    fn proxy_urls() {
        assert_eq!(
            ProxyUrl::parse("http://proxy.corp:3128").unwrap().0,
            "http://proxy.corp:3128"
        );
        for bad in [
            "proxy.corp:3128",
            "http://proxy.corp",
            "http://u:p@h:1",
            "https://h:1",
        ] {
            assert!(ProxyUrl::parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    proptest::proptest! {
        #[test]
        fn sizes_with_a_suffix_are_that_many_units(n in 1u64..1_000_000, u in 0usize..4) {
            let (suffix, mult) = [("k", 1u64 << 10), ("m", 1 << 20), ("g", 1 << 30), ("t", 1 << 40)][u];
            proptest::prop_assert_eq!(Size::parse(&format!("{n}{suffix}")), Ok(Size(n * mult)));
            proptest::prop_assert_eq!(Size::parse(&format!("{n}b")), Ok(Size(n)));
            proptest::prop_assert_eq!(Size::parse(&format!("{n}{suffix}b")), Ok(Size(n * mult)));
            let upper = format!("{n}{}iB", suffix.to_uppercase());
            proptest::prop_assert_eq!(Size::parse(&upper), Ok(Size(n * mult)));
            proptest::prop_assert!(Size::parse(&n.to_string()).is_err());
        }

        #[test]
        fn durations_are_that_many_milliseconds(n in 1u64..1_000_000, u in 0usize..4) {
            let (unit, mult) = [("ms", 1u64), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)][u];
            proptest::prop_assert_eq!(
                HumanDuration::parse(&format!("{n}{unit}")),
                Ok(HumanDuration(n * mult))
            );
        }

        #[test]
        fn size_parsing_never_panics(s in "\\PC{0,12}") {
            let _ = Size::parse(&s);
            let _ = HumanDuration::parse(&s);
        }
    }

    #[test]
    fn distance() {
        assert_eq!(edit_distance("memroy", "memory"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("read_wirte", "read_write"), 2);
    }
}
