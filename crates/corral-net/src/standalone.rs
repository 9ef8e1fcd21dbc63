//! The standalone proxy: what `corral proxy` and the lean `corral-proxy` executable both run
//! (the squid replacement of the container setup). A policy file's `[network]` rules, one
//! listener (`HOST:PORT` or `unix:PATH`), the audit log; the rules are reloaded on SIGHUP and
//! when the policy file's modification time changes, and a reload that fails validation keeps
//! the old rules and says why (on stderr and in the audit log).
//!
//! With `--secrets FILE --gateway-dir DIR` it also runs the credential gateway (what the
//! container backends' per-run proxy does): the real values are read from FILE (mounted only
//! into the proxy's container), the run CA is generated here and its key stays in this
//! process's memory; only the CA certificate, the bundle (system roots + run CA) and the jail's
//! side ([`GatewayJail`]: placeholders and CA variables) are written under DIR, before the
//! proxy says it listens.
//!
//! With `--ca-cert FILE --ca-key FILE` (and `--placeholders FILE`) the gateway serves a run CA
//! made before it ran, with the placeholders chosen then: `corral kube render` makes them, since
//! the sandbox Pod must trust the CA and hold the placeholders before the proxy's Pod starts;
//! the key and the real values come from the proxy's Kubernetes Secret.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use corral_audit::{AuditLog, Event, JailEvent, PolicyReload, Record};

use crate::{NetError, Proxy, Rules};

/// The standalone proxy's options (the flags of `corral proxy` / `corral-proxy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `HOST:PORT`, or `unix:PATH` (an existing socket file there is replaced).
    pub listen: String,
    /// The policy file; `None`: the project's `corral.toml` (project found from the current
    /// directory).
    pub policy: Option<PathBuf>,
    /// The audit log file; `None`: the project's log under `$XDG_STATE_HOME/corral/`.
    pub audit_log: Option<PathBuf>,
    /// The jail id written into the audit records; `None`: a new id.
    pub jail: Option<String>,
    /// `[secrets]` with their real values ([`SecretsFile`], JSON): the gateway is served.
    pub secrets: Option<PathBuf>,
    /// Where the gateway writes the jail's CA files (`DIR/trust/`) and [`GATEWAY_JAIL_FILE`];
    /// required with `secrets`.
    pub gateway_dir: Option<PathBuf>,
    /// A run CA made before (certificate and key, PEM files): served instead of a fresh one.
    pub ca: Option<(PathBuf, PathBuf)>,
    /// The placeholders chosen before (a JSON object, secret name to placeholder): each secret
    /// named there gets that placeholder instead of a fresh one.
    pub placeholders: Option<PathBuf>,
}

/// The file `--secrets` names: each secret's plan and its real value. Written 0600 by the
/// caller and readable only by the proxy.
#[derive(Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SecretsFile {
    pub secrets: Vec<SecretValue>,
    /// `[signin]`: each sign-in's plan with the tokens corral read from the user's file on the
    /// host (real, with the placeholders the jail's file holds). The gateway reaches the user's
    /// file through corral on the host, on the socket [`GATEWAY_SIGNIN_SOCKET`] under
    /// `--gateway-dir`.
    #[serde(default)]
    pub signins: Vec<SigninValue>,
}

/// One sign-in and its tokens.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SigninValue {
    pub plan: corral_policy::signin::SigninPlan,
    pub tokens: corral_gateway::signin::SigninTokens,
}

/// One secret and its real value.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SecretValue {
    #[serde(flatten)]
    pub plan: corral_policy::plan::SecretPlan,
    pub value: String,
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretValue")
            .field("plan", &self.plan)
            .field("value", &"<redacted>")
            .finish()
    }
}

impl std::fmt::Debug for SecretsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsFile")
            .field("secrets", &self.secrets)
            .field("signins", &self.signins)
            .finish()
    }
}

/// The jail's side of the gateway, written by the proxy to `DIR/`[`GATEWAY_JAIL_FILE`]: what
/// the harness container must be given. No real value, no key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GatewayJail {
    /// Each secret's name with its placeholder, and the CA variables (paths under
    /// `DIR/`[`GATEWAY_TRUST_DIR`], as the proxy sees them: the harness binds that directory
    /// at the same path).
    pub env: std::collections::BTreeMap<String, String>,
    /// System CA bundle paths of the proxy's image that the bundle (system roots + run CA)
    /// should cover in the harness, each with the bundle file's name in the trust directory.
    pub system_overlays: Vec<(PathBuf, String)>,
}

/// The gateway's output file under `--gateway-dir`.
pub const GATEWAY_JAIL_FILE: &str = "jail.json";
/// The trust directory (CA certificate and bundle) under `--gateway-dir`.
pub const GATEWAY_TRUST_DIR: &str = "trust";
/// The socket under `--gateway-dir` on which corral on the host serves the user's sign-in files
/// (corral_gateway::signin_remote).
pub const GATEWAY_SIGNIN_SOCKET: &str = "signin.sock";

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetError {
    let what = what.into();
    move |source| NetError::Io { what, source }
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn load(path: &Path) -> Result<Rules, NetError> {
    Rules::from_policy_file(path).map_err(|e| NetError::Rules {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

/// An error and its causes on one line (`a: b: c`), each cause once.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let s_text = s.to_string();
        if !out.ends_with(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        cur = s.source();
    }
    out
}

/// The standalone proxy's runtime: one thread runs every connection (as squid's and nginx's
/// single worker do; the container setup gives the proxy one CPU), plus tokio's blocking pool
/// for name resolution. One worker thread instead of two: one malloc arena, one stack, and none
/// of the work-stealing scheduler's code paged in.
fn runtime() -> Result<tokio::runtime::Runtime, NetError> {
    crate::run::limit_malloc_arenas();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io("cannot start the proxy runtime"))
}

/// Run the proxy until SIGTERM or SIGINT (`Ok`), or until the listener fails.
pub fn run(opts: Options) -> Result<(), NetError> {
    let policy: PathBuf = match opts.policy {
        Some(p) => p,
        None => {
            let cwd = std::env::current_dir().map_err(io("cannot read the current directory"))?;
            let p = corral_policy::resolve::project_root(&cwd).join("corral.toml");
            if !p.exists() {
                return Err(NetError::Config(format!(
                    "no policy: pass --policy FILE, or run in a project with a corral.toml ({} not found)",
                    p.display()
                )));
            }
            p
        }
    };
    let rules = load(&policy)?;
    // Two descriptors a tunnel: the common soft limit of 1,024 would be 500 tunnels.
    if let Err(e) = crate::bounds::raise_nofile_limit() {
        eprintln!("corral proxy: cannot raise the open-file limit: {e}");
    }
    let audit = match &opts.audit_log {
        Some(p) => AuditLog::at(p),
        None => {
            let cwd = std::env::current_dir().map_err(io("cannot read the current directory"))?;
            let root = corral_policy::resolve::project_root(&cwd);
            AuditLog::for_project(&root).map_err(|e| {
                NetError::Config(format!("cannot locate the audit log: {}", error_chain(&e)))
            })?
        }
    };
    let jail = opts.jail.unwrap_or_else(corral_audit::new_jail_id);
    eprintln!(
        "corral proxy: {} allow, {} deny pattern(s) from {}; audit log {}",
        rules.allow.len(),
        rules.deny.len(),
        policy.display(),
        audit.path().display()
    );
    let mut proxy = Proxy::new(rules, audit.clone(), jail.clone());
    let files = GatewayFiles {
        ca: opts.ca.as_ref(),
        placeholders: opts.placeholders.as_deref(),
    };
    if let Some(gw) = gateway(&opts.secrets, &opts.gateway_dir, files, &audit, &jail)? {
        proxy = proxy.with_gateway(gw);
    }
    let proxy = Arc::new(proxy);
    let rt = runtime()?;
    let listen = opts.listen;
    rt.block_on(async move {
        let serve = if let Some(path) = listen.strip_prefix("unix:") {
            let _ = std::fs::remove_file(path);
            let l = std::os::unix::net::UnixListener::bind(path)
                .map_err(io(format!("cannot listen on unix socket {path}")))?;
            eprintln!("corral proxy: listening on unix:{path}");
            tokio::spawn(proxy.clone().serve_unix(l))
        } else {
            let l = std::net::TcpListener::bind(&listen).map_err(io(format!(
                "cannot listen on {listen} (expected HOST:PORT or unix:PATH)"
            )))?;
            let addr = l
                .local_addr()
                .map_err(io(format!("cannot read the address of listener {listen}")))?;
            eprintln!("corral proxy: listening on {addr}");
            tokio::spawn(proxy.clone().serve(l))
        };
        let (summary, audit_failures) = (proxy.clone(), audit.clone());
        tokio::spawn(reloader(proxy, policy, audit, jail));
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).map_err(io("cannot handle SIGTERM"))?;
        let mut int = signal(SignalKind::interrupt()).map_err(io("cannot handle SIGINT"))?;
        let mut serve = serve;
        let failed = tokio::select! {
            r = &mut serve => Some(match r {
                Ok(r) => r.map_err(io("the proxy listener failed")).err(),
                Err(e) => Some(NetError::Config(format!("the proxy task failed: {e}"))),
            }),
            _ = int.recv() => None,
            _ = term.recv() => None,
        };
        // No new connection; every open one ended and its close record written, and the
        // refusals not yet recorded, before the process exits.
        serve.abort();
        let _ = serve.await;
        summary.shutdown(crate::run::SHUTDOWN_DEADLINE).await;
        if let Some(Some(e)) = failed {
            return Err(e);
        }
        // The bounds hit and the records lost while it ran, said once at the end.
        for line in summary.bounds_summary() {
            eprintln!("{line}");
        }
        if let Some(f) = audit_failures.failures() {
            eprintln!("{}", f.summary_line());
        }
        Ok(())
    })
}

/// The files a gateway is given besides the real values: a CA and placeholders made before it
/// ran.
#[derive(Clone, Copy)]
struct GatewayFiles<'a> {
    ca: Option<&'a (PathBuf, PathBuf)>,
    placeholders: Option<&'a Path>,
}

impl GatewayFiles<'_> {
    /// The CA's PEM files, read.
    fn ca(&self) -> Result<Option<corral_gateway::CaPem>, NetError> {
        let Some((cert, key)) = self.ca else {
            return Ok(None);
        };
        let read = |p: &Path, what: &str| {
            std::fs::read_to_string(p)
                .map_err(io(format!("cannot read the {what} {}", p.display())))
        };
        Ok(Some(corral_gateway::CaPem {
            cert: read(cert, "run CA certificate")?,
            key: read(key, "run CA key")?,
        }))
    }

    /// The placeholders file, read; empty when none was given.
    fn placeholders(&self) -> Result<std::collections::BTreeMap<String, String>, NetError> {
        let Some(p) = self.placeholders else {
            return Ok(Default::default());
        };
        let text = std::fs::read_to_string(p).map_err(io(format!(
            "cannot read the placeholders file {}",
            p.display()
        )))?;
        serde_json::from_str(&text).map_err(|e| {
            NetError::Config(format!(
                "the placeholders file {} is not a JSON object of secret names to placeholders: {e}",
                p.display()
            ))
        })
    }
}

/// The `--secrets` file, read and parsed: refused when it names nothing to serve.
fn read_secrets_file(file: &Path) -> Result<SecretsFile, NetError> {
    let text = std::fs::read_to_string(file).map_err(io(format!(
        "cannot read the secrets file {}",
        file.display()
    )))?;
    let parsed: SecretsFile = serde_json::from_str(&text).map_err(|e| {
        NetError::Config(format!(
            "the secrets file {} is not a list of secrets with values: {e}",
            file.display()
        ))
    })?;
    if parsed.secrets.is_empty() && parsed.signins.is_empty() {
        return Err(NetError::Config(format!(
            "the secrets file {} names no secret and no sign-in",
            file.display()
        )));
    }
    Ok(parsed)
}

/// The gateway's configuration: the system store verifies the real hosts (SSL_CERT_FILE /
/// SSL_CERT_DIR in the proxy's environment, a corporate CA, are honoured), the jail's CA files
/// go to `trust_dir`, its records to the proxy's audit log.
fn gateway_config(
    trust_dir: PathBuf,
    audit: &AuditLog,
    jail: &str,
) -> corral_gateway::GatewayConfig {
    corral_gateway::GatewayConfig {
        upstream_roots: None,
        trust_dir,
        system_bundle: None,
        audit: Some(corral_gateway::AuditSink {
            log: audit.clone(),
            jail: jail.to_string(),
        }),
    }
}

/// The gateway of `--secrets FILE`, with the jail's side written under `--gateway-dir DIR`.
fn gateway(
    secrets: &Option<PathBuf>,
    dir: &Option<PathBuf>,
    files: GatewayFiles<'_>,
    audit: &AuditLog,
    jail: &str,
) -> Result<Option<corral_gateway::Gateway>, NetError> {
    let (file, dir) = match (secrets, dir) {
        (None, None) => return Ok(None),
        (Some(f), Some(d)) => (f, d),
        _ => {
            return Err(NetError::Config(
                "--secrets and --gateway-dir go together: the gateway needs both the real values and where to write the jail's CA files".into(),
            ));
        }
    };
    let parsed = read_secrets_file(file)?;
    let names: Vec<String> = parsed
        .secrets
        .iter()
        .map(|s| s.plan.name.clone())
        .chain(
            parsed
                .signins
                .iter()
                .map(|s| format!("signin.{}", s.plan.name)),
        )
        .collect();
    let values = parsed
        .secrets
        .into_iter()
        .map(|s| (s.plan, s.value))
        .collect();
    let socket = dir.join(GATEWAY_SIGNIN_SOCKET);
    let signins = parsed
        .signins
        .into_iter()
        .map(|s| {
            let access = corral_gateway::signin::FileAccess::Remote(socket.clone());
            corral_gateway::signin::Signin::from_tokens(s.plan, s.tokens, access)
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| NetError::Config(format!("cannot serve the sign-ins: {e}")))?;
    let placeholders = files.placeholders()?;
    if let Some(unknown) = placeholders.keys().find(|k| !names.contains(k)) {
        return Err(NetError::Config(format!(
            "the placeholders file names {unknown}, which is not a secret of {}",
            file.display()
        )));
    }
    let trust_dir = dir.join(GATEWAY_TRUST_DIR);
    let config = gateway_config(trust_dir.clone(), audit, jail);
    let started = match files.ca()? {
        Some(_) if !signins.is_empty() => {
            return Err(NetError::Config(format!(
                "the secrets file {} has sign-ins: they are not served with a run CA made before (--ca-cert)",
                file.display()
            )));
        }
        Some(ca) => corral_gateway::Gateway::with_ca(values, &placeholders, &ca, config),
        // Rules by path are the native backend's only (container and cluster runs refuse them).
        None => corral_gateway::Gateway::with_run(values, &placeholders, signins, &[], config),
    };
    let (gw, trust) = started
        .map_err(|e| NetError::Config(format!("cannot start the credential gateway: {e}")))?;
    let bundle = trust
        .bundle_file
        .strip_prefix(&trust_dir)
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let side = GatewayJail {
        env: trust.env,
        system_overlays: trust
            .system_overlays
            .into_iter()
            .map(|m| (m.target, bundle.clone()))
            .collect(),
    };
    let out = dir.join(GATEWAY_JAIL_FILE);
    let tmp = dir.join(format!(".{GATEWAY_JAIL_FILE}.tmp"));
    let json = serde_json::to_vec_pretty(&side).expect("plain data serializes");
    std::fs::write(&tmp, json).map_err(io(format!("cannot write {}", tmp.display())))?;
    std::fs::rename(&tmp, &out).map_err(io(format!("cannot write {}", out.display())))?;
    eprintln!(
        "corral proxy: credential gateway for {} (CA certificate in {})",
        names.join(", "),
        trust_dir.display()
    );
    Ok(Some(gw))
}

/// Reload on SIGHUP or when the file's modification time changes (polled every second).
async fn reloader(proxy: Arc<Proxy>, policy: PathBuf, audit: AuditLog, jail: String) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("corral proxy: cannot handle SIGHUP ({e}); reloading on file change only");
            None
        }
    };
    let mut seen = mtime(&policy);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let why = tokio::select! {
            _ = async { match hup.as_mut() { Some(h) => { h.recv().await; } None => std::future::pending().await } } => "SIGHUP",
            _ = tick.tick() => {
                let now = mtime(&policy);
                if now == seen { continue; }
                "file change"
            }
        };
        // Also after a SIGHUP: the write it announces is not reloaded again by the next tick.
        seen = mtime(&policy);
        let event = match load(&policy) {
            Ok(rules) => {
                eprintln!(
                    "corral proxy: reloaded {} ({why}): {} allow, {} deny pattern(s)",
                    policy.display(),
                    rules.allow.len(),
                    rules.deny.len()
                );
                proxy.set_rules(rules);
                JailEvent::PolicyReload {
                    detail: PolicyReload {
                        error: None,
                        file: policy.clone(),
                        trigger: why.into(),
                    },
                }
            }
            Err(e) => {
                let e = error_chain(&e);
                eprintln!(
                    "corral proxy: reload of {} failed, keeping the previous rules: {e}",
                    policy.display()
                );
                JailEvent::PolicyReloadFailed {
                    detail: PolicyReload {
                        error: Some(e),
                        file: policy.clone(),
                        trigger: why.into(),
                    },
                }
            }
        };
        let _ = audit.write(&Record::now(&jail, Event::Jail(event)));
    }
}
