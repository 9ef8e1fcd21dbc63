//! `corral plan` and `corral init` run as the real binary, in fresh git projects, with HOME and
//! XDG_CONFIG_HOME pointing at temporary directories.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use corral_policy::Plan;
use corral_policy::domain::DomainPattern;
use corral_policy::plan::{Access, MountKind};
use similar_asserts::assert_eq;

struct Project {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    home: PathBuf,
    xdg: PathBuf,
}

/// A fresh `git init` project with `.env` and `sub/.env`.
fn project() -> Project {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    let root = base.join("proj");
    let home = base.join("home");
    let xdg = base.join("xdg");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&xdg).unwrap();
    let st = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&root)
        .env("HOME", &home)
        .status()
        .expect("git must be installed to run these tests");
    assert!(st.success());
    std::fs::write(root.join(".env"), "OPENAI_API_KEY=sk-real").unwrap();
    std::fs::write(root.join("sub/.env"), "DB_PASSWORD=hunter2").unwrap();
    std::fs::write(root.join(".gitignore"), ".env\n").unwrap();
    Project {
        _tmp: tmp,
        root,
        home,
        xdg,
    }
}

fn corral(p: &Project, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(args)
        .current_dir(&p.root)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &p.home)
        .env("XDG_CONFIG_HOME", &p.xdg)
        .env("TMPDIR", p.home.parent().unwrap())
        .env("TERM", "xterm")
        .env("CORRAL_TEST_CANARY", "canary-must-not-enter")
        .output()
        .unwrap()
}

fn plan_json(p: &Project, args: &[&str]) -> Plan {
    let out = corral(p, args);
    assert!(
        out.status.success(),
        "corral {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn mode_of(plan: &Plan, target: &Path) -> Option<MountKind> {
    plan.mounts
        .iter()
        .rev()
        .find(|m| m.target == target)
        .map(|m| m.kind.clone())
}

#[test]
fn plan_pi_json_in_a_fresh_git_project() {
    let p = project();
    let plan = plan_json(&p, &["plan", "pi", "--json"]);

    assert_eq!(plan.profile, "pi");
    assert_eq!(plan.project.root, p.root);
    assert_eq!(plan.project.access, Access::Rw);
    assert_eq!(mode_of(&plan, &p.root), Some(MountKind::Bind(Access::Rw)));
    // pi's agent directory: the host's read-only below corral's layer.
    let layer = p
        .home
        .join(".local/state/corral/harness/pi/dirs/.pi%2Fagent");
    assert_eq!(
        mode_of(&plan, &p.home.join(".pi/agent")),
        Some(MountKind::Overlay {
            upper: layer.join("upper"),
            work: layer.join("work"),
            above: vec![],
        })
    );
    assert_eq!(mode_of(&plan, &p.home), Some(MountKind::Tmpfs));
    assert_eq!(
        plan.masked,
        vec![p.root.join(".env"), p.root.join("sub/.env")]
    );
    // The project's git files and policy (an absent config.worktree held by a placeholder).
    let agent = p.home.join(".pi/agent");
    let protected = vec![
        p.root.join(".git/config"),
        p.root.join(".git/config.worktree"),
        p.root.join(".git/hooks"),
        p.root.join("corral.toml"),
    ];
    assert_eq!(plan.protected, protected);
    // pi's settings with code keys: called out by `corral state diff`.
    assert_eq!(
        plan.harness_state
            .as_ref()
            .unwrap()
            .code_keys
            .iter()
            .map(|g| g.path.clone())
            .collect::<Vec<_>>(),
        ["settings.json", "auth.json", "models.json"].map(|f| agent.join(f))
    );
    // The executor's variables are what the run attaches (runplan.rs): plan --json shows them.
    let names: Vec<&str> = plan.env.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        vec![
            "ALL_PROXY",
            "CORRAL_EXECUTOR",
            "CORRAL_EXECUTOR_TOKEN_FILE",
            "CORRAL_PROJECT_ROOT",
            "HOME",
            "HTTPS_PROXY",
            "HTTP_PROXY",
            "LANG",
            "NODE_USE_ENV_PROXY",
            "NO_PROXY",
            "PATH",
            "PI_CODING_AGENT_DIR",
            "PI_OFFLINE",
            "TERM",
            "TMPDIR",
            "all_proxy",
            "http_proxy",
            "https_proxy",
            "no_proxy",
        ]
    );
    assert!(!plan.env.values().any(|v| v.contains("canary")));
    for host in [
        "api.anthropic.com",
        "api.openai.com",
        "generativelanguage.googleapis.com",
    ] {
        assert!(
            plan.network
                .allow
                .contains(&DomainPattern::parse(host).unwrap()),
            "{host} not allowed"
        );
    }
}

#[test]
fn plan_prints_a_readable_summary() {
    let p = project();
    let out = corral(&p, &["plan", "pi"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        format!(
            "project       {} (rw; the top level of the enclosing git repository)",
            p.root.display()
        ),
        format!("  {}", p.root.join("sub/.env").display()),
        "mode          proxy".to_string(),
        "limits        memory 4g, cpus 2, pids 1024, enforce strict".to_string(),
        "  built-in defaults: memory, cpus, pids (without a cgroup for them here, a run says so \
         and goes on)"
            .to_string(),
        "terminal      escape sequences that act outside the screen are dropped; clipboard \
         writes (OSC 52) dropped"
            .to_string(),
        "executor      sandbox (a second jail)".to_string(),
    ] {
        assert!(text.contains(&want), "missing {want:?} in:\n{text}");
    }
    assert!(!text.contains("canary"));
}

#[test]
fn bad_policy_files_exit_125_with_file_line_column() {
    let p = project();
    let file = p.root.join("corral.toml");
    for (text, at, what) in [
        (
            "[limits]\nmemroy = \"4g\"\n",
            "2:1",
            "did you mean `memory`?",
        ),
        (
            "[limits]\nmemory = \"4gx\"\n",
            "2:10",
            "invalid size \"4gx\"",
        ),
        (
            "[network]\nallow = [\"api.example.com\", \"evil.com:443.example.com\"]\n",
            "2:29",
            "invalid domain pattern \"evil.com:443.example.com\"",
        ),
    ] {
        std::fs::write(&file, text).unwrap();
        let out = corral(&p, &["plan", "pi"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{text:?}: {stderr}");
        let prefix = format!("corral: {}:{at}: ", file.display());
        assert!(stderr.starts_with(&prefix), "{text:?}: {stderr}");
        assert!(stderr.contains(what), "{text:?}: {stderr}");
    }
}

#[test]
fn init_writes_a_policy_that_loads_back_and_refuses_to_overwrite() {
    let p = project();
    let out = corral(&p, &["init", "pi"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_to_string(p.root.join("corral.toml")).unwrap();
    assert!(written.starts_with("# corral.toml"));
    assert!(written.contains("profile = \"pi\""));

    let plan = plan_json(&p, &["plan", "--json"]);
    assert_eq!(plan.profile, "pi");
    assert_eq!(plan.sources, vec![p.root.join("corral.toml")]);
    // The template grants nothing but the profile it names, and the user's own `init` trusted
    // exactly what it wrote.
    assert_eq!(plan.project_grants.len(), 1, "{:?}", plan.project_grants);
    assert!(
        plan.project_grants[0].starts_with(&format!(
            "{}:10:11: profile = \"pi\" replaces your profile \"shell\": it binds ~/.pi/agent \
             read-write",
            p.root.join("corral.toml").display()
        )),
        "{:?}",
        plan.project_grants
    );
    let trust = plan
        .project_trust
        .as_ref()
        .expect("the project file is gated");
    let store = std::fs::read_to_string(p.xdg.join("corral/trusted.json")).unwrap();
    assert!(store.contains(&trust.sha256), "{store}");

    let again = corral(&p, &["init", "claude"]);
    assert_eq!(again.status.code(), Some(125));
    assert_eq!(
        String::from_utf8_lossy(&again.stderr),
        format!(
            "corral: {} already exists; pass --force to overwrite it\n",
            p.root.join("corral.toml").display()
        )
    );
    let forced = corral(&p, &["init", "claude", "--force"]);
    assert!(forced.status.success());
    assert_eq!(plan_json(&p, &["plan", "--json"]).profile, "claude");
}

#[test]
fn the_user_config_layer_is_read_from_xdg_config_home() {
    let p = project();
    std::fs::create_dir_all(p.xdg.join("corral")).unwrap();
    std::fs::write(
        p.xdg.join("corral/config.toml"),
        "[limits]\nmemory = \"6g\"\n[network]\nallow = [\"user.example.com\"]\n",
    )
    .unwrap();
    std::fs::write(p.root.join("corral.toml"), "[limits]\nmemory = \"5g\"\n").unwrap();
    let plan = plan_json(&p, &["plan", "shell", "--json"]);
    assert_eq!(plan.limits.memory, Some(5 << 30));
    assert_eq!(
        plan.network.allow,
        vec![DomainPattern::parse("user.example.com").unwrap()]
    );
    let plan = plan_json(&p, &["plan", "shell", "--json", "--memory", "1.5g"]);
    assert_eq!(plan.limits.memory, Some(3 << 29));
}

#[test]
fn a_project_file_alone_cannot_turn_on_the_host_executor() {
    let p = project();
    let file = p.root.join("corral.toml");
    std::fs::write(&file, "[executor]\ntarget = \"host\"\n").unwrap();
    let out = corral(&p, &["plan", "--json"]);
    assert_eq!(out.status.code(), Some(125));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "corral: {}:2:10: executor.target = \"host\"",
            file.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("a project's policy file cannot give it"),
        "{stderr}"
    );

    // Smuggling the opt-in into the project file is refused too.
    std::fs::write(&file, "[executor]\ntarget = \"host\"\nallow_host = true\n").unwrap();
    let out = corral(&p, &["plan", "--json"]);
    assert_eq!(out.status.code(), Some(125));

    // The user's own opt-in on the command line.
    std::fs::write(&file, "[executor]\ntarget = \"host\"\n").unwrap();
    let plan = plan_json(&p, &["plan", "--json", "--allow-host-executor"]);
    assert_eq!(
        plan.executor.target,
        corral_policy::plan::ExecutorTarget::Host
    );
}

#[test]
fn plan_with_scratch_leaves_no_directory_behind() {
    let p = project();
    let plan = plan_json(&p, &["plan", "--scratch", "--json"]);
    assert!(plan.project.scratch);
    assert!(plan.project.root.starts_with(p.home.parent().unwrap()));
    assert!(!plan.project.root.exists());
    assert!(plan.sources.is_empty());
}
