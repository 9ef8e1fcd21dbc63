//! `corral proxy [--listen ADDR|unix:PATH] [--policy FILE]`: the egress proxy alone (the squid
//! replacement of the container setup). Reloads its rules on SIGHUP and when the policy file
//! changes; a reload that fails validation keeps the old rules and says why.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use corral_audit::{AuditLog, Event, JailEvent, Record};
use corral_net::{Proxy, Rules};

use crate::cli::ProxyArgs;

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn load(path: &Path) -> anyhow::Result<Rules> {
    Rules::from_policy_file(path)
        .with_context(|| format!("cannot load the network rules of {}", path.display()))
}

pub fn run(args: ProxyArgs) -> anyhow::Result<ExitCode> {
    let root = super::log::project_root()?;
    let policy: PathBuf = match args.policy {
        Some(p) => p,
        None => {
            let p = root.join("corral.toml");
            if !p.exists() {
                bail!(
                    "no policy: pass --policy FILE, or run in a project with a corral.toml ({} not found)",
                    p.display()
                );
            }
            p
        }
    };
    let rules = load(&policy)?;
    let audit = match &args.audit_log {
        Some(p) => AuditLog::at(p),
        None => AuditLog::for_project(&root).context("cannot locate the audit log")?,
    };
    let jail = args.jail.unwrap_or_else(corral_audit::new_jail_id);
    eprintln!(
        "corral proxy: {} allow, {} deny pattern(s) from {}; audit log {}",
        rules.allow.len(),
        rules.deny.len(),
        policy.display(),
        audit.path().display()
    );
    let proxy = Arc::new(Proxy::new(rules, audit.clone(), jail.clone()));
    let rt = corral_net::runtime().context("cannot start the proxy")?;
    rt.block_on(async move {
        let serve = if let Some(path) = args.listen.strip_prefix("unix:") {
            let _ = std::fs::remove_file(path);
            let l = std::os::unix::net::UnixListener::bind(path)
                .with_context(|| format!("cannot listen on unix socket {path}"))?;
            eprintln!("corral proxy: listening on unix:{path}");
            tokio::spawn(proxy.clone().serve_unix(l))
        } else {
            let l = std::net::TcpListener::bind(&args.listen).with_context(|| {
                format!(
                    "cannot listen on {} (expected HOST:PORT or unix:PATH)",
                    args.listen
                )
            })?;
            eprintln!("corral proxy: listening on {}", l.local_addr()?);
            tokio::spawn(proxy.clone().serve(l))
        };
        tokio::spawn(reloader(proxy, policy, audit, jail));
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        tokio::select! {
            r = serve => { r.context("proxy task")?.context("proxy listener")?; }
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
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
                seen = now;
                "file change"
            }
        };
        let (event, detail) = match load(&policy) {
            Ok(rules) => {
                eprintln!(
                    "corral proxy: reloaded {} ({why}): {} allow, {} deny pattern(s)",
                    policy.display(),
                    rules.allow.len(),
                    rules.deny.len()
                );
                proxy.set_rules(rules);
                (
                    "policy-reload",
                    serde_json::json!({ "file": policy, "trigger": why }),
                )
            }
            Err(e) => {
                eprintln!(
                    "corral proxy: reload of {} failed, keeping the previous rules: {e:#}",
                    policy.display()
                );
                (
                    "policy-reload-failed",
                    serde_json::json!({ "file": policy, "trigger": why, "error": format!("{e:#}") }),
                )
            }
        };
        let _ = audit.write(&Record::now(
            &jail,
            Event::Jail(JailEvent {
                event: event.into(),
                exit_code: None,
                detail,
            }),
        ));
    }
}
