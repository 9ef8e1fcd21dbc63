//! `corral plan [PROFILE] [--json] [-- CMD]`: print the fully resolved plan without running
//! anything. Also the shared wiring from the command-line options to a policy [`Request`], used
//! by `run` and `shell` too.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Context;
use corral_policy::plan::{
    Access, Enforce, Engine, ExecutorTarget, MountKind, NetworkMode, NetworkPlan, Plan,
};
use corral_policy::{Flags, Request};

use crate::cli::{EnforceArg, EngineArg, JailOptions, NetworkArg, PlanArgs};

/// The policy request for this process: its cwd, environment, home and ids, with the
/// command-line layer taken from `opts`.
pub fn request(
    profile: Option<String>,
    opts: &JailOptions,
    command: Vec<String>,
) -> anyhow::Result<Request> {
    let mut req = Request::from_process().context("cannot describe the calling process")?;
    req.profile = profile;
    req.command = command;
    req.flags = flags(opts);
    Ok(req)
}

/// The command-line layer of the policy.
pub fn flags(opts: &JailOptions) -> Flags {
    Flags {
        policy: opts.policy.clone(),
        engine: opts.engine.map(|e| match e {
            EngineArg::Native => Engine::Native,
            EngineArg::Podman => Engine::Podman,
            EngineArg::Docker => Engine::Docker,
            EngineArg::Auto => Engine::Auto,
            EngineArg::Kube => Engine::Kube,
        }),
        network: opts.network.map(|n| match n {
            NetworkArg::None => NetworkMode::None,
            NetworkArg::Proxy => NetworkMode::Proxy,
            NetworkArg::Host => NetworkMode::Host,
        }),
        allow: opts.allow.clone(),
        rw: opts.rw.clone(),
        ro: opts.ro.clone(),
        env: opts.env.clone(),
        memory: opts.memory.clone(),
        cpus: opts.cpus,
        pids: opts.pids,
        enforce: opts.enforce.map(|e| match e {
            EnforceArg::Strict => Enforce::Strict,
            EnforceArg::BestEffort => Enforce::BestEffort,
        }),
        publish: opts.publish.clone(),
        scratch: opts.scratch,
        project: opts.project.clone(),
        allow_host_executor: opts.allow_host_executor,
        allow_harness_config: opts.allow_harness_config,
        allow_new_repositories: opts.allow_new_repositories,
        review: opts.review,
    }
}

pub fn run(args: PlanArgs) -> anyhow::Result<ExitCode> {
    let req = request(args.profile, &args.jail, args.command)?;
    // `plan` runs nothing and creates nothing (a `--scratch` directory is only named).
    let plan = corral_policy::resolve::preview(&req)?;
    let out = if args.json {
        // Exactly what a run hands its backend (the run's jail id and each secret's
        // placeholder are made when it starts; runplan.rs).
        let run = corral_session::runplan::planned(&plan);
        let mut s = serde_json::to_string_pretty(&run).context("cannot serialize the plan")?;
        s.push('\n');
        s
    } else if matches!(plan.engine, Engine::Podman | Engine::Docker) {
        // The container engines: the exact commands `corral run` runs, after the plan.
        let cmds = corral_run::engine::print_commands(&plan)?;
        format!("{}\nengine commands\n{cmds}", human(&plan))
    } else {
        human(&plan)
    };
    out!("{out}")?;
    Ok(ExitCode::SUCCESS)
}

fn access(a: Access) -> &'static str {
    match a {
        Access::Ro => "ro",
        Access::Rw => "rw",
    }
}

fn size(bytes: u64) -> String {
    const UNITS: &[(u64, &str)] = &[
        (1 << 40, "t"),
        (1 << 30, "g"),
        (1 << 20, "m"),
        (1 << 10, "k"),
    ];
    for (mult, unit) in UNITS {
        if bytes >= *mult && bytes.is_multiple_of((mult / 1024).max(1)) {
            let v = bytes as f64 / *mult as f64;
            return if v.fract() == 0.0 {
                format!("{v}{unit}")
            } else {
                format!("{v:.2}{unit}")
            };
        }
    }
    format!("{bytes} bytes")
}

fn looks_secret(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    ["KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL"]
        .iter()
        .any(|w| n.contains(w))
}

fn network(out: &mut String, n: &NetworkPlan, indent: &str) {
    let mode = match n.mode {
        NetworkMode::None => "none (loopback only)",
        NetworkMode::Proxy => "proxy (every destination decided by corral's proxy)",
        NetworkMode::Host => "host (UNFILTERED: the host's network)",
    };
    let list = |v: Vec<String>| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(", ")
        }
    };
    let _ = writeln!(out, "{indent}mode          {mode}");
    let _ = writeln!(
        out,
        "{indent}allow         {}",
        list(n.allow.iter().map(|a| a.to_string()).collect())
    );
    if !n.allow_paths.is_empty() {
        let _ = writeln!(
            out,
            "{indent}allow paths   {} (each request decided; TLS terminated with the run's CA)",
            list(n.allow_paths.iter().map(|a| a.to_string()).collect())
        );
    }
    let _ = writeln!(
        out,
        "{indent}deny          {}",
        list(n.deny.iter().map(|a| a.to_string()).collect())
    );
    let _ = writeln!(
        out,
        "{indent}allow_cidrs   {}",
        list(n.allow_cidrs.iter().map(|a| a.to_string()).collect())
    );
    let _ = writeln!(
        out,
        "{indent}host_ports    {}",
        list(n.host_ports.iter().map(|a| a.to_string()).collect())
    );
    let _ = writeln!(
        out,
        "{indent}publish       {}",
        list(n.publish.iter().map(|a| a.to_string()).collect())
    );
    if let Some(u) = &n.upstream_proxy {
        let _ = writeln!(out, "{indent}upstream      {u}");
    }
    match n.dns {
        corral_policy::plan::Dns::None => {}
        corral_policy::plan::Dns::Stub => {
            let _ = writeln!(
                out,
                "{indent}dns           stub: allowed names only, their connections through the proxy"
            );
        }
    }
    if let corral_policy::plan::OnDeny::Ask { timeout } = n.on_deny {
        let _ = writeln!(
            out,
            "{indent}on_deny       ask: a destination not in allow waits up to {timeout} s for corral watch"
        );
    }
}

/// The plan for people: what the jail sees, reaches and may use.
pub fn human(p: &Plan) -> String {
    let mut o = String::new();
    overview(&mut o, p);
    mounts(&mut o, p);
    files(&mut o, p);
    environment(&mut o, p);
    limits(&mut o, p);
    executor(&mut o, p);
    grants(&mut o, p);
    o
}

/// The profile, command, engine, project, ids and policy files.
fn overview(o: &mut String, p: &Plan) {
    let engine = match p.engine {
        Engine::Native => "native",
        Engine::Podman => "podman",
        Engine::Docker => "docker",
        Engine::Auto => "auto",
        Engine::Kube => "kube",
    };
    let _ = writeln!(o, "profile       {}", p.profile);
    let _ = writeln!(o, "command       {}", p.command.join(" "));
    if let Some(s) = &p.skill {
        let _ = writeln!(
            o,
            "skill         {} (adds: {})",
            s.dir.display(),
            s.args.join(" ")
        );
    }
    let _ = writeln!(o, "engine        {engine}");
    let _ = writeln!(
        o,
        "project       {} ({}; {})",
        p.project.root.display(),
        access(p.project.access),
        p.project.source.describe()
    );
    if let Some(r) = &p.project.review {
        let _ = writeln!(
            o,
            "review        the project is an overlay: writes go to {}, the host's files stay \
             as they are until `corral accept`; the executor is off",
            r.upper.display()
        );
    }
    let _ = writeln!(o, "cwd           {}", p.cwd.display());
    let _ = writeln!(o, "home          {} (private tmpfs)", p.home.display());
    let _ = writeln!(o, "ids           uid {} gid {}", p.uid, p.gid);
    if let Some(i) = &p.image {
        let _ = writeln!(o, "image         {i}");
    }
    let _ = writeln!(
        o,
        "policy files  {}",
        if p.sources.is_empty() {
            "none (built-in defaults and the profile)".to_string()
        } else {
            p.sources
                .iter()
                .map(|s| s.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
}

/// The toolchains and the mounts in the order they apply.
fn mounts(o: &mut String, p: &Plan) {
    if !p.toolchains.is_empty() {
        let list: Vec<String> = p
            .toolchains
            .iter()
            .map(|t| {
                let binds: Vec<String> = t.binds.iter().map(|b| b.display().to_string()).collect();
                format!("{} ({})", t.name, binds.join(", "))
            })
            .collect();
        let _ = writeln!(o, "toolchains    {} (read-only, on PATH)", list.join("; "));
    }
    let _ = writeln!(o, "\nmounts (in order)");
    // The curated system directories are the same in every plan: one line, not forty.
    let system = corral_policy::plan::system_mounts();
    let (sys, rest): (Vec<_>, Vec<_>) = p.mounts.iter().partition(|m| system.contains(m));
    if !sys.is_empty() {
        let _ = writeln!(
            o,
            "  ro    {} system paths (programs, libraries, a curated /etc; see --json), \
             each skipped if missing",
            sys.len()
        );
    }
    let width = rest
        .iter()
        .map(|m| m.target.display().to_string().len())
        .max()
        .unwrap_or(0);
    for m in rest {
        let (kind, src) = match &m.kind {
            MountKind::Tmpfs => ("tmpfs".to_string(), String::new()),
            MountKind::Overlay { upper, .. } => (
                "layer".to_string(),
                format!("  <- {} over {}", upper.display(), m.source.display()),
            ),
            MountKind::Bind(a) => (access(*a).to_string(), {
                if m.source == m.target {
                    String::new()
                } else {
                    format!("  <- {}", m.source.display())
                }
            }),
        };
        let line = format!(
            "  {kind:<5} {:<width$}{src}{}",
            m.target.display(),
            if m.optional {
                "  (skipped if missing)"
            } else {
                ""
            }
        );
        let _ = writeln!(o, "{}", line.trim_end());
    }
}

/// Masked and protected files, and the harness state's layer.
fn files(o: &mut String, p: &Plan) {
    let _ = writeln!(o, "\nmasked (present, empty, unreadable)");
    if p.masked.is_empty() {
        let _ = writeln!(o, "  -");
    }
    for m in &p.masked {
        let _ = writeln!(o, "  {}", m.display());
    }
    let _ = writeln!(o, "\nprotected (read-only, cannot be created)");
    for m in &p.protected {
        let _ = writeln!(o, "  {}", m.display());
    }
    if let Some(state) = &p.harness_state {
        let _ = writeln!(
            o,
            "\nharness state (the host's read-only below corral's layer {}; `corral state diff {}`)",
            state.layer.display(),
            p.profile
        );
        for d in &state.dirs {
            let _ = writeln!(o, "  {}", d.host.display());
        }
        for f in &state.files {
            let _ = writeln!(o, "  {}  <- {}", f.host.display(), f.copy.display());
        }
        if corral_session::hstate::upper_unsupported(&state.layer) {
            let _ = writeln!(
                o,
                "  (its file system cannot hold an overlay's upper directory: a run binds \
                 corral's copy of each state directory, dirs/KEY/copy, instead)"
            );
        }
    }
}

/// The environment, the network and the secrets.
fn environment(o: &mut String, p: &Plan) {
    let _ = writeln!(o, "\nenvironment (nothing else of yours enters)");
    for (k, v) in &p.env {
        if looks_secret(k) {
            let _ = writeln!(o, "  {k}=<hidden, {} characters>", v.chars().count());
        } else {
            let _ = writeln!(o, "  {k}={v}");
        }
    }
    let _ = writeln!(o, "\nnetwork");
    network(o, &p.network, "  ");
    let _ = writeln!(
        o,
        "\nsecrets (the jail sees a placeholder; the gateway adds the value)"
    );
    if p.secrets.is_empty() {
        let _ = writeln!(o, "  -");
    }
    for s in &p.secrets {
        let _ = writeln!(
            o,
            "  {} from ${} for {}",
            s.name,
            s.from_env,
            s.hosts
                .iter()
                .map(|h| h.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// The resource limits and the terminal filter.
fn limits(o: &mut String, p: &Plan) {
    let l = &p.limits;
    let _ = writeln!(
        o,
        "\nlimits        memory {}, cpus {}, pids {}, enforce {}",
        l.memory.map(size).unwrap_or_else(|| "unlimited".into()),
        l.cpus
            .map(|c| c.to_string())
            .unwrap_or_else(|| "unlimited".into()),
        l.pids
            .map(|c| c.to_string())
            .unwrap_or_else(|| "unlimited".into()),
        match l.enforce {
            Enforce::Strict => "strict",
            Enforce::BestEffort => "best-effort",
        }
    );
    let b = l.built_in;
    let built_in: Vec<&str> = [("memory", b.memory), ("cpus", b.cpus), ("pids", b.pids)]
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(n, _)| n)
        .collect();
    if !built_in.is_empty() {
        let _ = writeln!(
            o,
            "  built-in defaults: {} (without a cgroup for them here, a run says so and goes on)",
            built_in.join(", ")
        );
    }
    let _ = writeln!(
        o,
        "terminal      escape sequences that act outside the screen are dropped; clipboard \
         writes (OSC 52) {}",
        if p.terminal.clipboard {
            "pass (terminal.clipboard)"
        } else {
            "dropped"
        }
    );
}

/// Where the agent's commands run, and the executor's own jail.
fn executor(o: &mut String, p: &Plan) {
    let e = &p.executor;
    let target = match &e.target {
        ExecutorTarget::Sandbox => "sandbox (a second jail)".to_string(),
        ExecutorTarget::Compose(s) => format!("compose service {s:?}"),
        ExecutorTarget::Host => "host (UNSANDBOXED, explicitly opted in)".to_string(),
    };
    let _ = writeln!(
        o,
        "\nexecutor      {target}, programs {}, timeout {}s, max output {}, {} at once",
        if e.allow.is_empty() {
            "any".to_string()
        } else {
            e.allow.join(" ")
        },
        e.timeout_ms as f64 / 1000.0,
        size(e.max_output),
        e.max_concurrent
    );
    if let Some(j) = &e.jail {
        let _ = writeln!(
            o,
            "  its jail: project {} ({})",
            j.project.root.display(),
            access(j.project.access)
        );
        for m in j
            .mounts
            .iter()
            .filter(|m| !corral_policy::plan::system_mounts().contains(m))
        {
            if let MountKind::Bind(a) = m.kind {
                let _ = writeln!(o, "    {:<5} {}", access(a), m.target.display());
            }
        }
        network(o, &j.network, "    ");
    }
}

/// What the project's policy file grants and what of it needs trust.
fn grants(o: &mut String, p: &Plan) {
    if !p.project_grants.is_empty() {
        let _ = writeln!(
            o,
            "\nthe project's policy file grants (a repository may be hostile: review these)"
        );
        for g in &p.project_grants {
            let _ = writeln!(o, "  {g}");
        }
    }
    if let Some(t) = p.project_trust.as_ref().filter(|t| !t.grants.is_empty()) {
        let _ = writeln!(
            o,
            "\nneeds your trust ({} of these; `corral trust` accepts this content)\n  {}",
            t.grants.len(),
            super::trust::status(t)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_back() {
        assert_eq!(size(4 << 30), "4g");
        assert_eq!(size(64 << 20), "64m");
        assert_eq!(size(3 << 29), "1.50g");
        assert_eq!(size(1000), "1000 bytes");
    }
}
