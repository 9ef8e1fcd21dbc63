//! `corral init [PROFILE]`: write a commented `corral.toml` at the project root.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{Context, bail};
use corral_policy::profile::{Profile, profile};
use corral_policy::resolve::project_root;

use crate::cli::InitArgs;

pub fn run(args: InitArgs) -> anyhow::Result<ExitCode> {
    let name = args.profile.as_deref().unwrap_or("shell");
    let p = profile(name)?;
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let root = project_root(&cwd);
    let path = root.join("corral.toml");
    if args.compose && path.exists() && !args.force {
        // --compose on a project that has its policy already: only the compose service.
        corral_run::engine::init_compose_for(args.profile.clone())?;
        return Ok(ExitCode::SUCCESS);
    }
    let text = template(&p);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true);
    if args.force {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let mut f = match opts.open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => bail!(
            "{} already exists; pass --force to overwrite it",
            path.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
    };
    f.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))?;
    drop(f);
    // The user's own command wrote it: what it grants (the profile) needs no second question.
    super::trust::carry_over(&path, None)?;
    eprintln!(
        "corral: wrote {} for profile {}; review it with `corral plan {}`",
        path.display(),
        p.name,
        p.name
    );
    if args.compose {
        corral_run::engine::init_compose_for(args.profile.clone())?;
    }
    Ok(ExitCode::SUCCESS)
}

fn quoted(items: &[String]) -> String {
    items
        .iter()
        .map(|i| format!("{i:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The commented policy for profile `p`: every section of SPEC section 3, the defaults written
/// out or shown in comments.
pub fn template(p: &Profile) -> String {
    let hosts: Vec<String> = p.allow.iter().map(|a| a.to_string()).collect();
    let example_secret = p
        .secrets
        .iter()
        .next()
        .map(|(name, s)| {
            format!(
                "# {name} = {{ from_env = {:?}, hosts = [{}] }}\n",
                s.from_env.0,
                quoted(&s.hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>())
            )
        })
        .unwrap_or_else(|| {
            "# API_KEY = { from_env = \"API_KEY\", hosts = [\"api.example.com\"] }\n".to_string()
        });
    format!(
        r#"# corral.toml: what an agent jailed by `corral run` may see, reach and use in this project.
# Layers, lowest first: built-in defaults < harness profile < your user config
# ($XDG_CONFIG_HOME/corral/config.toml) < this file < command-line flags. Lists add up across
# layers; single values of a higher layer win. `corral plan` prints the result.
#
# This file belongs to the repository, so corral trusts it less than your own config: it is
# read-only inside the jail, and it cannot enable an unsandboxed executor, host networking, or
# binds of your home, credentials or shell start-up files on its own.

profile = "{name}"                     # pi | claude | codex | gemini | opencode | aider | shell

[run]
# command = [{command}]        # the profile's default
engine = "native"                   # native | podman | docker | auto
# image = "{image}"

[filesystem]
project = "rw"                      # the git root (else the cwd), mounted at its own path
read_only = []                      # e.g. ["~/.gitconfig"]
read_write = []                     # e.g. ["~/.cache/pip"]
# Masked inside the project (present, empty, unreadable); these four are always masked.
hide = [".env", ".env.*", "*.pem", "*.key"]
# Read-only inside the project; this corral.toml always is.
protect = [".git/hooks", ".git/config"]

[env]
pass = []                           # your variables, by name; nothing else enters
set = {{}}                            # e.g. {{ PGHOST = "postgres" }}

[network]
mode = "proxy"                      # none | proxy | host (host: only from your user config or --network host)
# The {name} profile already allows: {hosts}
allow = []                          # e.g. ["*.github.com", "registry.example.com:443"]
deny = []                           # deny wins over allow
allow_cidrs = []                    # private, loopback, link-local, ...: denied unless listed
host_ports = []                     # e.g. [11434]: the jail's 127.0.0.1:11434 is the host's
publish = []                        # e.g. [3000]: host 127.0.0.1:3000 reaches the jail's port
# upstream_proxy = "http://proxy.corp:3128"

[secrets]                           # the jail sees a placeholder; the real value goes only to the hosts
{example_secret}
[limits]
memory = "4g"                       # Node harnesses need more than 512m
cpus = 2.0
pids = 1024
enforce = "strict"                  # strict: refuse to run if a limit cannot be enforced | best-effort

[executor]
target = "sandbox"                  # sandbox | compose:SERVICE | host (host: only with your opt-in)
allow = []                          # programs allowed, e.g. ["cargo", "npm", "make"]; empty: any
timeout = "10m"
max_output = "64m"
max_concurrent = 8

[executor.sandbox]                  # where `corral exec` commands run when target = "sandbox"
read_only = []
read_write = []                     # e.g. ["~/.cargo/registry", "~/.npm"]
network = {{ mode = "none", allow = [] }}

[terminal]
clipboard = false                   # true: the jail's OSC 52 escape sequences may write your clipboard
"#,
        name = p.name,
        command = quoted(&p.command),
        image = p.image,
        hosts = if hosts.is_empty() {
            "nothing".to_string()
        } else {
            hosts.join(", ")
        },
        example_secret = example_secret,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_template_loads_back() {
        for name in corral_policy::profile::names() {
            let p = profile(name).unwrap();
            let text = template(&p);
            corral_policy::config::parse_policy(std::path::Path::new("corral.toml"), &text)
                .unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        }
    }
}
