//! Building: the [`Plan`] as a pure function of what [`gather`](super::gather) found. The same
//! functions build the agent's jail and the executor's sandbox ([`Side`]), each from its own
//! inputs; the built-in defaults they fall back to are `layer.rs`'s.

mod env;
mod mounts;
mod network;

use std::path::{Path, PathBuf};

use crate::error::PolicyError;
use crate::plan::{
    ExecutorPlan, ExecutorTarget, LimitKinds, Limits, Plan, ProjectPlan, ProjectSource,
    ProjectTrust, SkillPlan, TerminalPlan,
};

use super::SKILL_DIR;
use super::gather::Gathered;
use super::grants::{TrustInput, profile_switch_text, trust_grants};
use super::layer::{
    BUILTIN, DEFAULT_ENFORCE, DEFAULT_ENGINE, DEFAULT_EXEC_MAX_CONCURRENT, DEFAULT_EXEC_MAX_OUTPUT,
    DEFAULT_EXEC_TIMEOUT_MS, DEFAULT_PROJECT_ACCESS, Layer, Loc, defaults, profile_layer,
};

pub use env::proxy_env;
pub(super) use mounts::bind_sources;

/// The merged policy: every layer over the defaults, the same without the project's file (what
/// the user's own word gives), and which limits are still the built-in ones.
pub(super) struct Policy {
    pub(super) merged: Layer,
    pub(super) without: Layer,
    pub(super) built_in: LimitKinds,
}

/// Which jail of a run is being built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    /// The agent's jail: the harness, its state, its command, secrets and skill.
    Agent,
    /// The executor's sandbox: the project, the toolchains, its own binds and network; no
    /// secrets, no harness state, no executor of its own.
    Executor,
}

/// Merge the layers, lowest first: built-in defaults, the harness profile, the user config, the
/// project's file, the flags. Lists accumulate; scalars of a higher layer win.
pub(super) fn merge(g: &Gathered) -> Policy {
    let l = &g.layers;
    let none = Layer::default();
    let project = l.project.as_ref().map(|p| &p.layer).unwrap_or(&none);
    let profile = profile_layer(&g.profile, &g.home);
    let mut without = defaults();
    without.merge(profile.clone());
    without.merge(l.user.clone());
    without.merge(l.flags.clone());
    let mut merged = defaults();
    merged.merge(profile);
    merged.merge(l.user.clone());
    merged.merge(project.clone());
    merged.merge(l.flags.clone());
    Policy {
        merged,
        without,
        built_in: built_in_limits(&[&l.user, project, &l.flags]),
    }
}

/// The plan of a run: the agent's jail, with the executor's sandbox inside it.
pub(super) fn build(g: &Gathered) -> Result<Plan, PolicyError> {
    let p = merge(g);
    let mut plan = jail(g, &p, Side::Agent)?;
    if p.merged.review {
        review(g, &mut plan)?;
    }
    Ok(plan)
}

/// Review mode: the project becomes an overlay over corral's review directories, and nothing
/// else of the run may write the host's project: no executor (its commands would run on the
/// host's project, outside the overlay) and no read-write bind below the project.
fn review(g: &Gathered, plan: &mut Plan) -> Result<(), PolicyError> {
    let refuse = |why: String| Err(PolicyError::Invalid(format!("--review: {why}")));
    if plan.project.scratch {
        return refuse(
            "a --scratch project is removed when the run ends; there is nothing to review".into(),
        );
    }
    if plan.project.access != crate::plan::Access::Rw {
        return refuse(
            "the project is read-only (filesystem.project = \"ro\"); there is nothing to review"
                .into(),
        );
    }
    match &plan.executor.target {
        ExecutorTarget::Sandbox => {}
        ExecutorTarget::Host | ExecutorTarget::Compose(_) => {
            return refuse(format!(
                "executor.target = {:?} runs commands on the host's project, outside the review; \
                 use the default executor (\"sandbox\") or run without --review",
                match &plan.executor.target {
                    ExecutorTarget::Host => "host".to_string(),
                    ExecutorTarget::Compose(s) => format!("compose:{s}"),
                    ExecutorTarget::Sandbox => "sandbox".to_string(),
                }
            ));
        }
    }
    let root = plan.project.root.clone();
    if let Some(m) = plan.mounts.iter().find(|m| {
        m.kind == crate::plan::MountKind::Bind(crate::plan::Access::Rw)
            && m.source != root
            && m.source.starts_with(&root)
    }) {
        return refuse(format!(
            "{} is bound read-write below the project: its writes would reach the host's \
             project directly; bind it read-only or run without --review",
            m.source.display()
        ));
    }
    // The executor's commands run in a jail of their own over the host's project: off in
    // review mode (docs/review.md), and so is the skill that teaches the harness to use it.
    plan.executor.jail = None;
    plan.skill = None;
    // What `corral exec` in the jail says instead of looking for an executor (cmd/exec.rs).
    plan.env.insert("CORRAL_REVIEW".into(), "1".into());
    let state = crate::trust::state_dir(&g.env, &g.home);
    plan.project.review = Some(crate::plan::ReviewPlan::for_project(&state, &root));
    Ok(())
}

/// The plan of one jail.
fn jail(g: &Gathered, p: &Policy, side: Side) -> Result<Plan, PolicyError> {
    let m = &p.merged;
    let agent = side == Side::Agent;
    let target = executor_target(g, m, side)?;
    let network = network::network(m, side)?;
    let secrets = env::secrets(g, m);
    let env = env::env(g, m, side, &network, &secrets);
    let (project_grants, project_trust) = match side {
        Side::Agent => project_grants(g, p),
        Side::Executor => (Vec::new(), None),
    };
    Ok(Plan {
        profile: g.profile.name.clone(),
        engine: m.engine.unwrap_or(DEFAULT_ENGINE),
        command: if agent {
            g.disk.command.argv.clone()
        } else {
            Vec::new()
        },
        cwd: if agent && g.cwd.starts_with(&g.root) {
            g.cwd.clone()
        } else {
            g.root.clone()
        },
        project: project_plan(g, m),
        home: g.home.clone(),
        uid: g.uid,
        gid: g.gid,
        mounts: mounts::mounts(g, m, side),
        masked: g.disk.masked.clone(),
        hide: dedup(m.hide.iter().map(|(h, _)| h.clone())),
        protected: mounts::protected(g, m),
        harness_state: if agent {
            mounts::harness_state(g, m)
        } else {
            None
        },
        env,
        network,
        secrets: if agent {
            secrets.into_values().collect()
        } else {
            Vec::new()
        },
        signin: if agent { env::signin(g, m) } else { Vec::new() },
        limits: limits(p),
        executor: executor(g, p, side, target)?,
        skill: if agent { skill(g, m) } else { None },
        terminal: TerminalPlan {
            clipboard: agent && m.clipboard.unwrap_or(false),
        },
        image: if agent { m.image.clone() } else { None },
        sources: g.layers.sources.clone(),
        project_grants,
        project_trust,
        toolchains: g.disk.toolchains.clone(),
        git: crate::plan::GitPlan {
            dirs: Vec::new(),
            new_repositories: m.allow_new_repositories,
        },
    })
}

/// The limits still at their built-in values once `layers` (the user config, the project's
/// file, the flags) are merged over the defaults. None when one of them sets `limits.enforce`:
/// then every limit follows it.
fn built_in_limits(layers: &[&Layer]) -> LimitKinds {
    if layers.iter().any(|l| l.enforce.is_some()) {
        return LimitKinds::default();
    }
    let defaults = defaults();
    LimitKinds {
        memory: defaults.memory.is_some() && layers.iter().all(|l| l.memory.is_none()),
        cpus: defaults.cpus.is_some() && layers.iter().all(|l| l.cpus.is_none()),
        pids: defaults.pids.is_some() && layers.iter().all(|l| l.pids.is_none()),
    }
}

fn limits(p: &Policy) -> Limits {
    let m = &p.merged;
    Limits {
        memory: m.memory,
        cpus: m.cpus,
        pids: m.pids,
        enforce: m.enforce.unwrap_or(DEFAULT_ENFORCE),
        built_in: p.built_in,
    }
}

fn project_plan(g: &Gathered, m: &Layer) -> ProjectPlan {
    ProjectPlan {
        root: g.root.clone(),
        access: m.project_access.unwrap_or(DEFAULT_PROJECT_ACCESS),
        scratch: g.source == ProjectSource::Scratch,
        source: g.source,
        policy_file: g.project_policy_path(),
        review: None,
    }
}

/// Where the agent's commands run. The opt-in for the host comes from the user config or a
/// flag only (a project's file is refused when it sets `allow_host`).
fn executor_target(g: &Gathered, m: &Layer, side: Side) -> Result<ExecutorTarget, PolicyError> {
    if side == Side::Executor {
        return Ok(ExecutorTarget::Sandbox);
    }
    let (target, at) = m
        .exec_target
        .clone()
        .unwrap_or((ExecutorTarget::Sandbox, Loc::Builtin(BUILTIN.into())));
    if target != ExecutorTarget::Host || m.exec_allow_host {
        return Ok(target);
    }
    let project_file = g.layers.project.as_ref().map(|p| &p.path);
    let from_project = matches!(&at, Loc::File { file, .. } if Some(file) == project_file);
    Err(at.error(format!(
        "executor.target = \"host\" runs the agent's commands unsandboxed on your machine and \
         needs an explicit opt-in{}: set `allow_host = true` under [executor] in your user \
         config ({}) or pass --allow-host-executor",
        if from_project {
            "; a project's policy file cannot give it (the repository could be hostile)"
        } else {
            ""
        },
        g.user_config
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "$XDG_CONFIG_HOME/corral/config.toml".into())
    )))
}

/// The executor of one jail: the agent's has the sandbox (when its target is one) as its jail;
/// the sandbox has none.
fn executor(
    g: &Gathered,
    p: &Policy,
    side: Side,
    target: ExecutorTarget,
) -> Result<ExecutorPlan, PolicyError> {
    let m = &p.merged;
    let jail = match (side, &target) {
        (Side::Agent, ExecutorTarget::Sandbox) => Some(Box::new(jail(g, p, Side::Executor)?)),
        _ => None,
    };
    Ok(ExecutorPlan {
        target,
        allow: m.exec_allow.clone().unwrap_or_default(),
        timeout_ms: m.exec_timeout_ms.unwrap_or(DEFAULT_EXEC_TIMEOUT_MS),
        max_output: m.exec_max_output.unwrap_or(DEFAULT_EXEC_MAX_OUTPUT),
        max_concurrent: m.exec_max_concurrent.unwrap_or(DEFAULT_EXEC_MAX_CONCURRENT),
        jail,
    })
}

/// The command: `-- CMD`, else the policy's `run.command`, else the profile's.
pub(super) fn argv(g: &Gathered, m: &Layer) -> Vec<String> {
    if !g.command_arg.is_empty() {
        g.command_arg.clone()
    } else {
        m.command
            .clone()
            .unwrap_or_else(|| g.profile.command.clone())
    }
}

/// The executor skill, for the profile's own command. `-- CMD` that runs the profile's own
/// program (`corral run pi -- pi ARGS`, as a shim does) is the profile's command with
/// arguments: it keeps the skill.
fn skill(g: &Gathered, m: &Layer) -> Option<SkillPlan> {
    let name = |s: &String| Path::new(s).file_name().map(|n| n.to_os_string());
    let own_program = |c: &[String]| {
        matches!((c.first().and_then(name), g.profile.command.first().and_then(name)),
                 (Some(a), Some(b)) if a == b)
    };
    let custom = m.command.is_some() || !(g.command_arg.is_empty() || own_program(&g.command_arg));
    match (&g.profile.skill_args, custom) {
        (Some(args), false) => Some(SkillPlan {
            dir: PathBuf::from(SKILL_DIR),
            args: args.iter().map(|a| a.replace("{dir}", SKILL_DIR)).collect(),
        }),
        _ => None,
    }
}

/// The profile the user's own word (flags, user config, the default) would give.
fn users_profile(g: &Gathered) -> String {
    g.profile_arg
        .clone()
        .or_else(|| g.layers.user.profile.as_ref().map(|(n, _)| n.clone()))
        .unwrap_or_else(|| "shell".to_string())
}

/// What the policy files grant (`corral plan` lists it), and what of the project's own
/// `corral.toml` needs the user's trust: relaxed limits, modes and allowlists too.
fn project_grants(g: &Gathered, p: &Policy) -> (Vec<String>, Option<ProjectTrust>) {
    let mut grants = g.layers.grants.clone();
    let Some(pf) = &g.layers.project else {
        return (grants, None);
    };
    let input = TrustInput {
        file: &pf.path,
        text: &pf.text,
        project: &pf.layer,
        with: &p.merged,
        without: &p.without,
        root: &g.root,
        real: &g.disk.real,
    };
    let mut gated: Vec<String> = trust_grants(&input)
        .into_iter()
        .map(|(at, text)| format!("{at}: {text}"))
        .collect();
    // A profile the project file switches to brings that harness's state directories
    // (read-write: its settings, hooks and credentials), its variables, secrets and hosts.
    let users = users_profile(g);
    if let Some((name, at)) = &pf.layer.profile
        && *name != users
        && g.profile_arg.is_none()
    {
        gated.insert(0, profile_switch_text(at, &g.profile, &users));
    }
    for line in &gated {
        if !grants.contains(line) {
            grants.push(line.clone());
        }
    }
    // Only the project's own corral.toml is gated: a `--policy` file is one the user named.
    let trust = (!g.policy_flag).then(|| ProjectTrust {
        file: pf.path.clone(),
        sha256: crate::trust::sha256_hex(pf.text.as_bytes()),
        grants: gated,
    });
    (grants, trust)
}

/// Each item once, in first-seen order.
pub(super) fn dedup<T: PartialEq + Clone>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}
