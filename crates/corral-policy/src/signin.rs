//! `[signin.NAME]`: a harness's sign-in credential file (Claude subscription, ChatGPT, Google)
//! served by the credential gateway. The jail gets a file of the same shape whose tokens are
//! placeholders; the gateway puts the real access token into requests to `api_hosts` and runs
//! the refresh at `token_url` with the real refresh token (crates/corral-gateway/src/signin.rs).
//!
//! Profiles carry the real endpoints; a policy file may replace an entry (a self-hosted or test
//! endpoint). Because an entry decides where the user's refresh token goes, one in a project's
//! own `corral.toml` is a grant that needs `corral trust`.

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
    /// `~/.codex/auth.json`: `tokens.{access_token,refresh_token,id_token}`, `last_refresh`.
    Codex,
    /// `~/.gemini/oauth_creds.json`: `access_token`, `refresh_token`, `expiry_date`.
    Gemini,
}

/// `[signin.NAME]` as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SigninEntry {
    pub format: SigninFormat,
    /// The credential file, `~/`-relative or absolute.
    pub file: Spanned<String>,
    /// Hosts whose requests get the real access token in their credential headers.
    pub api_hosts: Vec<Spanned<String>>,
    /// The OAuth token endpoint (`https://HOST[:PORT]/PATH`) whose refresh requests get the
    /// real refresh token.
    pub token_url: Spanned<String>,
}

/// A sign-in entry, its hosts parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigninSpec {
    pub format: SigninFormat,
    pub file: String,
    pub api_hosts: Vec<DomainPattern>,
    pub token_host: DomainPattern,
    pub token_path: String,
}

/// A sign-in served in a run: what the CLI and the gateway need. Never a token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigninPlan {
    pub name: String,
    pub format: SigninFormat,
    /// The user's credential file (absolute). The jail sees a placeholder file at this path.
    pub file: PathBuf,
    pub api_hosts: Vec<DomainPattern>,
    /// The token endpoint's host (a name, exact, with its port when not 443).
    pub token_host: DomainPattern,
    /// The token endpoint's path (`/v1/oauth/token`).
    pub token_path: String,
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

impl SigninEntry {
    /// Parse the hosts and the token URL, each error at its own entry.
    pub fn resolve(&self, file: &Path, text: &str) -> Result<SigninSpec, PolicyError> {
        let (token_host, token_path) = parse_token_url(self.token_url.get_ref())
            .map_err(|e| PolicyError::at(file, text, self.token_url.span().start, e))?;
        let api_hosts: Vec<DomainPattern> = self
            .api_hosts
            .iter()
            .map(|h| pattern_at(file, text, h))
            .collect::<Result<_, _>>()?;
        if let Some(ip) = api_hosts.iter().find(|h| h.name().is_none()) {
            return Err(PolicyError::at(
                file,
                text,
                self.token_url.span().start,
                format!("api host {ip} is an IP address: the credential gateway serves names only"),
            ));
        }
        let f = self.file.get_ref();
        if !(f.starts_with("~/") || f.starts_with('/')) || f.split('/').any(|c| c == "..") {
            return Err(PolicyError::at(
                file,
                text,
                self.file.span().start,
                format!("file {f:?}: must be ~/-relative or absolute, without `..`"),
            ));
        }
        Ok(SigninSpec {
            format: self.format,
            file: f.clone(),
            api_hosts,
            token_host,
            token_path,
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
        }
    }

    /// What a project file granting this sign-in asks for, for `corral trust`.
    pub fn grant_text(&self, name: &str) -> String {
        let hosts: Vec<String> = self.api_hosts.iter().map(|h| h.to_string()).collect();
        format!(
            "signin.{name} sends your sign-in tokens from {} to {} (refresh at {}{})",
            self.file,
            hosts.join(", "),
            self.token_host,
            self.token_path
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

    #[test]
    fn plan_expands_the_home() {
        let (token_host, token_path) = parse_token_url("https://a.example/t").unwrap();
        let spec = SigninSpec {
            format: SigninFormat::Claude,
            file: "~/.claude/.credentials.json".into(),
            api_hosts: vec![DomainPattern::parse("api.example").unwrap()],
            token_host,
            token_path,
        };
        let p = spec.plan("claude", Path::new("/home/u"));
        assert_eq!(p.file, PathBuf::from("/home/u/.claude/.credentials.json"));
        assert_eq!(p.token_path, "/t");
    }
}
