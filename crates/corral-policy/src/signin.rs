//! `[signin.NAME]`: a harness's sign-in credential file (Claude subscription, ChatGPT, Google)
//! served by the credential gateway. The jail gets a file of the same shape whose tokens are
//! placeholders; the gateway puts the real access token into requests to `api_hosts` and runs
//! the refresh at `token_url` with the real refresh token (crates/corral-gateway/src/signin.rs).
//!
//! Profiles carry the real endpoints; a policy file may replace an entry (a self-hosted or test
//! endpoint). Because an entry decides where the user's refresh token goes, one in a project's
//! own `corral.toml` is a grant that needs `corral trust`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{Spanned, pattern_at};
use crate::domain::DomainPattern;
use crate::error::PolicyError;

/// Which harness's credential file shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SigninFormat {
    /// `~/.claude/.credentials.json`: `claudeAiOauth.{accessToken,refreshToken,expiresAt}`.
    Claude,
    /// `~/.codex/auth.json`: `tokens.{access_token,refresh_token,id_token}`, `last_refresh`;
    /// `OPENAI_API_KEY` for an API-key user (with or without `tokens`).
    Codex,
    /// `~/.gemini/oauth_creds.json`: `access_token`, `refresh_token`, `expiry_date`.
    Gemini,
    /// pi's `~/.pi/agent/auth.json`: a map of provider to `{"type":"oauth","access",
    /// "refresh","expires",...}` or `{"type":"api_key","key"}` (a key starting with `!` is a
    /// shell command pi runs).
    Pi,
    /// opencode's `~/.local/share/opencode/auth.json`: a map of provider to
    /// `{"type":"oauth","access","refresh","expires",...}`, `{"type":"api","key"}` or
    /// `{"type":"wellknown","key","token"}`.
    Opencode,
}

impl SigninFormat {
    /// Whether the file maps provider names to credentials (`[signin.NAME.providers.ID]`),
    /// rather than holding one sign-in (`api_hosts`, `token_url` on the entry).
    pub fn by_provider(self) -> bool {
        match self {
            SigninFormat::Claude | SigninFormat::Codex | SigninFormat::Gemini => false,
            SigninFormat::Pi | SigninFormat::Opencode => true,
        }
    }
}

/// `[signin.NAME]` as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SigninEntry {
    pub format: SigninFormat,
    /// The credential file, `~/`-relative or absolute.
    pub file: Spanned<String>,
    /// Hosts whose requests get the real access token in their credential headers.
    #[serde(default)]
    pub api_hosts: Vec<Spanned<String>>,
    /// The OAuth token endpoint (`https://HOST[:PORT]/PATH`) whose refresh requests get the
    /// real refresh token. Required by the one-sign-in formats; by-provider formats name one
    /// per provider.
    #[serde(default)]
    pub token_url: Option<Spanned<String>>,
    /// Format `codex`: the hosts whose requests get the API key the file holds
    /// (`OPENAI_API_KEY`), and no other host (not `api_hosts`). None: the key is a placeholder
    /// swapped for nothing.
    #[serde(default)]
    pub api_key_hosts: Vec<Spanned<String>>,
    /// By-provider formats: the providers corral serves, by the name the file uses. A
    /// provider not named here keeps placeholders that are never swapped.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderEntry>,
}

/// `[signin.NAME.providers.ID]` as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderEntry {
    /// Hosts whose requests get the provider's real access token or API key.
    pub api_hosts: Vec<Spanned<String>>,
    /// The provider's OAuth token endpoint; none: its refresh token is never sent anywhere.
    #[serde(default)]
    pub token_url: Option<Spanned<String>>,
}

/// One provider of a by-provider sign-in file, its hosts parsed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderPlan {
    /// The provider's name in the file (its top-level key).
    pub id: String,
    pub api_hosts: Vec<DomainPattern>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_host: Option<DomainPattern>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_path: Option<String>,
}

/// A sign-in entry, its hosts parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigninSpec {
    pub format: SigninFormat,
    pub file: String,
    pub api_hosts: Vec<DomainPattern>,
    /// The one-sign-in formats' token endpoint (none for by-provider formats).
    pub token_host: Option<DomainPattern>,
    pub token_path: Option<String>,
    pub api_key_hosts: Vec<DomainPattern>,
    pub providers: Vec<ProviderPlan>,
}

/// A sign-in served in a run: what the CLI and the gateway need. Never a token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigninPlan {
    pub name: String,
    pub format: SigninFormat,
    /// The user's credential file (absolute). The jail sees a placeholder file at this path.
    pub file: PathBuf,
    pub api_hosts: Vec<DomainPattern>,
    /// The token endpoint's host (a name, exact, with its port when not 443); none for
    /// by-provider formats (each provider names its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_host: Option<DomainPattern>,
    /// The token endpoint's path (`/v1/oauth/token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_path: Option<String>,
    /// Format `codex`: where the file's API key (`OPENAI_API_KEY`) may go, and nowhere else.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_key_hosts: Vec<DomainPattern>,
    /// By-provider formats: the providers served, by their name in the file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderPlan>,
}

/// Split `https://HOST[:PORT]/PATH` into an exact host pattern and the path.
pub fn parse_token_url(url: &str) -> Result<(DomainPattern, String), String> {
    let bad = |why: &str| format!("token_url {url:?}: {why}");
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| bad("must start with https:// (the refresh token never goes in clear)"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => return Err(bad("needs a path (https://HOST/PATH)")),
    };
    if path.contains(['?', '#']) || path.bytes().any(|b| !(0x21..=0x7e).contains(&b)) {
        return Err(bad(
            "the path may not hold a query, a fragment, spaces or controls",
        ));
    }
    let host = DomainPattern::parse(authority).map_err(|e| bad(&e.to_string()))?;
    if host.is_wildcard() || host.name().is_none() {
        return Err(bad(
            "the host must be one name, not a wildcard or an IP address",
        ));
    }
    Ok((host, path.to_string()))
}

/// The hosts of `hosts`, each a name (the gateway serves names only).
fn api_hosts_at(
    file: &Path,
    text: &str,
    hosts: &[Spanned<String>],
) -> Result<Vec<DomainPattern>, PolicyError> {
    let parsed: Vec<DomainPattern> = hosts
        .iter()
        .map(|h| pattern_at(file, text, h))
        .collect::<Result<_, _>>()?;
    if let Some((h, p)) = hosts.iter().zip(&parsed).find(|(_, p)| p.name().is_none()) {
        return Err(PolicyError::at(
            file,
            text,
            h.span().start,
            format!("api host {p} is an IP address: the credential gateway serves names only"),
        ));
    }
    Ok(parsed)
}

fn token_url_at(
    file: &Path,
    text: &str,
    url: &Spanned<String>,
) -> Result<(DomainPattern, String), PolicyError> {
    parse_token_url(url.get_ref()).map_err(|e| PolicyError::at(file, text, url.span().start, e))
}

impl SigninEntry {
    /// Parse the hosts and the token URL, each error at its own entry.
    pub fn resolve(&self, file: &Path, text: &str) -> Result<SigninSpec, PolicyError> {
        let at_file = |why: String| PolicyError::at(file, text, self.file.span().start, why);
        let (token_host, token_path, providers) = if self.format.by_provider() {
            if self.token_url.is_some() || !self.api_hosts.is_empty() {
                return Err(at_file(format!(
                    "format {:?} maps providers to credentials: name api_hosts and token_url \
                     per provider ([signin.NAME.providers.ID])",
                    self.format
                )));
            }
            let mut providers = Vec::new();
            for (id, p) in &self.providers {
                let token = p
                    .token_url
                    .as_ref()
                    .map(|u| token_url_at(file, text, u))
                    .transpose()?;
                providers.push(ProviderPlan {
                    id: id.clone(),
                    api_hosts: api_hosts_at(file, text, &p.api_hosts)?,
                    token_host: token.as_ref().map(|t| t.0.clone()),
                    token_path: token.map(|t| t.1),
                });
            }
            (None, None, providers)
        } else {
            if !self.providers.is_empty() {
                return Err(at_file(format!(
                    "format {:?} holds one sign-in: providers are for by-provider formats (pi, opencode)",
                    self.format
                )));
            }
            let url = self
                .token_url
                .as_ref()
                .ok_or_else(|| at_file(format!("format {:?} needs a token_url", self.format)))?;
            let (h, p) = token_url_at(file, text, url)?;
            (Some(h), Some(p), Vec::new())
        };
        let api_hosts = api_hosts_at(file, text, &self.api_hosts)?;
        if !self.api_key_hosts.is_empty() && self.format != SigninFormat::Codex {
            return Err(at_file(format!(
                "format {:?} holds no API key: api_key_hosts is for format \"codex\"",
                self.format
            )));
        }
        let api_key_hosts = api_hosts_at(file, text, &self.api_key_hosts)?;
        let f = self.file.get_ref();
        if !(f.starts_with("~/") || f.starts_with('/')) || f.split('/').any(|c| c == "..") {
            return Err(at_file(format!(
                "file {f:?}: must be ~/-relative or absolute, without `..`"
            )));
        }
        Ok(SigninSpec {
            format: self.format,
            file: f.clone(),
            api_hosts,
            token_host,
            token_path,
            api_key_hosts,
            providers,
        })
    }
}

impl SigninSpec {
    /// The plan entry for sign-in `name`, `~/` expanded against `home`.
    pub fn plan(&self, name: &str, home: &Path) -> SigninPlan {
        let file = match self.file.strip_prefix("~/") {
            Some(rel) => home.join(rel),
            None => PathBuf::from(&self.file),
        };
        SigninPlan {
            name: name.to_string(),
            format: self.format,
            file,
            api_hosts: self.api_hosts.clone(),
            token_host: self.token_host.clone(),
            token_path: self.token_path.clone(),
            api_key_hosts: self.api_key_hosts.clone(),
            providers: self.providers.clone(),
        }
    }

    /// What a project file granting this sign-in asks for, for `corral trust`.
    pub fn grant_text(&self, name: &str) -> String {
        let sends = |hosts: &[DomainPattern], token: Option<(&DomainPattern, &String)>| {
            let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
            let refresh = match token {
                Some((h, p)) => format!("refresh at {h}{p}"),
                None => "no refresh".to_string(),
            };
            format!("{} ({refresh})", hosts.join(", "))
        };
        if !self.format.by_provider() {
            let token = self.token_host.as_ref().zip(self.token_path.as_ref());
            let key = if self.api_key_hosts.is_empty() {
                String::new()
            } else {
                let hosts: Vec<String> = self.api_key_hosts.iter().map(|h| h.to_string()).collect();
                format!("; its API key to {}", hosts.join(", "))
            };
            return format!(
                "signin.{name} sends your sign-in tokens from {} to {}{key}",
                self.file,
                sends(&self.api_hosts, token)
            );
        }
        let each: Vec<String> = self
            .providers
            .iter()
            .map(|p| {
                let token = p.token_host.as_ref().zip(p.token_path.as_ref());
                format!("{}: {}", p.id, sends(&p.api_hosts, token))
            })
            .collect();
        format!(
            "signin.{name} sends your sign-in tokens from {} to {}",
            self.file,
            each.join("; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_urls_are_https_names_with_a_path() {
        let (h, p) = parse_token_url("https://platform.claude.com/v1/oauth/token").unwrap();
        assert_eq!(
            (h.to_string(), p.as_str()),
            ("platform.claude.com".into(), "/v1/oauth/token")
        );
        let (h, _) = parse_token_url("https://mock.test:8443/t").unwrap();
        assert_eq!(h.port(), Some(8443));
        for bad in [
            "http://platform.claude.com/v1/oauth/token",
            "https://platform.claude.com",
            "https://*.claude.com/token",
            "https://127.0.0.1/token",
            "https://a.example/token?x=1",
        ] {
            assert!(parse_token_url(bad).is_err(), "{bad}");
        }
    }

    fn entry(toml_text: &str) -> Result<SigninSpec, String> {
        let e: SigninEntry = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        e.resolve(Path::new("corral.toml"), toml_text)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn by_provider_entries_name_hosts_per_provider_and_one_sign_in_entries_on_the_entry() {
        let spec = entry(
            "format = \"pi\"\nfile = \"~/.pi/agent/auth.json\"\n\
             [providers.anthropic]\napi_hosts = [\"api.anthropic.com\"]\n\
             token_url = \"https://platform.claude.com/v1/oauth/token\"\n\
             [providers.openai]\napi_hosts = [\"api.openai.com\"]\n",
        )
        .unwrap();
        assert_eq!(spec.token_host, None);
        let ids: Vec<(&str, Option<&str>)> = spec
            .providers
            .iter()
            .map(|p| (p.id.as_str(), p.token_path.as_deref()))
            .collect();
        assert_eq!(
            ids,
            vec![("anthropic", Some("/v1/oauth/token")), ("openai", None)]
        );
        for (bad, why) in [
            (
                "format = \"pi\"\nfile = \"~/a\"\ntoken_url = \"https://a.example/t\"\n",
                "per provider",
            ),
            (
                "format = \"opencode\"\nfile = \"~/a\"\napi_hosts = [\"a.example\"]\n",
                "per provider",
            ),
            (
                "format = \"claude\"\nfile = \"~/a\"\napi_hosts = []\n",
                "needs a token_url",
            ),
            (
                "format = \"claude\"\nfile = \"~/a\"\ntoken_url = \"https://a.example/t\"\n\
                 [providers.x]\napi_hosts = []\n",
                "by-provider formats",
            ),
            (
                "format = \"pi\"\nfile = \"~/a\"\n[providers.x]\napi_hosts = [\"127.0.0.1\"]\n",
                "IP address",
            ),
            (
                "format = \"pi\"\nfile = \"~/a\"\n[providers.x]\napi_hosts = []\n\
                 token_url = \"http://a.example/t\"\n",
                "https://",
            ),
            (
                "format = \"pi\"\nfile = \"~/a\"\n[providers.x]\napi_hosts = []\nhost = \"a\"\n",
                "unknown field",
            ),
            (
                "format = \"claude\"\nfile = \"~/a\"\ntoken_url = \"https://a.example/t\"\n\
                 api_key_hosts = [\"a.example\"]\n",
                "api_key_hosts is for format",
            ),
            (
                "format = \"codex\"\nfile = \"~/a\"\ntoken_url = \"https://a.example/t\"\n\
                 api_key_hosts = [\"10.0.0.1\"]\n",
                "IP address",
            ),
        ] {
            let e = entry(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_codex_entry_names_where_its_api_key_goes_apart_from_its_sign_in_hosts() {
        let spec = entry(
            "format = \"codex\"\nfile = \"~/.codex/auth.json\"\napi_hosts = [\"chatgpt.com\"]\n\
             token_url = \"https://auth.openai.com/oauth/token\"\napi_key_hosts = [\"api.openai.com\"]\n",
        )
        .unwrap();
        let keys: Vec<String> = spec.api_key_hosts.iter().map(|h| h.to_string()).collect();
        assert_eq!(keys, ["api.openai.com"]);
        assert!(
            spec.grant_text("codex")
                .ends_with("chatgpt.com (refresh at auth.openai.com/oauth/token); its API key to api.openai.com"),
            "{}",
            spec.grant_text("codex")
        );
    }

    #[test]
    fn plan_expands_the_home() {
        let (token_host, token_path) = parse_token_url("https://a.example/t").unwrap();
        let spec = SigninSpec {
            format: SigninFormat::Claude,
            file: "~/.claude/.credentials.json".into(),
            api_hosts: vec![DomainPattern::parse("api.example").unwrap()],
            token_host: Some(token_host),
            token_path: Some(token_path),
            api_key_hosts: vec![],
            providers: vec![],
        };
        let p = spec.plan("claude", Path::new("/home/u"));
        assert_eq!(p.file, PathBuf::from("/home/u/.claude/.credentials.json"));
        assert_eq!(p.token_path.as_deref(), Some("/t"));
    }
}
