//! `corral exec -- CMD ARGS`: run a command through the executor, stream its output, exit with
//! its code.

use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};
use corral_exec::client;
use corral_exec::{Event, ExecRequest, Stream};
use corral_policy::config::{HumanDuration, load_policy};
use corral_policy::plan::ExecutorTarget;

use crate::cli::ExecArgs;

pub fn run(args: ExecArgs) -> anyhow::Result<ExitCode> {
    // The options first: a mistyped one is said before the executor is looked for.
    let timeout_ms = match &args.timeout {
        Some(t) => Some(
            HumanDuration::parse(t)
                .map_err(anyhow::Error::msg)
                .context("--timeout")?
                .0,
        ),
        None => None,
    };
    if std::env::var_os("CORRAL_REVIEW").is_some() && std::env::var_os("CORRAL_EXECUTOR").is_none()
    {
        anyhow::bail!(
            "the executor is off in review mode (corral run --review): its commands would run on \
             the host's project, outside the review; run the command here in the jail"
        );
    }
    let here = std::env::current_dir().context("cannot read the current directory")?;
    let target = client::discover(&here, &|k| std::env::var(k).ok(), &read_target)?;

    let mut req = ExecRequest::new(args.command.clone());
    req.cwd = match &args.cwd {
        Some(c) => Some(c.clone()),
        None => target
            .project_root
            .as_deref()
            .and_then(|root| client::relative_cwd(root, &here)),
    };
    req.timeout_ms = timeout_ms;
    for kv in &args.env {
        let Some((k, v)) = kv.split_once('=') else {
            bail!("--env {kv:?}: expected NAME=VALUE");
        };
        req.env.insert(k.to_string(), v.to_string());
    }
    if args.stdin {
        let mut input = String::new();
        std::io::stdin()
            .read_to_string(&mut input)
            .context("--stdin: standard input is not readable UTF-8 text")?;
        req.stdin = Some(input);
    }

    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let mut on_event = |ev: &Event| -> std::io::Result<()> {
        match ev {
            Event::Output {
                stream: Stream::Stdout,
                data,
            } => {
                let mut o = stdout.lock();
                o.write_all(data.as_bytes())?;
                o.flush()
            }
            Event::Output {
                stream: Stream::Stderr,
                data,
            } => {
                let mut e = stderr.lock();
                e.write_all(data.as_bytes())?;
                e.flush()
            }
            Event::Error { error, .. } => {
                let _ = writeln!(stderr.lock(), "corral exec: {error}");
                Ok(())
            }
            Event::Exit(_) => Ok(()),
        }
    };
    match client::run(&target, &req, &mut on_event) {
        Ok(code) => Ok(exit_code(code)),
        // Our reader went away (`corral exec -- cmd | head`): end quietly, as a program killed
        // by SIGPIPE would; closing the connection makes the server kill the command.
        Err(client::ClientError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            Ok(exit_code(128 + libc::SIGPIPE))
        }
        Err(e) => {
            eprintln!("corral exec: {e}");
            Ok(exit_code(e.exit_code()))
        }
    }
}

/// A status as a process exit code (0-255, as a shell would truncate it).
fn exit_code(code: i32) -> ExitCode {
    ExitCode::from((code & 0xff) as u8)
}

/// The `[executor] target` of a corral.toml, through the policy crate's parser.
fn read_target(path: &Path) -> Result<Option<ExecutorTarget>, String> {
    let (policy, _) = load_policy(path).map_err(|e| e.to_string())?;
    Ok(policy
        .executor
        .and_then(|e| e.target)
        .map(|t| t.into_inner().0))
}
