//! The pure builder: a [`Gathered`] made in memory (no file system), the whole [`Plan`] it
//! builds compared against the expected one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use similar_asserts::assert_eq;

use super::build::build;
use super::command::ResolvedCommand;
use super::gather::{Disk, Gathered, Layers, ProjectFile};
use super::layer::{Layer, Loc, NetLayer, PathCtx, Trust};
use super::policy_file::file_layer;
use crate::config::parse_policy;
use crate::domain::DomainPattern;
use crate::plan::{
    Access, CodeKeys, ConfigFormat, Enforce, Engine, ExecutorPlan, ExecutorTarget, GuardedKeys,
    HarnessState, LimitKinds, Limits, Mount, MountKind, NetworkMode, NetworkPlan, Plan,
    ProjectPlan, ProjectSource, ProjectTrust, SecretPlan, SkillPlan, StateDir, StateLayer,
    TerminalPlan, Toolchain, system_mounts,
};

const ROOT: &str = "/work/proj";
const HOME: &str = "/home/u";
const EXE: &str = "/opt/corral/corral";
const USER_CONFIG: &str = "/home/u/.config/corral/config.toml";
const PATH: &str = "/run/corral/bin:/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";
const PROXY: &str = "http://127.0.0.1:3128";

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn pat(s: &str) -> DomainPattern {
    DomainPattern::parse(s).unwrap()
}

fn bind(source: &str, target: &str, access: Access, optional: bool) -> Mount {
    Mount {
        source: p(source),
        target: p(target),
        kind: MountKind::Bind(access),
        optional,
    }
}

fn home_tmpfs() -> Mount {
    Mount {
        source: PathBuf::new(),
        target: p(HOME),
        kind: MountKind::Tmpfs,
        optional: false,
    }
}

fn with_proxy(mut e: BTreeMap<String, String>) -> BTreeMap<String, String> {
    for k in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        e.insert(k.into(), PROXY.into());
    }
    e.insert("NO_PROXY".into(), "localhost,127.0.0.1,::1".into());
    e.insert("no_proxy".into(), "localhost,127.0.0.1,::1".into());
    e.insert("NODE_USE_ENV_PROXY".into(), "1".into());
    e
}

fn user(at: &str) -> Loc {
    Loc::File {
        file: p(USER_CONFIG),
        line: 1,
        col: 1 + at.len(),
    }
}

/// A caller in `ROOT/src` of a git project, running `profile`, with no policy files and a disk
/// that has nothing to say (no toolchains, the command not found, nothing masked).
fn gathered(profile: &str) -> Gathered {
    let profile = crate::profile::profile(profile).unwrap();
    Gathered {
        cwd: p("/work/proj/src"),
        home: p(HOME),
        uid: 1000,
        gid: 1000,
        env: env(&[
            ("TERM", "xterm"),
            ("ANTHROPIC_API_KEY", "sk-ant-real"),
            ("PROJECT_TOKEN", "tok"),
            ("CORRAL_TEST_CANARY", "must-not-enter"),
        ]),
        corral_exe: p(EXE),
        user_config: Some(p(USER_CONFIG)),
        corral_dirs: vec![
            p("/home/u/.config/corral"),
            p("/home/u/.local/state/corral"),
        ],
        profile_arg: Some(profile.name.clone()),
        command_arg: Vec::new(),
        policy_flag: false,
        root: p(ROOT),
        source: ProjectSource::GitTopLevel,
        layers: Layers::default(),
        disk: Disk {
            command: ResolvedCommand {
                argv: profile.command.clone(),
                ..ResolvedCommand::default()
            },
            ..Disk::default()
        },
        profile,
    }
}

fn basics() -> BTreeMap<String, String> {
    env(&[
        ("HOME", HOME),
        ("LANG", "C.UTF-8"),
        ("PATH", PATH),
        ("TERM", "xterm"),
        ("TMPDIR", "/tmp"),
    ])
}

fn no_network(mode: NetworkMode) -> NetworkPlan {
    NetworkPlan {
        mode,
        allow: vec![],
        allow_paths: Vec::new(),
        deny: vec![],
        allow_cidrs: vec![],
        host_ports: vec![],
        publish: vec![],
        upstream_proxy: None,
        dns: Default::default(),
        on_deny: Default::default(),
    }
}

fn default_executor(jail: Option<Box<Plan>>) -> ExecutorPlan {
    ExecutorPlan {
        target: ExecutorTarget::Sandbox,
        allow: vec![],
        timeout_ms: 600_000,
        max_output: 64 << 20,
        max_concurrent: 8,
        jail,
    }
}

/// The built-in `filesystem.hide` patterns.
fn default_hide() -> Vec<String> {
    [".env", ".env.*", "*.pem", "*.key"]
        .map(String::from)
        .to_vec()
}

/// The plan of `shell` with nothing but the built-in defaults, written out whole.
fn shell_plan() -> Plan {
    let mut mounts = system_mounts();
    mounts.push(home_tmpfs());
    mounts.push(bind(ROOT, ROOT, Access::Rw, false));
    mounts.push(bind(EXE, "/run/corral/bin/corral", Access::Ro, false));
    let project = ProjectPlan {
        root: p(ROOT),
        access: Access::Rw,
        scratch: false,
        source: ProjectSource::GitTopLevel,
        policy_file: p("/work/proj/corral.toml"),
        review: None,
    };
    let protected = vec![
        p("/work/proj/.git/config"),
        p("/work/proj/.git/hooks"),
        p("/work/proj/corral.toml"),
    ];
    let limits = Limits {
        memory: Some(4 << 30),
        cpus: Some(2.0),
        pids: Some(1024),
        enforce: Enforce::Strict,
        built_in: LimitKinds {
            memory: true,
            cpus: true,
            pids: true,
        },
    };
    let sandbox = Plan {
        profile: "shell".into(),
        engine: Engine::Native,
        command: vec![],
        cwd: p(ROOT),
        project: project.clone(),
        home: p(HOME),
        uid: 1000,
        gid: 1000,
        mounts: mounts.clone(),
        masked: vec![],
        hide: default_hide(),
        protected: protected.clone(),
        harness_state: None,
        env: basics(),
        network: no_network(NetworkMode::None),
        secrets: vec![],
        signin: vec![],
        limits: limits.clone(),
        executor: default_executor(None),
        skill: None,
        terminal: TerminalPlan::default(),
        image: None,
        sources: vec![],
        project_grants: vec![],
        project_trust: None,
        git: Default::default(),
        toolchains: vec![],
    };
    Plan {
        profile: "shell".into(),
        engine: Engine::Native,
        command: vec!["bash".into()],
        cwd: p("/work/proj/src"),
        project,
        home: p(HOME),
        uid: 1000,
        gid: 1000,
        mounts,
        masked: vec![],
        hide: default_hide(),
        protected,
        harness_state: None,
        env: with_proxy(basics()),
        network: no_network(NetworkMode::Proxy),
        secrets: vec![],
        signin: vec![],
        limits,
        executor: default_executor(Some(Box::new(sandbox))),
        skill: None,
        terminal: TerminalPlan::default(),
        image: Some("localhost/corral-shell:latest".into()),
        sources: vec![],
        project_grants: vec![],
        project_trust: None,
        git: Default::default(),
        toolchains: vec![],
    }
}

#[test]
fn the_built_in_defaults_build_exactly_this_plan() {
    assert_eq!(build(&gathered("shell")).unwrap(), shell_plan());
}

#[test]
fn what_the_disk_said_reaches_both_jails_as_gathered() {
    let mut g = gathered("pi");
    let node = "/home/u/.nvm/versions/node/v22";
    let rust = Toolchain {
        name: "rust".into(),
        binds: vec![p("/home/u/.rustup"), p("/home/u/.cargo")],
        path: vec![p("/home/u/.cargo/bin")],
        env: env(&[("RUSTUP_HOME", "/home/u/.rustup")]),
    };
    g.cwd = p("/elsewhere");
    g.disk = Disk {
        toolchains: vec![rust.clone()],
        toolchain_path: vec![p("/home/u/.cargo/bin")],
        command: ResolvedCommand {
            argv: vec![format!("{node}/lib/node_modules/pi/cli.js")],
            binds: vec![p(&format!("{node}/lib/node_modules/pi")), p(node)],
            path_dirs: vec![p(&format!("{node}/bin"))],
        },
        masked: vec![p("/work/proj/.env")],
        // The agent directory is a symlink into a data disk; the executable is where it is.
        canonical: [(p("/home/u/.pi/agent"), p("/data/pi-agent"))]
            .into_iter()
            .collect(),
        ..Disk::default()
    };
    let plan = build(&g).unwrap();

    let agent_dir = "/home/u/.pi/agent";
    let layer = "/home/u/.local/state/corral/harness/pi";
    let mut expected = shell_plan();
    let mut sandbox = *expected.executor.jail.take().unwrap();
    let tail = |m: &mut Vec<Mount>| m.split_off(system_mounts().len() + 1);
    let project_and_corral = tail(&mut expected.mounts);
    expected.mounts.extend([
        Mount {
            source: p("/data/pi-agent"),
            target: p(agent_dir),
            kind: MountKind::Overlay {
                upper: p(&format!("{layer}/dirs/.pi%2Fagent/upper")),
                work: p(&format!("{layer}/dirs/.pi%2Fagent/work")),
                above: vec![],
            },
            optional: false,
        },
        bind(
            &format!("{node}/lib/node_modules/pi"),
            &format!("{node}/lib/node_modules/pi"),
            Access::Ro,
            false,
        ),
        bind(node, node, Access::Ro, false),
        bind("/home/u/.rustup", "/home/u/.rustup", Access::Ro, true),
        bind("/home/u/.cargo", "/home/u/.cargo", Access::Ro, true),
    ]);
    expected.mounts.extend(project_and_corral.iter().cloned());
    tail(&mut sandbox.mounts);
    sandbox.mounts.extend([
        bind("/home/u/.rustup", "/home/u/.rustup", Access::Ro, true),
        bind("/home/u/.cargo", "/home/u/.cargo", Access::Ro, true),
    ]);
    sandbox.mounts.extend(project_and_corral);

    let path = format!(
        "/run/corral/bin:{node}/bin:/home/u/.cargo/bin:{}",
        &PATH[16..]
    );
    let mut agent_env = with_proxy(basics());
    agent_env.insert("PATH".into(), path);
    agent_env.insert("RUSTUP_HOME".into(), "/home/u/.rustup".into());
    agent_env.insert("PI_CODING_AGENT_DIR".into(), agent_dir.into());
    agent_env.insert("PI_OFFLINE".into(), "1".into());
    // The executor's PATH has the toolchains, not the harness's interpreter; none of pi's own
    // variables; no proxy (its network is none).
    let mut sandbox_env = basics();
    sandbox_env.insert(
        "PATH".into(),
        format!("/run/corral/bin:/home/u/.cargo/bin:{}", &PATH[16..]),
    );
    sandbox_env.insert("RUSTUP_HOME".into(), "/home/u/.rustup".into());

    let masked = vec![p("/work/proj/.env")];
    let guard = |file: &str, keys: GuardedKeys, commands: &[&str]| CodeKeys {
        path: p(agent_dir).join(file),
        format: ConfigFormat::Json,
        keys,
        commands: commands.iter().map(|c| c.to_string()).collect(),
    };
    let code = [
        "packages",
        "extensions",
        "shellPath",
        "shellCommandPrefix",
        "npmCommand",
    ];

    sandbox.profile = "pi".into();
    sandbox.masked = masked.clone();
    sandbox.env = sandbox_env;
    sandbox.toolchains = vec![rust.clone()];
    expected = Plan {
        profile: "pi".into(),
        command: vec![format!("{node}/lib/node_modules/pi/cli.js")],
        // The caller is outside the project: the jail starts at its root.
        cwd: p(ROOT),
        masked,
        harness_state: Some(HarnessState {
            layer: p(layer),
            dirs: vec![StateDir {
                host: p(agent_dir),
                key: ".pi%2Fagent".into(),
                layer: StateLayer::Overlay {
                    upper: p(&format!("{layer}/dirs/.pi%2Fagent/upper")),
                    work: p(&format!("{layer}/dirs/.pi%2Fagent/work")),
                },
            }],
            files: vec![],
            code_paths: ["extensions", "bin", "tools", "git"]
                .map(|c| p(agent_dir).join(c))
                .to_vec(),
            code_keys: vec![
                guard(
                    "settings.json",
                    GuardedKeys::Code(code.map(String::from).to_vec()),
                    &[],
                ),
                guard("auth.json", GuardedKeys::Code(vec![]), &["*.key"]),
                guard("models.json", GuardedKeys::AllBut(vec![]), &[]),
            ],
        }),
        env: agent_env,
        network: NetworkPlan {
            allow: [
                "api.anthropic.com",
                "api.openai.com",
                "generativelanguage.googleapis.com",
                "api.groq.com",
                "api.cerebras.ai",
                "api.x.ai",
                "openrouter.ai",
                "platform.claude.com",
                "chatgpt.com",
                "auth.openai.com",
            ]
            .map(pat)
            .to_vec(),
            ..no_network(NetworkMode::Proxy)
        },
        signin: vec![pi_signin()],
        secrets: vec![SecretPlan {
            name: "ANTHROPIC_API_KEY".into(),
            from_env: "ANTHROPIC_API_KEY".into(),
            hosts: vec![pat("api.anthropic.com")],
        }],
        executor: default_executor(Some(Box::new(sandbox))),
        skill: Some(SkillPlan {
            dir: p("/run/corral/skill"),
            args: vec!["--skill".into(), "/run/corral/skill".into()],
        }),
        image: Some("localhost/corral-pi:latest".into()),
        toolchains: vec![rust],
        ..expected
    };
    assert_eq!(plan, expected);
}

/// The pi profile's `[signin.pi]`, in the order the plan lists providers (by name).
fn pi_signin() -> crate::signin::SigninPlan {
    let provider =
        |id: &str, host: &str, token: Option<(&str, &str)>| crate::signin::ProviderPlan {
            id: id.into(),
            api_hosts: vec![pat(host)],
            token_host: token.map(|(h, _)| pat(h)),
            token_path: token.map(|(_, p)| p.into()),
        };
    crate::signin::SigninPlan {
        name: "pi".into(),
        format: crate::signin::SigninFormat::Pi,
        file: p(HOME).join(".pi/agent/auth.json"),
        api_hosts: vec![],
        token_host: None,
        token_path: None,
        api_key_hosts: vec![],
        providers: vec![
            provider(
                "anthropic",
                "api.anthropic.com",
                Some(("platform.claude.com", "/v1/oauth/token")),
            ),
            provider("cerebras", "api.cerebras.ai", None),
            provider("google", "generativelanguage.googleapis.com", None),
            provider("groq", "api.groq.com", None),
            provider("openai", "api.openai.com", None),
            provider(
                "openai-codex",
                "chatgpt.com",
                Some(("auth.openai.com", "/oauth/token")),
            ),
            provider("openrouter", "openrouter.ai", None),
            provider("xai", "api.x.ai", None),
        ],
    }
}

/// A user layer that gives both jails binds, variables and network of their own.
fn user_layer() -> Layer {
    Layer {
        read_write: vec![(p("/data/shared"), user("rw"))],
        read_only: vec![(p("/work/proj/vendor"), user("ro"))],
        env_pass: vec![
            ("PROJECT_TOKEN".into(), user("pass")),
            ("ANTHROPIC_API_KEY".into(), user("key")),
        ],
        env_set: [("FOO".to_string(), ("1".to_string(), user("set")))]
            .into_iter()
            .collect(),
        exec_read_write: vec![(p("/home/u/.cache/cargo"), user("exec rw"))],
        exec_net: NetLayer {
            mode: Some((NetworkMode::Proxy, user("mode"))),
            allow: vec![(pat("crates.io"), user("allow"))],
            ..NetLayer::default()
        },
        exec_allow: Some(vec!["cargo".into(), "make".into()]),
        exec_timeout_ms: Some(60_000),
        ..Layer::default()
    }
}

#[test]
fn the_executor_sandbox_is_built_from_its_own_inputs() {
    let mut g = gathered("pi");
    g.layers.user = user_layer();
    g.layers.sources = vec![p(USER_CONFIG)];
    // The user config lies below the read-write bind of /data/shared (a dotfiles checkout).
    g.disk.rw_views = [(p(USER_CONFIG), vec![p("/data/shared/corral/config.toml")])]
        .into_iter()
        .collect();
    let plan = build(&g).unwrap();
    let sandbox = plan.executor.jail.as_deref().unwrap();

    let mut mounts = system_mounts();
    mounts.extend([
        home_tmpfs(),
        bind(
            "/home/u/.cache/cargo",
            "/home/u/.cache/cargo",
            Access::Rw,
            true,
        ),
        bind(ROOT, ROOT, Access::Rw, false),
        bind(EXE, "/run/corral/bin/corral", Access::Ro, false),
    ]);
    let mut sandbox_env = with_proxy(basics());
    sandbox_env.insert("PROJECT_TOKEN".into(), "tok".into());
    sandbox_env.insert("FOO".into(), "1".into());
    let mut expected = *shell_plan().executor.jail.unwrap();
    expected.profile = "pi".into();
    expected.mounts = mounts;
    // The policy file a read-write bind exposes is read-only in both jails.
    expected
        .protected
        .push(p("/data/shared/corral/config.toml"));
    expected.protected.sort();
    // A secret's variable never enters, not even when passed by name.
    expected.env = sandbox_env;
    expected.network = NetworkPlan {
        allow: vec![pat("crates.io")],
        allow_paths: Vec::new(),
        ..no_network(NetworkMode::Proxy)
    };
    expected.executor.allow = vec!["cargo".into(), "make".into()];
    expected.executor.timeout_ms = 60_000;
    expected.sources = vec![p(USER_CONFIG)];
    assert_eq!(*sandbox, expected);

    // The agent's jail: its own binds, the project's inside one after the project mount.
    let agent_mounts: Vec<&Mount> = plan.mounts[system_mounts().len()..].iter().collect();
    assert_eq!(
        agent_mounts,
        [
            &home_tmpfs(),
            &Mount {
                source: p("/home/u/.pi/agent"),
                target: p("/home/u/.pi/agent"),
                kind: MountKind::Overlay {
                    upper: p("/home/u/.local/state/corral/harness/pi/dirs/.pi%2Fagent/upper"),
                    work: p("/home/u/.local/state/corral/harness/pi/dirs/.pi%2Fagent/work"),
                    above: vec![],
                },
                optional: false,
            },
            &bind("/data/shared", "/data/shared", Access::Rw, true),
            &bind(ROOT, ROOT, Access::Rw, false),
            &bind(EXE, "/run/corral/bin/corral", Access::Ro, false),
            &bind("/work/proj/vendor", "/work/proj/vendor", Access::Ro, true),
        ]
    );
}

#[test]
fn a_host_executor_needs_the_users_opt_in_and_then_has_no_sandbox() {
    let mut g = gathered("shell");
    g.layers.user.exec_target = Some((ExecutorTarget::Host, user("target")));
    assert_eq!(
        build(&g).unwrap_err().to_string(),
        format!(
            "{USER_CONFIG}:1:7: executor.target = \"host\" runs the agent's commands unsandboxed \
             on your machine and needs an explicit opt-in: set `allow_host = true` under \
             [executor] in your user config ({USER_CONFIG}) or pass --allow-host-executor"
        )
    );
    g.layers.user.exec_allow_host = true;
    let mut expected = shell_plan();
    expected.executor = ExecutorPlan {
        target: ExecutorTarget::Host,
        ..default_executor(None)
    };
    assert_eq!(build(&g).unwrap(), expected);
}

#[test]
fn a_project_file_is_listed_and_gated_where_it_grants_more() {
    let file = p("/work/proj/corral.toml");
    let text = "[network]\nallow = [\"x.example.com\"]\n[limits]\nmemory = \"8g\"\npids = 100\n\
                [filesystem]\nhide = [\"*.secret\"]\n";
    let mut g = gathered("shell");
    let ctx = PathCtx {
        home: Path::new(HOME),
        project: Path::new(ROOT),
        corral_dirs: &g.corral_dirs,
    };
    let mut grants = Vec::new();
    let pf = parse_policy(&file, text).unwrap();
    let layer = file_layer(&file, text, pf, Trust::Project, &ctx, None, &mut grants).unwrap();
    g.layers.grants = grants;
    g.layers.sources = vec![file.clone()];
    g.layers.project = Some(ProjectFile {
        path: file.clone(),
        text: text.into(),
        layer,
    });
    let plan = build(&g).unwrap();

    let allow = format!(
        "{}:2:10: network.allow lets the jail reach x.example.com",
        file.display()
    );
    let memory = format!(
        "{}:4:1: limits.memory raises the limit from 4g to 8g",
        file.display()
    );
    let mut expected = shell_plan();
    expected.network.allow = vec![pat("x.example.com")];
    expected.limits.memory = Some(8 << 30);
    expected.limits.pids = Some(100);
    expected.hide.push("*.secret".into());
    expected.limits.built_in = LimitKinds {
        cpus: true,
        ..LimitKinds::default()
    };
    expected.sources = vec![file.clone()];
    expected.project_grants = vec![allow.clone(), memory.clone()];
    expected.project_trust = Some(ProjectTrust {
        file,
        sha256: crate::trust::sha256_hex(text.as_bytes()),
        grants: vec![allow, memory],
    });
    let sandbox = expected.executor.jail.as_mut().unwrap();
    sandbox.limits = expected.limits.clone();
    sandbox.sources = expected.sources.clone();
    sandbox.hide = expected.hide.clone();
    assert_eq!(plan, expected);
}

#[test]
fn a_preview_of_a_scratch_run_creates_nothing_and_the_run_creates_its_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    let (tmpdir, home) = (base.join("tmp"), base.join("home"));
    for d in [&tmpdir, &home] {
        std::fs::create_dir(d).unwrap();
    }
    let req = super::Request {
        cwd: home.clone(),
        profile: Some("shell".into()),
        command: Vec::new(),
        flags: super::Flags {
            scratch: true,
            ..super::Flags::default()
        },
        env: env(&[
            ("TMPDIR", tmpdir.to_str().unwrap()),
            ("PATH", "/nonexistent-corral-test-bin"),
        ]),
        home,
        uid: 1000,
        gid: 1000,
        corral_exe: base.join("corral"),
        user_config: None,
    };
    let entries = || -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&tmpdir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        v
    };
    let shown = super::preview(&req).unwrap();
    assert!(shown.project.scratch);
    assert_eq!(shown.project.root.parent(), Some(tmpdir.as_path()));
    assert_eq!(
        entries(),
        Vec::<PathBuf>::new(),
        "corral plan created something"
    );
    let ran = super::resolve(&req).unwrap();
    assert_eq!(entries(), vec![ran.project.root.clone()]);
    assert_ne!(ran.project.root, shown.project.root);
}

/// A request for the `shell` profile in `project` with `flags`, nothing else of the caller's.
fn review_request(base: &Path, project: &Path, flags: super::Flags) -> super::Request {
    super::Request {
        cwd: project.to_path_buf(),
        profile: Some("shell".into()),
        command: vec!["/bin/true".into()],
        flags,
        env: env(&[("PATH", "/nonexistent-corral-test-bin")]),
        home: base.join("home"),
        uid: 1000,
        gid: 1000,
        corral_exe: base.join("corral"),
        user_config: None,
    }
}

#[test]
fn review_mode_overlays_the_project_from_corrals_state_directory_and_turns_the_executor_off() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    let project = base.join("proj");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::create_dir_all(base.join("home")).unwrap();
    let plain = super::preview(&review_request(&base, &project, super::Flags::default())).unwrap();
    let flags = super::Flags {
        review: true,
        ..super::Flags::default()
    };
    let reviewed = super::preview(&review_request(&base, &project, flags)).unwrap();
    // The whole difference: the review's directories, no executor jail, no skill, the
    // variable `corral exec` reads.
    let mut expected = plain.clone();
    let dir = base
        .join("home/.local/state/corral/review")
        .join(corral_audit::project_key(&project));
    expected.project.review = Some(crate::plan::ReviewPlan {
        upper: dir.join("upper"),
        work: dir.join("work"),
        dir,
    });
    expected.executor.jail = None;
    expected.skill = None;
    expected.env.insert("CORRAL_REVIEW".into(), "1".into());
    assert_eq!(reviewed, expected);
}

#[test]
fn review_mode_refuses_what_would_write_the_host_project_around_the_overlay() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    let project = base.join("proj");
    std::fs::create_dir_all(project.join("cache")).unwrap();
    std::fs::create_dir_all(base.join("home")).unwrap();
    let refused = |flags: super::Flags| {
        super::preview(&review_request(&base, &project, flags))
            .unwrap_err()
            .to_string()
    };
    let rw = refused(super::Flags {
        review: true,
        rw: vec![project.join("cache")],
        ..super::Flags::default()
    });
    assert!(
        rw.contains("cache is bound read-write below the project"),
        "{rw}"
    );
    let scratch = refused(super::Flags {
        review: true,
        scratch: true,
        ..super::Flags::default()
    });
    assert!(scratch.contains("nothing to review"), "{scratch}");
    // Control: the same flags without review resolve.
    assert!(
        super::preview(&review_request(
            &base,
            &project,
            super::Flags {
                rw: vec![project.join("cache")],
                ..super::Flags::default()
            }
        ))
        .is_ok()
    );
}
