//! Sign-in credential files: the jail holds placeholders, corral holds the real tokens.
//!
//! A harness signed in with a subscription (Claude Code's `~/.claude/.credentials.json`, Codex's
//! `~/.codex/auth.json`, Gemini CLI's `~/.gemini/oauth_creds.json`) keeps an OAuth access token
//! and a refresh token in its state directory. For each such file corral:
//!
//! - reads it on the host and gives the jail a file of the same shape
//!   ([`Signin::placeholder_file`]) where every token is a placeholder of the same shape
//!   (opaque tokens via [`crate::placeholder_for`]; a JWT keeps its readable header and claims,
//!   its signature is replaced, so it parses but verifies nowhere);
//! - puts the real access token into credential headers of requests to the sign-in's API hosts
//!   (over TLS only) instead of the placeholder ([`swap_access`]);
//! - on a refresh request to the token endpoint puts the real refresh token into the body
//!   ([`Signin::swap_refresh`]), takes the new tokens out of the answer, keeps them, and hands
//!   the jail new placeholders in their place ([`Signin::take_response`]);
//! - writes the new real tokens back into the user's file ([`Signin::write_back`]): under a
//!   lock on its directory, re-read first, only if the host's harness did not refresh meanwhile,
//!   every other field kept (`scopes`, `subscriptionType`, ...), rewritten in place (same
//!   inode and mode, fsynced; never renamed over, which would detach the jail's bind of its
//!   placeholder file over this path).
//!
//! pi's and opencode's `auth.json` map providers to credentials (OAuth sign-ins and API keys):
//! each credential is a [`Slot`] of its provider, swapped only to that provider's hosts
//! (`[signin.NAME.providers.ID]`), its refresh only at that provider's token endpoint, its
//! write-back only into that provider's OAuth fields.
//!
//! A credential the file itself ties to hosts of its own is a [`TokenKind::Bound`] slot that
//! carries those hosts ([`Slot::hosts`]), not the entry's: Codex's `OPENAI_API_KEY` (to the
//! entry's `api_key_hosts`, never to its `api_hosts`), and each remote MCP server's OAuth access
//! token in Claude Code's file (`mcpOAuth.*.accessToken`, to its `serverUrl`'s host only). It is
//! swapped into requests to those hosts only, never refreshed, never written back.
//!
//! In every format, a value that looks like a secret ([`crate::secret_like`]) where the format
//! holds none corral knows, or of a provider the entry does not name, is a
//! [`TokenKind::Opaque`] placeholder: swapped for nothing.
//!
//! Every real token corral ever held for the run (current and replaced ones) stays in the
//! scrubber, so no answer from a bound host shows one to the jail.
//!
//! Refresh tokens rotate: exactly one party may refresh at a time. Before it swaps a refresh,
//! corral re-reads the user's file and adopts tokens a host-side refresh (or another corral run)
//! wrote there; the placeholders the jail holds keep working.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use corral_policy::domain::{DomainPattern, Host};
use corral_policy::signin::{SigninFormat, SigninPlan};
use serde_json::Value;

use crate::encodings::{json_escaped, percent_encode};
use crate::secret_like::looks_like_secret;
use crate::{CREDENTIAL_HEADERS, Header, RewriteReport, contains, placeholder_for, replace};

/// Largest credential file, refresh request body, or token response corral reads.
pub const MAX_SIGNIN_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SigninError {
    #[error("sign-in {name}: {step} {path}: {source}")]
    Io {
        name: String,
        step: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("sign-in {name}: {path} is not a {format:?} credential file: {reason}")]
    Shape {
        name: String,
        path: PathBuf,
        format: SigninFormat,
        reason: String,
    },
    #[error("sign-in {name}: the token endpoint's answer is not a token response: {reason}")]
    Response { name: String, reason: String },
    #[error(
        "sign-in {name}: {path} was changed since corral read it (a refresh on the host?): corral's new tokens were not written there"
    )]
    Changed { name: String, path: PathBuf },
    #[error(
        "sign-in {name}: the refresh carried no refresh token of this run (the jail's own?): its tokens were not written to {path}"
    )]
    Foreign { name: String, path: PathBuf },
    #[error("sign-in {name}: making placeholders: {reason}")]
    Placeholder { name: String, reason: String },
    #[error("sign-in {name}: the tokens handed to the gateway: {reason}")]
    Handover { name: String, reason: String },
}

/// One kind of credential in a credential file and in a token response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenKind {
    Access,
    Refresh,
    Id,
    /// An API key, swapped like an access token.
    Key,
    /// A credential swapped only into requests to the hosts its own [`Slot`] carries (the file
    /// says where it goes): never refreshed, never written.
    Bound,
    /// A value that looks like a secret ([`crate::secret_like`]) where corral knows no use for
    /// one: a placeholder in the jail, never swapped for anything, never written.
    Opaque,
}

impl TokenKind {
    /// The field of an OAuth token response.
    fn response_field(self) -> Option<&'static str> {
        match self {
            TokenKind::Access => Some("access_token"),
            TokenKind::Refresh => Some("refresh_token"),
            TokenKind::Id => Some("id_token"),
            TokenKind::Key | TokenKind::Bound | TokenKind::Opaque => None,
        }
    }
}

/// Where one credential sits in the user's file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Slot {
    /// The provider it belongs to (by-provider formats: the file's top-level key); none for the
    /// one-sign-in formats.
    pub provider: Option<String>,
    pub kind: TokenKind,
    /// Its JSON pointer; empty for a token the file does not hold (an `id_token` a by-provider
    /// file has no place for).
    pub ptr: String,
    /// A [`TokenKind::Bound`] credential's own hosts: the only ones it is swapped for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<DomainPattern>,
}

/// The refresh a token request was found to be (see [`Signin::swap_refresh`]): whose tokens the
/// answer replaces and whose entry of the file the write-back rewrites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refreshing {
    provider: Option<String>,
    /// Whether the request carried this run's placeholder refresh token (swapped for the real
    /// one). A refresh with any other token is the jail's own: its answer is never written to
    /// the user's file (the host's harness would then use whatever account the jail chose).
    carried: bool,
}

impl Refreshing {
    /// The provider refreshed (by-provider formats).
    pub fn provider(&self) -> Option<&str> {
        self.provider.as_deref()
    }

    /// A refresh of `provider`'s tokens with this run's refresh token, as
    /// [`Signin::swap_refresh`] finds one (for checks that drive [`Signin::take_response`]
    /// without a request).
    pub fn of(provider: Option<&str>) -> Refreshing {
        Refreshing {
            provider: provider.map(str::to_string),
            carried: true,
        }
    }
}

/// When the token expires, as the file says it.
#[derive(Debug, Clone)]
enum Expiry {
    /// Milliseconds since the epoch at this pointer, from the response's `expires_in`, less a
    /// margin (pi and opencode refresh a little early; corral writes what they would).
    MillisAt(String, u64),
    /// The time of the refresh, RFC 3339, at this pointer.
    RefreshedAt(&'static str),
}

/// Where a one-sign-in format keeps its tokens (JSON pointers).
fn fixed_layout(format: SigninFormat) -> Option<(&'static [(TokenKind, &'static str)], Expiry)> {
    match format {
        SigninFormat::Claude => Some((
            &[
                (TokenKind::Access, "/claudeAiOauth/accessToken"),
                (TokenKind::Refresh, "/claudeAiOauth/refreshToken"),
            ],
            Expiry::MillisAt("/claudeAiOauth/expiresAt".into(), 0),
        )),
        SigninFormat::Codex => Some((
            &[
                (TokenKind::Access, "/tokens/access_token"),
                (TokenKind::Refresh, "/tokens/refresh_token"),
                (TokenKind::Id, "/tokens/id_token"),
            ],
            Expiry::RefreshedAt("/last_refresh"),
        )),
        SigninFormat::Gemini => Some((
            &[
                (TokenKind::Access, "/access_token"),
                (TokenKind::Refresh, "/refresh_token"),
                (TokenKind::Id, "/id_token"),
            ],
            Expiry::MillisAt("/expiry_date".into(), 0),
        )),
        SigninFormat::Pi | SigninFormat::Opencode => None,
    }
}

/// How much earlier than the token endpoint said pi and opencode note an expiry (pi-ai's
/// anthropic.js: `expires_in * 1000 - 5 * 60 * 1000`).
const BY_PROVIDER_EXPIRY_MARGIN_MS: u64 = 5 * 60 * 1000;

/// Where the OAuth tokens of `provider` sit, and the expiry: the fixed layout of a one-sign-in
/// format (no provider), or `/ID/access`, `/ID/refresh`, `/ID/expires` of a by-provider one.
fn oauth_layout(
    format: SigninFormat,
    provider: Option<&str>,
) -> Result<(Vec<(TokenKind, String)>, Expiry), String> {
    match (fixed_layout(format), provider) {
        (Some((fields, expiry)), None) => Ok((
            fields.iter().map(|(k, p)| (*k, p.to_string())).collect(),
            expiry,
        )),
        (None, Some(id)) => {
            let base = format!("/{}", pointer_escape(id));
            Ok((
                vec![
                    (TokenKind::Access, format!("{base}/access")),
                    (TokenKind::Refresh, format!("{base}/refresh")),
                ],
                Expiry::MillisAt(format!("{base}/expires"), BY_PROVIDER_EXPIRY_MARGIN_MS),
            ))
        }
        _ => Err(format!(
            "format {format:?} and provider {provider:?} do not go together"
        )),
    }
}

/// A JSON pointer's reference token for `key` (RFC 6901: `~` and `/` escaped).
fn pointer_escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// A real token and the placeholder the jail holds for it.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Pair {
    real: String,
    ph: String,
}

/// A sign-in's tokens as corral read them on the host (each real token with the placeholder the
/// jail's file holds), handed to a gateway in another process (the container backends' gateway
/// proxy, through its 0600 secrets file) with [`Signin::tokens`] and [`Signin::from_tokens`].
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SigninTokens {
    tokens: Vec<(Slot, Pair)>,
}

impl std::fmt::Debug for SigninTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds: Vec<TokenKind> = self.tokens.iter().map(|(s, _)| s.kind).collect();
        f.debug_struct("SigninTokens")
            .field("kinds", &kinds)
            .field("values", &"<redacted>")
            .finish()
    }
}

/// How a gateway reaches the user's credential file: directly (corral's own process, the
/// native backend), or through the corral process on the host ([`crate::signin_remote`]: a
/// gateway proxy container, which has no access to the user's files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileAccess {
    Local,
    /// The Unix socket corral serves on the host for this run.
    Remote(PathBuf),
}

/// The sign-in's tokens: the real ones in use, the ones they replaced, and the refresh token
/// last seen in the user's file for each provider.
struct TokenState {
    current: Vec<(Slot, Pair)>,
    /// Tokens replaced by a refresh or adopted from the file: still scrubbed from answers.
    retired: Vec<Pair>,
    /// The refresh token of each provider in the user's file when corral last read or wrote it.
    on_disk_refresh: Vec<(Option<String>, String)>,
}

impl TokenState {
    fn new(current: Vec<(Slot, Pair)>) -> TokenState {
        let on_disk_refresh = current
            .iter()
            .filter(|(s, _)| s.kind == TokenKind::Refresh)
            .map(|(s, p)| (s.provider.clone(), p.real.clone()))
            .collect();
        TokenState {
            current,
            retired: Vec::new(),
            on_disk_refresh,
        }
    }

    fn on_disk(&self, provider: &Option<String>) -> Option<&str> {
        self.on_disk_refresh
            .iter()
            .find(|(p, _)| p == provider)
            .map(|(_, r)| r.as_str())
    }

    /// Keep a token of a refresh's answer for `slot`; the placeholder the jail gets for it. A
    /// token of a refresh that did not carry this run's refresh token is only scrubbed from
    /// answers: never used in a request or written to the user's file (a later refresh with its
    /// placeholder would otherwise carry it into the file as this run's).
    fn keep(&mut self, carried: bool, slot: Slot, new: Pair) -> String {
        if !carried {
            let ph = new.ph.clone();
            self.retired.push(new);
            return ph;
        }
        match self
            .current
            .iter_mut()
            .find(|(s, _)| s.kind == slot.kind && s.provider == slot.provider)
        {
            // Unchanged (a refresh token that does not rotate): same placeholder.
            Some((_, p)) if p.real == new.real => p.ph.clone(),
            Some((_, p)) => {
                self.retired.push(std::mem::replace(p, new.clone()));
                new.ph
            }
            None => {
                let ph = new.ph.clone();
                self.current.push((slot, new));
                ph
            }
        }
    }

    fn set_on_disk(&mut self, provider: &Option<String>, refresh: String) {
        match self.on_disk_refresh.iter_mut().find(|(p, _)| p == provider) {
            Some((_, r)) => *r = refresh,
            None => self.on_disk_refresh.push((provider.clone(), refresh)),
        }
    }
}

/// One harness's sign-in file, served for one run.
pub struct Signin {
    plan: SigninPlan,
    state: Mutex<TokenState>,
    file: FileAccess,
}

impl std::fmt::Debug for Signin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signin")
            .field("plan", &self.plan)
            .field("tokens", &"<redacted>")
            .finish()
    }
}

/// Where one provider's (or a one-sign-in file's) credentials may go.
struct Endpoint<'a> {
    api_hosts: &'a [DomainPattern],
    token: Option<(&'a DomainPattern, &'a str)>,
}

impl Endpoint<'_> {
    fn binds(&self, host: &Host, port: u16) -> bool {
        self.token.is_some_and(|(h, _)| h.matches(host, port))
            || self.api_hosts.iter().any(|p| p.matches(host, port))
    }

    fn is_token_request(&self, host: &Host, port: u16, target: &str) -> bool {
        self.token.is_some_and(|(h, path)| {
            h.matches(host, port) && crate::path_without_query(target) == path
        })
    }
}

/// A placeholder shaped like `real`: a JWT keeps its header and claims (harnesses read them),
/// its signature is replaced; any other token gets [`placeholder_for`].
pub fn token_placeholder(real: &str) -> Result<String, String> {
    let parts: Vec<&str> = real.split('.').collect();
    if parts.len() == 3 && parts[0].starts_with("eyJ") && parts[2].len() >= 16 {
        let sig = placeholder_for(parts[2]).map_err(|e| e.to_string())?;
        return Ok(format!("{}.{}.{sig}", parts[0], parts[1]));
    }
    placeholder_for(real).map_err(|e| e.to_string())
}

fn now_millis(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The host an `https://` URL names, as an exact pattern with its port (443 unless given); none
/// for any other scheme, an IP address, a wildcard or credentials in the authority.
fn https_host(url: &str) -> Option<DomainPattern> {
    let scheme = url.get(..8)?;
    if !scheme.eq_ignore_ascii_case("https://") {
        return None;
    }
    let authority = url[8..].split(['/', '?', '#']).next()?;
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let (Host::Name(name), port) = corral_policy::domain::parse_authority(authority).ok()? else {
        return None;
    };
    let p = DomainPattern::parse(&format!("{name}:{}", port.unwrap_or(443))).ok()?;
    (!p.is_wildcard() && p.name() == Some(name.as_str())).then_some(p)
}

/// The credentials a file ties to hosts of its own ([`TokenKind::Bound`]): Codex's API key (to
/// the entry's `api_key_hosts`), each remote MCP server's access token in Claude Code's file (to
/// its `serverUrl`'s host).
fn bound_slots(plan: &SigninPlan, v: &Value) -> Vec<(Slot, String)> {
    let bound = |ptr: String, hosts: Vec<DomainPattern>| Slot {
        provider: None,
        kind: TokenKind::Bound,
        ptr,
        hosts,
    };
    let mut out = Vec::new();
    match plan.format {
        SigninFormat::Codex if !plan.api_key_hosts.is_empty() => {
            if let Some(Value::String(k)) = v.get("OPENAI_API_KEY")
                && looks_like_secret("OPENAI_API_KEY", k)
            {
                out.push((
                    bound("/OPENAI_API_KEY".into(), plan.api_key_hosts.clone()),
                    k.clone(),
                ));
            }
        }
        SigninFormat::Claude => {
            let Some(Value::Object(servers)) = v.get("mcpOAuth") else {
                return out;
            };
            for (id, entry) in servers {
                let host = entry
                    .get("serverUrl")
                    .and_then(Value::as_str)
                    .and_then(https_host);
                if let (Some(host), Some(Value::String(token))) = (host, entry.get("accessToken"))
                    && !token.is_empty()
                {
                    let ptr = format!("/mcpOAuth/{}/accessToken", pointer_escape(id));
                    out.push((bound(ptr, vec![host]), token.clone()));
                }
            }
        }
        _ => {}
    }
    out
}

/// The credentials of a sign-in file (see the module docs): the format's tokens where it keeps
/// them, the credentials it ties to hosts of their own ([`bound_slots`]), then every other
/// string that looks like a secret ([`Slot`]s of kind [`TokenKind::Opaque`]).
fn slots_in(plan: &SigninPlan, v: &Value) -> Result<Vec<(Slot, String)>, String> {
    let mut out: Vec<(Slot, String)> = Vec::new();
    let slot = |provider: Option<&str>, kind, ptr: &str| Slot {
        provider: provider.map(str::to_string),
        kind,
        ptr: ptr.to_string(),
        hosts: Vec::new(),
    };
    if let Some((fields, _)) = fixed_layout(plan.format) {
        // A file with no sign-in at all (`tokens` or `claudeAiOauth` absent or null) is served
        // with what it holds: an API-key Codex user, a Claude Code user with an API key and
        // remote MCP servers (or only a stale entry of one). Half a sign-in is refused.
        let parent = |ptr: &str| ptr.rsplit_once('/').map(|(p, _)| p.to_string());
        let no_sign_in = fields.iter().all(|(_, ptr)| {
            matches!(
                parent(ptr).filter(|p| !p.is_empty()).map(|p| v.pointer(&p)),
                Some(None | Some(Value::Null))
            )
        });
        if !no_sign_in {
            for (kind, ptr) in fields {
                match v.pointer(ptr) {
                    Some(Value::String(s)) if !s.is_empty() => {
                        out.push((slot(None, *kind, ptr), s.clone()))
                    }
                    None | Some(Value::Null) if *kind == TokenKind::Id => {}
                    _ => return Err(format!("no token at {ptr}")),
                }
            }
        }
        out.extend(bound_slots(plan, v));
    } else {
        let Value::Object(map) = v else {
            return Err("not a JSON object of providers".into());
        };
        for (id, entry) in map {
            if !plan.providers.iter().any(|p| &p.id == id) {
                continue;
            }
            let base = format!("/{}", pointer_escape(id));
            let text = |field: &str| match entry.get(field) {
                Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
                _ => None,
            };
            let api_key = match plan.format {
                SigninFormat::Pi => "api_key",
                _ => "api",
            };
            match entry.get("type").and_then(Value::as_str) {
                Some("oauth") => {
                    if let (Some(a), Some(r)) = (text("access"), text("refresh")) {
                        out.push((
                            slot(Some(id), TokenKind::Access, &format!("{base}/access")),
                            a,
                        ));
                        out.push((
                            slot(Some(id), TokenKind::Refresh, &format!("{base}/refresh")),
                            r,
                        ));
                    }
                }
                Some(t) if t == api_key => {
                    // A `!command` or a variable's name is kept as it is (the rule's exceptions).
                    if let Some(k) = text("key").filter(|k| looks_like_secret("key", k)) {
                        out.push((slot(Some(id), TokenKind::Key, &format!("{base}/key")), k));
                    }
                }
                _ => {}
            }
        }
    }
    let by_provider = plan.format.by_provider();
    let mut opaque = Vec::new();
    unknown_secrets(v, "", "", &out, &mut opaque);
    for (ptr, real) in opaque {
        let provider = by_provider
            .then(|| {
                ptr.split('/')
                    .nth(1)
                    .map(|p| p.replace("~1", "/").replace("~0", "~"))
            })
            .flatten();
        out.push((slot(provider.as_deref(), TokenKind::Opaque, &ptr), real));
    }
    Ok(out)
}

/// Every string under `v` (at pointer `ptr`, in the field `name`) that looks like a secret and
/// is not one of `known`.
fn unknown_secrets(
    v: &Value,
    ptr: &str,
    name: &str,
    known: &[(Slot, String)],
    out: &mut Vec<(String, String)>,
) {
    match v {
        Value::String(s) => {
            if looks_like_secret(name, s) && !known.iter().any(|(k, _)| k.ptr == ptr) {
                out.push((ptr.to_string(), s.clone()));
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                unknown_secrets(item, &format!("{ptr}/{i}"), name, known, out);
            }
        }
        Value::Object(map) => {
            for (k, item) in map {
                unknown_secrets(item, &format!("{ptr}/{}", pointer_escape(k)), k, known, out);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// The first field of `v` that may carry a token corral does not take out of a token response:
/// a key naming a token (`accessToken`, `tokens`, `id-token`, ...) with a string, object or
/// array value anywhere but the top-level `access_token`, `refresh_token` and `id_token`, or one
/// of those three neither a string nor null. Such an
/// answer is refused whole: a token corral cannot replace must never reach the jail.
pub(crate) fn stray_token_field(v: &Value, top: bool) -> Option<String> {
    match v {
        Value::Object(map) => map.iter().find_map(|(k, val)| {
            let norm: String = k
                .chars()
                .filter(|c| !matches!(c, '_' | '-' | '.' | ' '))
                .flat_map(char::to_lowercase)
                .collect();
            let taken = top && matches!(k.as_str(), "access_token" | "refresh_token" | "id_token");
            // A number, a boolean or null carries no token (`refresh_token_expires_in`).
            let inert = matches!(val, Value::Number(_) | Value::Bool(_) | Value::Null);
            if taken {
                return (!val.is_string() && !val.is_null()).then(|| k.clone());
            }
            if norm.contains("token") && norm != "tokentype" && !inert {
                return Some(k.clone());
            }
            stray_token_field(val, false)
        }),
        Value::Array(items) => items.iter().find_map(|i| stray_token_field(i, false)),
        _ => None,
    }
}

fn set_at(v: &mut Value, ptr: &str, to: Value) {
    if ptr.is_empty() {
        return;
    }
    if let Some(slot) = v.pointer_mut(ptr) {
        *slot = to;
    }
}

fn pairs_of(
    plan: &SigninPlan,
    found: Vec<(Slot, String)>,
) -> Result<Vec<(Slot, Pair)>, SigninError> {
    found
        .into_iter()
        .map(|(slot, real)| {
            let ph = token_placeholder(&real).map_err(|reason| SigninError::Placeholder {
                name: plan.name.clone(),
                reason,
            })?;
            Ok((slot, Pair { real, ph }))
        })
        .collect()
}

impl Signin {
    /// Read the user's credential file. `Ok(None)` when it does not exist (not signed in).
    pub fn load(plan: SigninPlan) -> Result<Option<Signin>, SigninError> {
        let text = match read_capped(&plan.file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(plan_io(&plan, "reading", source)),
        };
        let shape = |reason: String| SigninError::Shape {
            name: plan.name.clone(),
            path: plan.file.clone(),
            format: plan.format,
            reason,
        };
        let v: Value = serde_json::from_slice(&text).map_err(|e| shape(e.to_string()))?;
        let found = slots_in(&plan, &v).map_err(shape)?;
        let current = pairs_of(&plan, found)?;
        Ok(Some(Signin {
            plan,
            state: Mutex::new(TokenState::new(current)),
            file: FileAccess::Local,
        }))
    }

    /// The tokens read by [`Signin::load`] (real, with their placeholders), for a gateway in
    /// another process.
    pub fn tokens(&self) -> SigninTokens {
        SigninTokens {
            tokens: self.state().current.clone(),
        }
    }

    /// The sign-in another process loaded ([`Signin::tokens`]), served here; the user's file
    /// is reached through `file`.
    pub fn from_tokens(
        plan: SigninPlan,
        tokens: SigninTokens,
        file: FileAccess,
    ) -> Result<Signin, SigninError> {
        let has = |k| {
            tokens
                .tokens
                .iter()
                .any(|(s, _)| s.kind == k && s.provider.is_none())
        };
        // A one-sign-in file holds both tokens or neither (an API-key user's file).
        if !plan.format.by_provider() && has(TokenKind::Access) != has(TokenKind::Refresh) {
            return Err(SigninError::Handover {
                name: plan.name.clone(),
                reason: "an access token without a refresh token, or the reverse".into(),
            });
        }
        Ok(Signin {
            plan,
            state: Mutex::new(TokenState::new(tokens.tokens)),
            file,
        })
    }

    pub fn plan(&self) -> &SigninPlan {
        &self.plan
    }

    fn state(&self) -> std::sync::MutexGuard<'_, TokenState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where the credentials of `provider` may go: the entry's hosts (one-sign-in formats, no
    /// provider) or the provider's; none for a provider the entry does not name.
    fn endpoint(&self, provider: Option<&str>) -> Option<Endpoint<'_>> {
        let p = &self.plan;
        match provider {
            None if !p.format.by_provider() => Some(Endpoint {
                api_hosts: &p.api_hosts,
                token: p.token_host.as_ref().zip(p.token_path.as_deref()),
            }),
            None => None,
            Some(id) => p.providers.iter().find(|q| q.id == id).map(|q| Endpoint {
                api_hosts: &q.api_hosts,
                token: q.token_host.as_ref().zip(q.token_path.as_deref()),
            }),
        }
    }

    fn endpoints(&self) -> Vec<Endpoint<'_>> {
        std::iter::once(self.endpoint(None))
            .chain(
                self.plan
                    .providers
                    .iter()
                    .map(|q| self.endpoint(Some(&q.id))),
            )
            .flatten()
            .collect()
    }

    /// The jail's copy of the user's file: the same JSON, every credential a placeholder.
    pub fn placeholder_file(&self) -> Result<Vec<u8>, SigninError> {
        let text = read_capped(&self.plan.file).map_err(|e| plan_io(&self.plan, "reading", e))?;
        let mut v: Value = serde_json::from_slice(&text).map_err(|e| SigninError::Shape {
            name: self.plan.name.clone(),
            path: self.plan.file.clone(),
            format: self.plan.format,
            reason: e.to_string(),
        })?;
        let st = self.state();
        for (slot, p) in &st.current {
            set_at(&mut v, &slot.ptr, Value::String(p.ph.clone()));
        }
        let mut out = serde_json::to_vec_pretty(&v).map_err(|e| {
            plan_io(
                &self.plan,
                "serialising",
                std::io::Error::other(e.to_string()),
            )
        })?;
        // A copy of a token anywhere else in the file is replaced too.
        for (_, p) in &st.current {
            out = replace(&out, p.real.as_bytes(), p.ph.as_bytes());
        }
        Ok(out)
    }

    /// Every real token held for the run with the placeholder the jail knows for it.
    pub fn scrub_pairs(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let st = self.state();
        st.current
            .iter()
            .map(|(_, p)| p)
            .chain(st.retired.iter())
            .map(|p| (p.real.as_bytes().to_vec(), p.ph.as_bytes().to_vec()))
            .collect()
    }

    /// The hosts of the credentials the file ties to hosts of their own ([`TokenKind::Bound`]).
    fn bound_hosts(&self) -> Vec<DomainPattern> {
        self.state()
            .current
            .iter()
            .filter(|(s, _)| s.kind == TokenKind::Bound)
            .flat_map(|(s, _)| s.hosts.iter().cloned())
            .collect()
    }

    /// Whether a CONNECT to `host:port` must be intercepted for this sign-in.
    pub fn binds(&self, host: &Host, port: u16) -> bool {
        self.endpoints().iter().any(|e| e.binds(host, port))
            || self.bound_hosts().iter().any(|p| p.matches(host, port))
    }

    /// The host names the run CA must be allowed to certify.
    pub fn names(&self) -> Vec<String> {
        let bound = self.bound_hosts();
        self.endpoints()
            .iter()
            .flat_map(|e| e.token.map(|(h, _)| h).into_iter().chain(e.api_hosts))
            .chain(&bound)
            .filter_map(|p| p.name().map(str::to_string))
            .collect()
    }

    /// Whether a request to `host:port` for `target` is a call of a token endpoint.
    pub fn is_token_request(&self, host: &Host, port: u16, target: &str) -> bool {
        self.endpoints()
            .iter()
            .any(|e| e.is_token_request(host, port, target))
    }

    /// The refresh a call of the token endpoint at `host:port` for `target` stands for when its
    /// body held no placeholder of this run: the first provider (or the one sign-in) whose
    /// endpoint it is. Its answer is taken (the jail gets placeholders) but never written back.
    pub fn refresh_at(&self, host: &Host, port: u16, target: &str) -> Option<Refreshing> {
        let mut candidates =
            std::iter::once(None).chain(self.plan.providers.iter().map(|q| Some(q.id.as_str())));
        candidates
            .find(|p| {
                self.endpoint(*p)
                    .is_some_and(|e| e.is_token_request(host, port, target))
            })
            .map(|p| Refreshing {
                provider: p.map(str::to_string),
                carried: false,
            })
    }

    /// Whether new tokens could be written back now: always for a local file; for a remote
    /// one, corral on the host must answer. A refresh that could not be written back would
    /// rotate the user's refresh token upstream and leave the file with a dead one, so the
    /// gateway refuses it instead.
    pub fn write_back_reachable(&self) -> Result<(), SigninError> {
        match &self.file {
            FileAccess::Local => Ok(()),
            FileAccess::Remote(socket) => {
                crate::signin_remote::read_tokens(socket, &self.plan.name).map(|_| ())
            }
        }
    }

    /// Adopt tokens the user's file holds when someone else refreshed since corral read it:
    /// per provider, when its refresh token there is not the one corral last saw.
    fn adopt_from_disk(&self) {
        let on_disk = match &self.file {
            FileAccess::Local => match file_tokens(&self.plan) {
                Ok(t) => t,
                Err(_) => return,
            },
            FileAccess::Remote(socket) => {
                match crate::signin_remote::read_tokens(socket, &self.plan.name) {
                    Ok(t) => t,
                    Err(_) => return,
                }
            }
        };
        let mut st = self.state();
        let providers: Vec<Option<String>> =
            st.on_disk_refresh.iter().map(|(p, _)| p.clone()).collect();
        for provider in providers {
            let Some(refresh) = on_disk
                .iter()
                .find(|(s, _)| s.provider == provider && s.kind == TokenKind::Refresh)
                .map(|(_, r)| r.clone())
            else {
                continue;
            };
            if st.on_disk(&provider) == Some(refresh.as_str()) {
                continue;
            }
            for (slot, real) in on_disk.iter().filter(|(s, _)| s.provider == provider) {
                if !matches!(
                    slot.kind,
                    TokenKind::Access | TokenKind::Refresh | TokenKind::Id
                ) {
                    continue;
                }
                let TokenState {
                    current, retired, ..
                } = &mut *st;
                if let Some((_, p)) = current.iter_mut().find(|(s, _)| s == slot)
                    && &p.real != real
                {
                    retired.push(p.clone());
                    p.real = real.clone();
                }
            }
            st.set_on_disk(&provider, refresh);
        }
    }

    /// A refresh request's body to `host:port` for `target` with the jail's placeholder refresh
    /// token replaced by the real one (JSON-escaped, or percent-encoded for a form), and whose
    /// refresh it is. Only a refresh token whose provider's token endpoint this is: never one
    /// provider's refresh token to another's endpoint. `None` when the body holds no placeholder
    /// refresh token of this run for this endpoint (it goes out as it is: useless upstream).
    pub fn swap_refresh(
        &self,
        (host, port, target): (&Host, u16, &str),
        body: &[u8],
        form: bool,
    ) -> Option<(Refreshing, Vec<u8>)> {
        self.adopt_from_disk();
        let st = self.state();
        for (slot, p) in st
            .current
            .iter()
            .filter(|(s, _)| s.kind == TokenKind::Refresh)
        {
            let here = self
                .endpoint(slot.provider.as_deref())
                .is_some_and(|e| e.is_token_request(host, port, target));
            if !here {
                continue;
            }
            // A form encoder may percent-encode the placeholder's `/`, `.`, ... (curl, URLSearchParams).
            let mut needles = vec![p.ph.as_bytes().to_vec()];
            if form {
                needles.push(percent_encode(p.ph.as_bytes()));
            }
            if !needles.iter().any(|n| contains(body, n)) {
                continue;
            }
            let real = if form {
                percent_encode(p.real.as_bytes())
            } else {
                json_escaped(p.real.as_bytes())?
            };
            let mut out = body.to_vec();
            for n in needles {
                out = replace(&out, &n, &real);
            }
            let r = Refreshing {
                provider: slot.provider.clone(),
                carried: true,
            };
            return Some((r, out));
        }
        None
    }

    /// Take the new tokens out of a successful token response to refresh `r`: keep them, give
    /// the jail new placeholders in their place. Returns the body for the jail and the
    /// `expires_in` seconds.
    pub fn take_response(
        &self,
        r: &Refreshing,
        body: &[u8],
    ) -> Result<(Vec<u8>, Option<u64>), SigninError> {
        let bad = |reason: String| SigninError::Response {
            name: self.plan.name.clone(),
            reason,
        };
        let mut v: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
        if !v.is_object() {
            return Err(bad("not a JSON object".into()));
        }
        if !matches!(v.get("access_token"), Some(Value::String(s)) if !s.is_empty()) {
            return Err(bad("no access_token".into()));
        }
        if let Some(field) = stray_token_field(&v, true) {
            return Err(bad(format!(
                "a token field corral does not take ({field}): it could carry a live token corral cannot replace"
            )));
        }
        let expires_in = v.get("expires_in").and_then(Value::as_u64);
        let (layout, _) = oauth_layout(self.plan.format, r.provider.as_deref()).map_err(bad)?;
        let mut st = self.state();
        for kind in [TokenKind::Access, TokenKind::Refresh, TokenKind::Id] {
            let Some(field) = kind.response_field() else {
                continue;
            };
            let Some(Value::String(real)) = v.get(field).cloned() else {
                continue;
            };
            let ph = token_placeholder(&real).map_err(|reason| SigninError::Placeholder {
                name: self.plan.name.clone(),
                reason,
            })?;
            let ptr = layout
                .iter()
                .find(|(k, _)| *k == kind)
                .map(|(_, p)| p.clone())
                .unwrap_or_default();
            let slot = Slot {
                provider: r.provider.clone(),
                kind,
                ptr,
                hosts: Vec::new(),
            };
            let ph = st.keep(r.carried, slot, Pair { real, ph });
            v[field] = Value::String(ph);
        }
        let mut out = serde_json::to_vec(&v).map_err(|e| bad(e.to_string()))?;
        // A token echoed in another field (or an old one) reaches the jail as its placeholder.
        for p in st.current.iter().map(|(_, p)| p).chain(st.retired.iter()) {
            out = replace(&out, p.real.as_bytes(), p.ph.as_bytes());
        }
        Ok((out, expires_in))
    }

    /// Write the current real tokens of refresh `r` into the user's file (see the module docs):
    /// here, or by the corral process on the host ([`FileAccess::Remote`]).
    pub fn write_back(
        &self,
        r: &Refreshing,
        expires_in: Option<u64>,
        now: SystemTime,
    ) -> Result<(), SigninError> {
        if !r.carried {
            return Err(SigninError::Foreign {
                name: self.plan.name.clone(),
                path: self.plan.file.clone(),
            });
        }
        let mut st = self.state();
        let tokens: Vec<(TokenKind, String)> = st
            .current
            .iter()
            .filter(|(s, _)| s.provider == r.provider)
            .filter(|(s, _)| {
                matches!(
                    s.kind,
                    TokenKind::Access | TokenKind::Refresh | TokenKind::Id
                )
            })
            .map(|(s, p)| (s.kind, p.real.clone()))
            .collect();
        let expected = st.on_disk(&r.provider).unwrap_or_default().to_string();
        let provider = r.provider.as_deref();
        match &self.file {
            FileAccess::Local => {
                write_tokens(&self.plan, provider, &expected, &tokens, expires_in, now)?
            }
            FileAccess::Remote(socket) => crate::signin_remote::write_tokens(
                socket,
                &self.plan.name,
                provider,
                &expected,
                &tokens,
                expires_in,
            )?,
        }
        if let Some((_, refresh)) = tokens.iter().find(|(k, _)| *k == TokenKind::Refresh) {
            st.set_on_disk(&r.provider, refresh.clone());
        }
        Ok(())
    }
}

/// The credentials in the user's credential file of `plan`, read now.
pub fn file_tokens(plan: &SigninPlan) -> Result<Vec<(Slot, String)>, SigninError> {
    let text = read_capped(&plan.file).map_err(|e| plan_io(plan, "re-reading", e))?;
    let shape = |reason: String| SigninError::Shape {
        name: plan.name.clone(),
        path: plan.file.clone(),
        format: plan.format,
        reason,
    };
    let v: Value = serde_json::from_slice(&text).map_err(|e| shape(e.to_string()))?;
    slots_in(plan, &v).map_err(shape)
}

/// Write `tokens` (real OAuth tokens of `provider`) into the user's file of `plan`: under a
/// lock on its directory, after re-reading it, only if the provider's entry there is still an
/// OAuth sign-in whose refresh token is `expected_refresh` (else [`SigninError::Changed`]),
/// at the format's own places only (never an API key, never a `!command`; no value starting
/// with `!` is written), every other field kept, the expiry set from `expires_in` at `now`,
/// rewritten in place (same inode and mode, fsynced).
pub fn write_tokens(
    plan: &SigninPlan,
    provider: Option<&str>,
    expected_refresh: &str,
    tokens: &[(TokenKind, String)],
    expires_in: Option<u64>,
    now: SystemTime,
) -> Result<(), SigninError> {
    let path = &plan.file;
    let io = |step, source| plan_io(plan, step, source);
    let shape = |reason: String| SigninError::Shape {
        name: plan.name.clone(),
        path: path.clone(),
        format: plan.format,
        reason,
    };
    let (fields, expiry) = oauth_layout(plan.format, provider).map_err(shape)?;
    if let Some(id) = provider
        && !plan.providers.iter().any(|p| p.id == id)
    {
        return Err(shape(format!(
            "provider {id:?} is not one this sign-in serves"
        )));
    }
    if let Some((k, _)) = tokens.iter().find(|(k, t)| {
        t.is_empty()
            || t.starts_with('!')
            || !fields.iter().any(|(f, _)| f == k) && *k != TokenKind::Id
    }) {
        return Err(shape(format!("a {k:?} token corral will not write")));
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    let lock = std::fs::File::open(dir).map_err(|e| io("opening the directory of", e))?;
    lock.lock().map_err(|e| io("locking the directory of", e))?;
    let text = read_capped(path).map_err(|e| io("re-reading", e))?;
    let mut v: Value = serde_json::from_slice(&text).map_err(|e| shape(e.to_string()))?;
    let changed = || SigninError::Changed {
        name: plan.name.clone(),
        path: path.clone(),
    };
    if let Some(id) = provider {
        let kind = v
            .get(id)
            .and_then(|e| e.get("type"))
            .and_then(Value::as_str);
        if kind != Some("oauth") {
            return Err(changed());
        }
    }
    let refresh_ptr = fields
        .iter()
        .find(|(k, _)| *k == TokenKind::Refresh)
        .map(|(_, p)| p.as_str());
    let on_disk = refresh_ptr
        .and_then(|p| v.pointer(p))
        .and_then(Value::as_str);
    if on_disk != Some(expected_refresh) {
        return Err(changed());
    }
    for (kind, ptr) in &fields {
        if let Some((_, real)) = tokens.iter().find(|(k, _)| k == kind) {
            set_at(&mut v, ptr, Value::String(real.clone()));
        }
    }
    match expiry {
        Expiry::MillisAt(ptr, margin) => {
            if let Some(s) = expires_in {
                let at = (now_millis(now) + s.saturating_mul(1000)).saturating_sub(margin);
                set_at(&mut v, &ptr, Value::from(at));
            }
        }
        Expiry::RefreshedAt(ptr) => {
            let t = humantime::format_rfc3339_micros(now).to_string();
            set_at(&mut v, ptr, Value::String(t));
        }
    }
    let data = serde_json::to_vec_pretty(&v)
        .map_err(|e| io("serialising", std::io::Error::other(e.to_string())))?;
    rewrite_in_place(path, &data).map_err(|e| io("rewriting", e))
}

fn plan_io(plan: &SigninPlan, step: &'static str, source: std::io::Error) -> SigninError {
    SigninError::Io {
        name: plan.name.clone(),
        step,
        path: plan.file.clone(),
        source,
    }
}

fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let f = std::fs::File::open(path)?;
    let mut out = Vec::new();
    f.take(MAX_SIGNIN_BYTES as u64 + 1).read_to_end(&mut out)?;
    if out.len() > MAX_SIGNIN_BYTES {
        return Err(std::io::Error::other("larger than 1 MiB"));
    }
    Ok(out)
}

/// Rewrite `path` in place with `data` (same inode: its mode and owner stay, and the jail's bind
/// over this path stays attached; replacing the file by a rename would detach that bind in the
/// jail's mount namespace and show the jail the new file). One write, then the length set, then
/// fsync: a reader racing it may see a mix only within the lock holder's write.
fn rewrite_in_place(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(data)?;
    f.set_len(data.len() as u64)?;
    f.sync_all()
}

/// Swap each sign-in's access placeholder in the credential headers of a request to one of its
/// API hosts (or its token host) over TLS; report what was done. Over plain HTTP nothing is
/// swapped: a sign-in token never crosses the network in clear.
pub(crate) fn swap_access(
    signins: &[Signin],
    headers: &mut [Header],
    (host, port): (&Host, u16),
    plain: bool,
    report: &mut RewriteReport,
) {
    for s in signins {
        let st = s.state();
        for (slot, p) in &st.current {
            if !matches!(
                slot.kind,
                TokenKind::Access | TokenKind::Key | TokenKind::Bound | TokenKind::Opaque
            ) {
                continue;
            }
            let known = slot.kind != TokenKind::Opaque;
            // A bound credential goes to its own hosts only, never to the entry's.
            let here = if slot.kind == TokenKind::Bound {
                slot.hosts.iter().any(|p| p.matches(host, port))
            } else {
                s.endpoint(slot.provider.as_deref())
                    .is_some_and(|e| e.binds(host, port))
            };
            let bound = known && !plain && matches!(host, Host::Name(_)) && here;
            for h in headers.iter_mut() {
                if !contains(&h.value, p.ph.as_bytes()) {
                    continue;
                }
                let lname = h.name.to_ascii_lowercase();
                let id = match &slot.provider {
                    Some(provider) => format!("signin.{}.{provider}", s.plan.name),
                    None if slot.kind == TokenKind::Bound => {
                        format!("signin.{}{}", s.plan.name, slot.ptr)
                    }
                    None => format!("signin.{}", s.plan.name),
                };
                if !known {
                    report.left.push((
                        id,
                        format!(
                            "placeholder of a credential corral knows no host for (header {lname}): never swapped"
                        ),
                    ));
                } else if !bound {
                    report.left.push((
                        id,
                        format!("placeholder sent to unbound host (header {lname})"),
                    ));
                } else if !CREDENTIAL_HEADERS.contains(&lname.as_str()) {
                    report.left.push((
                        id,
                        format!("placeholder in non-credential header {lname} not replaced"),
                    ));
                } else {
                    h.value = replace(&h.value, p.ph.as_bytes(), p.real.as_bytes());
                    report.injected.push((id, lname));
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "signin_tests.rs"]
mod tests;
