//! No real credential in corral's copy of a state file: `primaryApiKey` and every value of an MCP
//! server's `env` and `headers` (`mcpServers.*`, `projects.*.mcpServers.*`) that is not plainly
//! harmless becomes a placeholder, stable per profile and field (kept 0600 in the layer), so a
//! jailed harness keeps working across runs. The real values are the host's file's: the gateway
//! puts `primaryApiKey` into requests to api.anthropic.com and an MCP server's header into
//! requests to the host of that server's `url`. An `env` value has no host (it reaches a local
//! process): its placeholder is swapped nowhere; declare a `[secrets]` entry for it.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use corral_policy::domain::DomainPattern;
use corral_policy::plan::{HarnessState, SecretPlan};
use serde_json::Value;

use super::fsops;

/// A credential of a state file: where it is, the hosts its real value goes to, the real value
/// (from the host's file; `None` when the host's file has none there), its placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSecret {
    pub file: std::path::PathBuf,
    pub field: Vec<String>,
    pub hosts: Vec<String>,
    pub real: Option<String>,
    pub placeholder: String,
}

impl StateSecret {
    /// The secret as the gateway takes it (with its real value), when it has a real value and
    /// a host.
    pub fn for_gateway(&self) -> Option<(SecretPlan, String)> {
        let real = self.real.clone()?;
        let hosts: Vec<DomainPattern> = self
            .hosts
            .iter()
            .filter_map(|h| DomainPattern::parse(h).ok())
            .collect();
        if hosts.is_empty() {
            return None;
        }
        let name = format!("{}:{}", self.file.display(), self.field.join("."));
        Some((
            SecretPlan {
                name: name.clone(),
                from_env: name,
                hosts,
            },
            real,
        ))
    }
}

/// Names of `env` and `headers` entries whose values are plainly not secret.
const HARMLESS_NAMES: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "TZ",
    "NODE_ENV",
    "DEBUG",
    "LOG_LEVEL",
    "PORT",
    "HOST",
    "accept",
    "content-type",
    "user-agent",
];

fn harmless(name: &str, value: &str) -> bool {
    HARMLESS_NAMES.iter().any(|n| n.eq_ignore_ascii_case(name))
        || value.is_empty()
        || value == "true"
        || value == "false"
        || value.bytes().all(|b| b.is_ascii_digit())
}

/// Each credential field of a state file's JSON: its path and the host its value goes to.
fn fields(v: &Value) -> Vec<(Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    if v.get("primaryApiKey").is_some_and(Value::is_string) {
        out.push((
            vec!["primaryApiKey".into()],
            vec!["api.anthropic.com".into()],
        ));
    }
    let mut servers = |prefix: Vec<String>, m: Option<&Value>| {
        let Some(Value::Object(m)) = m else {
            return;
        };
        for (name, server) in m {
            let host = server.get("url").and_then(Value::as_str).and_then(url_host);
            for (part, hosts) in [
                ("headers", host.iter().cloned().collect::<Vec<_>>()),
                ("env", Vec::new()),
            ] {
                let Some(Value::Object(kv)) = server.get(part) else {
                    continue;
                };
                for (k, val) in kv {
                    let Some(s) = val.as_str() else { continue };
                    if harmless(k, s) {
                        continue;
                    }
                    let mut path = prefix.clone();
                    path.extend(["mcpServers".into(), name.clone(), part.into(), k.clone()]);
                    out.push((path, hosts.clone()));
                }
            }
        }
    };
    servers(Vec::new(), v.get("mcpServers"));
    if let Some(Value::Object(projects)) = v.get("projects") {
        for (p, proj) in projects {
            servers(vec!["projects".into(), p.clone()], proj.get("mcpServers"));
        }
    }
    out
}

/// The host and port of an `http(s)://host[:port]/...` URL (`host:port`; the scheme's port
/// when none is written): a credential for that server goes to that port alone.
fn url_host(url: &str) -> Option<String> {
    let (rest, default_port) = match url.strip_prefix("https://") {
        Some(rest) => (rest, 443),
        None => (url.strip_prefix("http://")?, 80),
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit('@').next()?;
    let (host, port) = match host_port.split_once(':') {
        Some((h, p)) => (h, p.parse::<u16>().ok()?),
        None => (host_port, default_port),
    };
    (!host.is_empty()).then(|| format!("{}:{port}", host.to_ascii_lowercase()))
}

fn get<'v>(v: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

fn get_mut<'v>(v: &'v mut Value, path: &[String]) -> Option<&'v mut Value> {
    path.iter().try_fold(v, |v, k| v.get_mut(k))
}

/// The secret part of a value: the last word (`Bearer TOKEN` keeps its scheme).
fn split_scheme(s: &str) -> (&str, &str) {
    match s.rfind(' ') {
        Some(i) => (&s[..=i], &s[i + 1..]),
        None => ("", s),
    }
}

/// Replace every credential in each state file's copy by its placeholder (made once per
/// field and kept in the layer's `placeholders.json`, 0600), and return them with the host's
/// real values. Call with the layer's lock held (`write`), before the jail starts; a run that
/// found the layer in use only reads them (the copy is bound in the other run's jail). A copy
/// that is not JSON is left as it is (nothing to find in it).
pub fn scrub(state: &HarnessState, write: bool) -> anyhow::Result<Vec<StateSecret>> {
    let store_path = state.layer.join("placeholders.json");
    let mut store: BTreeMap<String, String> = match std::fs::read(&store_path) {
        Ok(b) => serde_json::from_slice(&b)
            .with_context(|| format!("cannot parse {}", store_path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", store_path.display())),
    };
    let stored = store.clone();
    let mut out = Vec::new();
    for f in &state.files {
        let Some((dir, name)) = f.copy.parent().zip(f.copy.file_name()) else {
            continue;
        };
        let d = fsops::open_root(dir)?;
        let Ok(bytes) = fsops::read_file(&d, name, super::MAX_FILE_BYTES) else {
            continue;
        };
        let Ok(mut copy) = serde_json::from_slice::<Value>(&bytes) else {
            continue;
        };
        let host: Option<Value> = read_host(&f.host).and_then(|b| serde_json::from_slice(&b).ok());
        // Where each real value may go is the host's file's word (its servers' `url`), never
        // the copy's: the jail writes the copy.
        let host_fields: Vec<(Vec<String>, Vec<String>)> =
            host.as_ref().map(fields).unwrap_or_default();
        let mut found: Vec<Vec<String>> = fields(&copy).into_iter().map(|(p, _)| p).collect();
        for (path, _) in &host_fields {
            if !found.contains(path) {
                found.push(path.clone());
            }
        }
        let mut changed = false;
        for path in found {
            let hosts = host_fields
                .iter()
                .find(|(p, _)| *p == path)
                .map(|(_, h)| h.clone())
                .unwrap_or_default();
            let key = format!("{}\u{0}{}", f.copy.display(), path.join("\u{0}"));
            let real = host
                .as_ref()
                .and_then(|h| get(h, &path))
                .and_then(Value::as_str)
                .map(|s| split_scheme(s).1.to_string())
                .filter(|s| !s.is_empty());
            let placeholder = match store.get(&key) {
                Some(p) => p.clone(),
                None => {
                    let p = corral_gateway::placeholder_for(real.as_deref().unwrap_or("corral"))?;
                    store.insert(key, p.clone());
                    p
                }
            };
            if let Some(slot) = get_mut(&mut copy, &path)
                && let Some(s) = slot.as_str()
            {
                let (scheme, secret) = split_scheme(s);
                if secret != placeholder {
                    *slot = Value::String(format!("{scheme}{placeholder}"));
                    changed = true;
                }
            }
            out.push(StateSecret {
                file: f.host.clone(),
                field: path,
                hosts,
                real,
                placeholder,
            });
        }
        if changed && write {
            let text = serde_json::to_vec_pretty(&copy)?;
            fsops::replace_file(&d, name, &text, 0o600)
                .with_context(|| format!("cannot write {}", f.copy.display()))?;
        }
    }
    if store != stored && write {
        let d = fsops::open_root(&state.layer)?;
        fsops::replace_file(
            &d,
            std::ffi::OsStr::new("placeholders.json"),
            &serde_json::to_vec(&store)?,
            0o600,
        )
        .with_context(|| format!("cannot write {}", store_path.display()))?;
    }
    Ok(out)
}

/// `copy` (the bytes of `file`'s copy, a state file) with each placeholder the layer put there
/// back to the host's real value: what `corral state diff` compares and `apply` writes, so the
/// host never gets a placeholder for a credential it has. `None` when the copy is no JSON.
pub fn with_real_values(state: &HarnessState, file: &Path, copy: &[u8]) -> Option<Value> {
    let mut copy: Value = serde_json::from_slice(copy).ok()?;
    let store_path = state.layer.join("placeholders.json");
    let store: BTreeMap<String, String> = std::fs::read(&store_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let f = state.files.iter().find(|f| f.host == file)?;
    let host: Option<Value> = read_host(&f.host).and_then(|b| serde_json::from_slice(&b).ok());
    let Some(host) = host else {
        return Some(copy);
    };
    for (path, _) in fields(&copy) {
        let key = format!("{}\u{0}{}", f.copy.display(), path.join("\u{0}"));
        let (Some(placeholder), Some(real)) =
            (store.get(&key), get(&host, &path).and_then(Value::as_str))
        else {
            continue;
        };
        if let Some(slot) = get_mut(&mut copy, &path)
            && slot
                .as_str()
                .is_some_and(|s| split_scheme(s).1 == placeholder)
        {
            *slot = Value::String(real.to_string());
        }
    }
    Some(copy)
}

/// The host's state file, not followed.
fn read_host(p: &Path) -> Option<Vec<u8>> {
    let d = fsops::open_root(p.parent()?).ok()?;
    fsops::read_file(&d, p.file_name()?, super::MAX_FILE_BYTES).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_holds_placeholders_stable_across_runs_and_the_gateway_gets_the_real_values() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path();
        let host = serde_json::json!({
            "numStartups": 2,
            "primaryApiKey": "sk-ant-api03-REALREALREALREAL",
            "mcpServers": {
                "gh": {"url": "https://api.github.example:443/mcp", "headers": {"Authorization": "Bearer ghp_REALTOKEN123", "Accept": "application/json"}},
                "local": {"command": "srv", "env": {"TOKEN": "REALENVTOKEN", "DEBUG": "true"}}
            },
            "projects": {"/p": {"mcpServers": {"x": {"env": {"KEY": "REALPROJECTKEY"}}}}}
        });
        std::fs::write(home.join(".claude.json"), host.to_string()).unwrap();
        let p = corral_policy::profile::profile("claude").unwrap();
        let state = corral_policy::harness::layer_for(
            &p,
            home,
            &home.join("state"),
            corral_policy::plan::Engine::Native,
        );
        std::fs::create_dir_all(state.files[0].copy.parent().unwrap()).unwrap();
        super::super::seed_file(&state.files[0].host, &state.files[0].copy).unwrap();
        let secrets = scrub(&state, true).unwrap();
        let copy = std::fs::read_to_string(&state.files[0].copy).unwrap();
        for real in ["REALREAL", "REALTOKEN", "REALENVTOKEN", "REALPROJECTKEY"] {
            assert!(!copy.contains(real), "{real} in {copy}");
        }
        let copy: Value = serde_json::from_str(&copy).unwrap();
        assert_eq!(copy["numStartups"], 2);
        assert_eq!(copy["mcpServers"]["local"]["env"]["DEBUG"], "true");
        assert_eq!(
            copy["mcpServers"]["gh"]["headers"]["Accept"],
            "application/json"
        );
        let auth = copy["mcpServers"]["gh"]["headers"]["Authorization"]
            .as_str()
            .unwrap();
        assert!(auth.starts_with("Bearer ghp_"), "{auth}");
        let gateway: Vec<(String, String)> = secrets
            .iter()
            .filter_map(StateSecret::for_gateway)
            .map(|(p, real)| (p.hosts[0].to_string(), real))
            .collect();
        assert_eq!(
            gateway,
            vec![
                (
                    "api.anthropic.com".to_string(),
                    "sk-ant-api03-REALREALREALREAL".to_string()
                ),
                (
                    "api.github.example:443".to_string(),
                    "ghp_REALTOKEN123".to_string()
                ),
            ]
        );
        // The env values have no host: placeholders only.
        assert_eq!(secrets.len(), 4);
        // Stable: a second scrub (the jail wrote a value back meanwhile) gives the same ones.
        let mut c = copy.clone();
        c["primaryApiKey"] = Value::String("sk-ant-api03-WRITTENBYJAIL".into());
        std::fs::write(&state.files[0].copy, c.to_string()).unwrap();
        let again = scrub(&state, true).unwrap();
        assert_eq!(
            again.iter().map(|s| &s.placeholder).collect::<Vec<_>>(),
            secrets.iter().map(|s| &s.placeholder).collect::<Vec<_>>()
        );
        let copy2: Value =
            serde_json::from_str(&std::fs::read_to_string(&state.files[0].copy).unwrap()).unwrap();
        assert_eq!(copy2["primaryApiKey"], copy["primaryApiKey"]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(state.layer.join("placeholders.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_url_the_jail_changed_in_the_copy_never_sends_the_real_header_elsewhere() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path();
        let host = serde_json::json!({"mcpServers": {"gh": {
            "url": "https://api.github.example/mcp",
            "headers": {"Authorization": "Bearer ghp_REALTOKEN123"}}}});
        std::fs::write(home.join(".claude.json"), host.to_string()).unwrap();
        let p = corral_policy::profile::profile("claude").unwrap();
        let state = corral_policy::harness::layer_for(
            &p,
            home,
            &home.join("state"),
            corral_policy::plan::Engine::Native,
        );
        std::fs::create_dir_all(state.files[0].copy.parent().unwrap()).unwrap();
        super::super::seed_file(&state.files[0].host, &state.files[0].copy).unwrap();
        scrub(&state, true).unwrap();
        // The jail points the server at its own host.
        let mut copy: Value =
            serde_json::from_str(&std::fs::read_to_string(&state.files[0].copy).unwrap()).unwrap();
        copy["mcpServers"]["gh"]["url"] = Value::String("https://evil.example/x".into());
        std::fs::write(&state.files[0].copy, copy.to_string()).unwrap();
        let secrets = scrub(&state, true).unwrap();
        let hosts: Vec<String> = secrets
            .iter()
            .filter_map(StateSecret::for_gateway)
            .flat_map(|(p, _)| p.hosts.into_iter().map(|h| h.to_string()))
            .collect();
        assert_eq!(hosts, vec!["api.github.example:443".to_string()]);
        // Control: the host's own url decides; had the copy's been used, evil.example.
        assert_eq!(
            fields(&copy)[0].1,
            vec!["evil.example:443".to_string()],
            "the copy names the jail's host"
        );
    }

    #[test]
    fn url_hosts() {
        assert_eq!(
            url_host("https://a.B.com:8443/x?y"),
            Some("a.b.com:8443".into())
        );
        assert_eq!(url_host("https://a.b.com/x"), Some("a.b.com:443".into()));
        assert_eq!(url_host("http://u:p@h.io/"), Some("h.io:80".into()));
        assert_eq!(url_host("https://h.io:notaport/"), None);
        assert_eq!(url_host("stdio"), None);
    }
}
