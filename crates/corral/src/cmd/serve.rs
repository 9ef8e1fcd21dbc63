//! `corral serve`: the executor server.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use corral_audit::AuditLog;
use corral_exec::{HostSpawner, ListenAddr, Server, ServerConfig, Spawner};
use corral_policy::Plan;
use corral_policy::config::{HumanDuration, Size, load_policy};
use corral_run::executor::{JAIL_PLAN_ENV, JailSpawner};

use crate::cli::ServeArgs;

/// `early`: the jail's set-up process main() forked for `--jail-helper`, if it did.
pub fn run(
    args: ServeArgs,
    early: Option<corral_sandbox::PreparedJail>,
) -> anyhow::Result<ExitCode> {
    if args.jail_helper {
        return jail_helper(early);
    }
    drop(early);
    let root = match &args.root {
        Some(r) => r.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    let root =
        std::fs::canonicalize(&root).with_context(|| format!("project root {}", root.display()))?;
    let mut cfg = ServerConfig::new(&root);

    // The executor's settings: the policy file (--policy, else the project's corral.toml),
    // then the flags.
    let policy = args
        .policy
        .clone()
        .or_else(|| Some(root.join("corral.toml")).filter(|p| p.is_file()));
    if let Some(p) = &policy {
        apply_policy(&mut cfg, p)?;
    }
    cfg.allow.extend(args.allow.iter().cloned());
    if let Some(t) = &args.timeout {
        cfg.timeout = Duration::from_millis(
            HumanDuration::parse(t)
                .map_err(anyhow::Error::msg)
                .context("--timeout")?
                .0,
        );
    }
    if let Some(s) = &args.max_output {
        cfg.max_output = Size::parse(s)
            .map_err(anyhow::Error::msg)
            .context("--max-output")?
            .0;
    }
    if let Some(n) = args.max_concurrent {
        if n == 0 {
            bail!("--max-concurrent must be at least 1");
        }
        cfg.max_concurrent = n;
    }

    cfg.token = if args.no_auth {
        None
    } else {
        let file = args
            .token_file
            .clone()
            .or_else(|| std::env::var_os("CORRAL_EXECUTOR_TOKEN_FILE").map(PathBuf::from))
            .context(
                "corral serve needs --token-file F (clients send its content as a bearer token) \
                 or an explicit --no-auth (only when nothing untrusted can reach the address)",
            )?;
        Some(read_token(&file)?)
    };
    cfg.audit = Some(match &args.audit_log {
        Some(f) => AuditLog::at(f),
        None => AuditLog::for_project(&root)
            .context("cannot place the audit log; pass --audit-log FILE")?,
    });
    if let Some(id) = std::env::var("CORRAL_JAIL_ID")
        .ok()
        .filter(|v| !v.is_empty())
    {
        cfg.jail_id = id;
    }
    let listen = ListenAddr::parse(&args.listen)?;
    let host = HostSpawner {
        base_env: None,
        remove_env: vec![
            "CORRAL_EXECUTOR".into(),
            "CORRAL_EXECUTOR_TOKEN_FILE".into(),
            JAIL_PLAN_ENV.into(),
        ],
    };
    let spawner: Arc<dyn Spawner> = match &args.jail_plan {
        None => Arc::new(host),
        Some(file) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read the jail plan {}", file.display()))?;
            let plan: Plan = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a corral Plan (JSON)", file.display()))?;
            Arc::new(JailSpawner::new(plan, host)?)
        }
    };

    let audit = cfg.audit.clone();
    // One thread serves every connection and command: a request goes from accept to the
    // command's exit without waking another thread (each such hand-off wakes a CPU that may
    // be idle, which costs more than the whole request on a virtual machine). Nothing in the
    // server blocks for long: starting a command is a posix_spawn, its output is read
    // without blocking, and at most `max_concurrent` commands run.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let auth = if cfg.token.is_some() {
            "bearer token"
        } else {
            "none (--no-auth)"
        };
        let summary = format!(
            "root {}, auth {auth}, max {} concurrent, timeout {}s",
            root.display(),
            cfg.max_concurrent,
            cfg.timeout.as_secs_f64()
        );
        let server = Server::bind(&listen, cfg, spawner).await?;
        eprintln!(
            "corral serve: listening on {} ({summary})",
            server.local_addr()
        );
        server.run(stop_signal()).await;
        Ok::<_, anyhow::Error>(())
    })?;
    // The server is a child subreaper: what a command left behind (a command jail whose
    // helper was killed, a process that left its group) ends here too, before the server
    // exits and `corral run` checks the project.
    corral_exec::end_children(&[]);
    // Records that could not be written: said on the way out (`corral run` reads this line
    // from the server's stderr and counts them in its own summary).
    if let Some(f) = audit.as_ref().and_then(AuditLog::failures) {
        eprintln!("{}", f.summary_line());
    }
    Ok(ExitCode::SUCCESS)
}

fn apply_policy(cfg: &mut ServerConfig, path: &Path) -> anyhow::Result<()> {
    let (policy, _) = load_policy(path)?;
    if let Some(ex) = policy.executor {
        if let Some(allow) = ex.allow {
            cfg.allow = allow;
        }
        if let Some(t) = ex.timeout {
            cfg.timeout = Duration::from_millis(t.0);
        }
        if let Some(s) = ex.max_output {
            cfg.max_output = s.0;
        }
        if let Some(n) = ex.max_concurrent {
            cfg.max_concurrent = n.max(1);
        }
    }
    Ok(())
}

fn read_token(path: &Path) -> anyhow::Result<String> {
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the token file {}", path.display()))?;
    let token = token.trim().to_string();
    if token.is_empty() {
        bail!("the token file {} is empty", path.display());
    }
    Ok(token)
}

/// Resolves on SIGTERM or SIGINT.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    eprintln!("corral serve: shutting down; killing running commands");
}

/// `corral serve --jail-helper`: run the one command of the Plan in `CORRAL_EXEC_JAIL_PLAN` in
/// its jail (corral-run's `executor.rs`); exit with its code.
fn jail_helper(early: Option<corral_sandbox::PreparedJail>) -> anyhow::Result<ExitCode> {
    let code = corral_run::executor::jail_helper(early)?;
    Ok(ExitCode::from((code & 0xff) as u8))
}
