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

use corral_policy::domain::Host;
use corral_policy::signin::{SigninFormat, SigninPlan};
use serde_json::Value;

use crate::encodings::{json_escaped, percent_encode};
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
    #[error("sign-in {name}: making placeholders: {reason}")]
    Placeholder { name: String, reason: String },
    #[error("sign-in {name}: the tokens handed to the gateway: {reason}")]
    Handover { name: String, reason: String },
}

/// One kind of token in a credential file and in a token response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenKind {
    Access,
    Refresh,
    Id,
}

impl TokenKind {
    /// The field of an OAuth token response.
    fn response_field(self) -> &'static str {
        match self {
            TokenKind::Access => "access_token",
            TokenKind::Refresh => "refresh_token",
            TokenKind::Id => "id_token",
        }
    }
}

/// When the token expires, as the file says it.
#[derive(Debug, Clone, Copy)]
enum Expiry {
    /// Milliseconds since the epoch at this pointer, from the response's `expires_in`.
    MillisAt(&'static str),
    /// The time of the refresh, RFC 3339, at this pointer.
    RefreshedAt(&'static str),
}

/// Where each token sits in a format's file (JSON pointers).
fn layout(format: SigninFormat) -> (&'static [(TokenKind, &'static str)], Expiry) {
    match format {
        SigninFormat::Claude => (
            &[
                (TokenKind::Access, "/claudeAiOauth/accessToken"),
                (TokenKind::Refresh, "/claudeAiOauth/refreshToken"),
            ],
            Expiry::MillisAt("/claudeAiOauth/expiresAt"),
        ),
        SigninFormat::Codex => (
            &[
                (TokenKind::Access, "/tokens/access_token"),
                (TokenKind::Refresh, "/tokens/refresh_token"),
                (TokenKind::Id, "/tokens/id_token"),
            ],
            Expiry::RefreshedAt("/last_refresh"),
        ),
        SigninFormat::Gemini => (
            &[
                (TokenKind::Access, "/access_token"),
                (TokenKind::Refresh, "/refresh_token"),
                (TokenKind::Id, "/id_token"),
            ],
            Expiry::MillisAt("/expiry_date"),
        ),
    }
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
    tokens: Vec<(TokenKind, Pair)>,
}

impl std::fmt::Debug for SigninTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds: Vec<TokenKind> = self.tokens.iter().map(|(k, _)| *k).collect();
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
/// last seen in the user's file.
struct TokenState {
    current: Vec<(TokenKind, Pair)>,
    /// Tokens replaced by a refresh or adopted from the file: still scrubbed from answers.
    retired: Vec<Pair>,
    /// The refresh token in the user's file when corral last read or wrote it.
    on_disk_refresh: String,
}

/// One harness's sign-in, served for one run.
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

/// The tokens of a credential file, by kind (an absent id token is skipped).
fn tokens_in(format: SigninFormat, v: &Value) -> Result<Vec<(TokenKind, String)>, String> {
    let (fields, _) = layout(format);
    let mut out = Vec::new();
    for (kind, ptr) in fields {
        match v.pointer(ptr) {
            Some(Value::String(s)) if !s.is_empty() => out.push((*kind, s.clone())),
            None | Some(Value::Null) if *kind == TokenKind::Id => {}
            _ => return Err(format!("no token at {ptr}")),
        }
    }
    Ok(out)
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
    if let Some(slot) = v.pointer_mut(ptr) {
        *slot = to;
    }
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
        let tokens = tokens_in(plan.format, &v).map_err(shape)?;
        let mut current = Vec::new();
        for (kind, real) in tokens {
            let ph = token_placeholder(&real).map_err(|reason| SigninError::Placeholder {
                name: plan.name.clone(),
                reason,
            })?;
            current.push((kind, Pair { real, ph }));
        }
        let on_disk_refresh = find(&current, TokenKind::Refresh)
            .map(|p| p.real.clone())
            .unwrap_or_default();
        Ok(Some(Signin {
            plan,
            state: Mutex::new(TokenState {
                current,
                retired: Vec::new(),
                on_disk_refresh,
            }),
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
        let has = |k| tokens.tokens.iter().any(|(kind, _)| *kind == k);
        if !has(TokenKind::Access) || !has(TokenKind::Refresh) {
            return Err(SigninError::Handover {
                name: plan.name.clone(),
                reason: "no access or no refresh token".into(),
            });
        }
        let on_disk_refresh = find(&tokens.tokens, TokenKind::Refresh)
            .map(|p| p.real.clone())
            .unwrap_or_default();
        Ok(Signin {
            plan,
            state: Mutex::new(TokenState {
                current: tokens.tokens,
                retired: Vec::new(),
                on_disk_refresh,
            }),
            file,
        })
    }

    pub fn plan(&self) -> &SigninPlan {
        &self.plan
    }

    fn state(&self) -> std::sync::MutexGuard<'_, TokenState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The jail's copy of the user's file: the same JSON, every token a placeholder.
    pub fn placeholder_file(&self) -> Result<Vec<u8>, SigninError> {
        let text = read_capped(&self.plan.file).map_err(|e| plan_io(&self.plan, "reading", e))?;
        let mut v: Value = serde_json::from_slice(&text).map_err(|e| SigninError::Shape {
            name: self.plan.name.clone(),
            path: self.plan.file.clone(),
            format: self.plan.format,
            reason: e.to_string(),
        })?;
        let (fields, _) = layout(self.plan.format);
        let st = self.state();
        for (kind, ptr) in fields {
            if let Some(p) = find(&st.current, *kind) {
                set_at(&mut v, ptr, Value::String(p.ph.clone()));
            }
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

    /// Whether a CONNECT to `host:port` must be intercepted for this sign-in.
    pub fn binds(&self, host: &Host, port: u16) -> bool {
        self.plan.token_host.matches(host, port)
            || self.plan.api_hosts.iter().any(|p| p.matches(host, port))
    }

    /// The host names the run CA must be allowed to certify.
    pub fn names(&self) -> Vec<String> {
        std::iter::once(&self.plan.token_host)
            .chain(&self.plan.api_hosts)
            .filter_map(|p| p.name().map(str::to_string))
            .collect()
    }

    /// Whether a request to `host:port` for `target` is a call of the token endpoint.
    pub fn is_token_request(&self, host: &Host, port: u16, target: &str) -> bool {
        self.plan.token_host.matches(host, port)
            && crate::path_without_query(target) == self.plan.token_path
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

    /// Adopt tokens the user's file holds when someone else refreshed since corral read it.
    fn adopt_from_disk(&self) {
        let tokens = match &self.file {
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
        let on_disk = tokens
            .iter()
            .find(|(k, _)| *k == TokenKind::Refresh)
            .map(|(_, t)| t.clone())
            .unwrap_or_default();
        if on_disk == st.on_disk_refresh {
            return;
        }
        for (kind, real) in tokens {
            let TokenState {
                current, retired, ..
            } = &mut *st;
            if let Some((_, p)) = current.iter_mut().find(|(k, _)| *k == kind)
                && p.real != real
            {
                retired.push(p.clone());
                p.real = real;
            }
        }
        st.on_disk_refresh = on_disk;
    }

    /// A refresh request's body with the jail's placeholder refresh token replaced by the real
    /// one (JSON-escaped, or percent-encoded for a form). `None` when the body holds no
    /// placeholder refresh token of this run (it goes out as it is: useless upstream).
    pub fn swap_refresh(&self, body: &[u8], form: bool) -> Option<Vec<u8>> {
        self.adopt_from_disk();
        let st = self.state();
        let p = find(&st.current, TokenKind::Refresh)?;
        // A form encoder may percent-encode the placeholder's `/`, `.`, ... (curl, URLSearchParams).
        let mut needles = vec![p.ph.as_bytes().to_vec()];
        if form {
            needles.push(percent_encode(p.ph.as_bytes()));
        }
        if !needles.iter().any(|n| contains(body, n)) {
            return None;
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
        Some(out)
    }

    /// Take the new tokens out of a successful token response: keep them, give the jail new
    /// placeholders in their place. Returns the body for the jail and the `expires_in` seconds.
    pub fn take_response(&self, body: &[u8]) -> Result<(Vec<u8>, Option<u64>), SigninError> {
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
        let mut st = self.state();
        for kind in [TokenKind::Access, TokenKind::Refresh, TokenKind::Id] {
            let Some(Value::String(real)) = v.get(kind.response_field()).cloned() else {
                continue;
            };
            let ph = token_placeholder(&real).map_err(|reason| SigninError::Placeholder {
                name: self.plan.name.clone(),
                reason,
            })?;
            let TokenState {
                current, retired, ..
            } = &mut *st;
            match current.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, p)) if p.real == real => {
                    // Unchanged (a refresh token that does not rotate): same placeholder.
                    v[kind.response_field()] = Value::String(p.ph.clone());
                    continue;
                }
                Some((_, p)) => {
                    retired.push(p.clone());
                    *p = Pair {
                        real,
                        ph: ph.clone(),
                    };
                }
                None => current.push((
                    kind,
                    Pair {
                        real,
                        ph: ph.clone(),
                    },
                )),
            }
            v[kind.response_field()] = Value::String(ph);
        }
        let mut out = serde_json::to_vec(&v).map_err(|e| bad(e.to_string()))?;
        // A token echoed in another field (or an old one) reaches the jail as its placeholder.
        for p in st.current.iter().map(|(_, p)| p).chain(st.retired.iter()) {
            out = replace(&out, p.real.as_bytes(), p.ph.as_bytes());
        }
        Ok((out, expires_in))
    }

    /// Write the current real tokens into the user's file (see the module docs): here, or by
    /// the corral process on the host ([`FileAccess::Remote`]).
    pub fn write_back(&self, expires_in: Option<u64>, now: SystemTime) -> Result<(), SigninError> {
        let mut st = self.state();
        let tokens: Vec<(TokenKind, String)> = st
            .current
            .iter()
            .map(|(k, p)| (*k, p.real.clone()))
            .collect();
        match &self.file {
            FileAccess::Local => {
                write_tokens(&self.plan, &st.on_disk_refresh, &tokens, expires_in, now)?
            }
            FileAccess::Remote(socket) => crate::signin_remote::write_tokens(
                socket,
                &self.plan.name,
                &st.on_disk_refresh,
                &tokens,
                expires_in,
            )?,
        }
        st.on_disk_refresh = find(&st.current, TokenKind::Refresh)
            .map(|p| p.real.clone())
            .unwrap_or_default();
        Ok(())
    }
}

/// The tokens in the user's credential file of `plan`, read now.
pub fn file_tokens(plan: &SigninPlan) -> Result<Vec<(TokenKind, String)>, SigninError> {
    let text = read_capped(&plan.file).map_err(|e| plan_io(plan, "re-reading", e))?;
    let shape = |reason: String| SigninError::Shape {
        name: plan.name.clone(),
        path: plan.file.clone(),
        format: plan.format,
        reason,
    };
    let v: Value = serde_json::from_slice(&text).map_err(|e| shape(e.to_string()))?;
    tokens_in(plan.format, &v).map_err(shape)
}

/// Write `tokens` (real) into the user's file of `plan`: under a lock on its directory, after
/// re-reading it, only if the refresh token there is still `expected_refresh` (else
/// [`SigninError::Changed`]), every other field kept, the expiry set from `expires_in` at
/// `now`, rewritten in place (same inode and mode, fsynced).
pub fn write_tokens(
    plan: &SigninPlan,
    expected_refresh: &str,
    tokens: &[(TokenKind, String)],
    expires_in: Option<u64>,
    now: SystemTime,
) -> Result<(), SigninError> {
    let path = &plan.file;
    let io = |step, source| plan_io(plan, step, source);
    let dir = path.parent().unwrap_or(Path::new("/"));
    let lock = std::fs::File::open(dir).map_err(|e| io("opening the directory of", e))?;
    lock.lock().map_err(|e| io("locking the directory of", e))?;
    let text = read_capped(path).map_err(|e| io("re-reading", e))?;
    let mut v: Value = serde_json::from_slice(&text).map_err(|e| SigninError::Shape {
        name: plan.name.clone(),
        path: path.clone(),
        format: plan.format,
        reason: e.to_string(),
    })?;
    let (fields, expiry) = layout(plan.format);
    let refresh_ptr = fields
        .iter()
        .find(|(k, _)| *k == TokenKind::Refresh)
        .map(|(_, p)| *p);
    let on_disk = refresh_ptr
        .and_then(|p| v.pointer(p))
        .and_then(Value::as_str);
    if on_disk != Some(expected_refresh) {
        return Err(SigninError::Changed {
            name: plan.name.clone(),
            path: path.clone(),
        });
    }
    for (kind, ptr) in fields {
        if let Some((_, real)) = tokens.iter().find(|(k, _)| k == kind) {
            set_at(&mut v, ptr, Value::String(real.clone()));
        }
    }
    match expiry {
        Expiry::MillisAt(ptr) => {
            if let Some(s) = expires_in {
                set_at(&mut v, ptr, Value::from(now_millis(now) + s * 1000));
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

fn find(current: &[(TokenKind, Pair)], kind: TokenKind) -> Option<&Pair> {
    current.iter().find(|(k, _)| *k == kind).map(|(_, p)| p)
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
        let Some(p) = find(&st.current, TokenKind::Access) else {
            continue;
        };
        let bound = !plain && matches!(host, Host::Name(_)) && s.binds(host, port);
        for h in headers.iter_mut() {
            if !contains(&h.value, p.ph.as_bytes()) {
                continue;
            }
            let lname = h.name.to_ascii_lowercase();
            let id = format!("signin.{}", s.plan.name);
            if !bound {
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

#[cfg(test)]
#[path = "signin_tests.rs"]
mod tests;
