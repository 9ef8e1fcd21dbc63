//! The trust gate: a project's own corral.toml that grants what only the user may grant is
//! refused by `corral run`/`shell` (exit 125, each grant listed at its place) until the user ran
//! `corral trust` on exactly that content. The real binary, real jails, in fresh git projects
//! with HOME and XDG_CONFIG_HOME in temporary directories.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

struct Project {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
    home: PathBuf,
    xdg: PathBuf,
}

fn project() -> Project {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    let root = base.join("proj");
    let home = base.join("home");
    let xdg = base.join("xdg");
    for d in [&root, &home, &xdg] {
        std::fs::create_dir_all(d).unwrap();
    }
    let st = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&root)
        .env("HOME", &home)
        .status()
        .expect("git must be installed to run these tests");
    assert!(st.success());
    Project {
        _tmp: tmp,
        base,
        root,
        home,
        xdg,
    }
}

impl Project {
    fn file(&self) -> PathBuf {
        self.root.join("corral.toml")
    }

    fn policy(&self, text: &str) {
        std::fs::write(self.file(), text).unwrap();
    }

    fn store(&self) -> PathBuf {
        self.xdg.join("corral/trusted.json")
    }

    fn corral(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_corral"))
            .args(args)
            .current_dir(&self.root)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", &self.xdg)
            .env("TMPDIR", &self.base)
            .env("LANG", "C.UTF-8")
            .env("CALLER_TOKEN", "caller-token-value-0123")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
}

fn text(o: &Output) -> String {
    format!(
        "code {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// [secrets], host_ports, env.pass and a relaxed `limits.enforce`, each at a known place.
const HOSTILE: &str = "[env]
pass = [\"CALLER_TOKEN\"]
[network]
host_ports = [5432]
[secrets]
API = { from_env = \"CALLER_TOKEN\", hosts = [\"evil.example.com\"] }
[limits]
enforce = \"best-effort\"
";

fn hostile_grants(file: &Path) -> Vec<String> {
    let d = file.display();
    vec![
        format!("{d}:2:9: env.pass hands your CALLER_TOKEN to the jail"),
        format!("{d}:4:15: network.host_ports connects the jail to your 127.0.0.1:5432"),
        format!("{d}:6:7: secrets.API sends your CALLER_TOKEN to evil.example.com"),
        format!(
            "{d}:8:1: limits.enforce = \"best-effort\" runs the jail even where a limit cannot be \
             enforced (your settings say \"strict\": refuse)"
        ),
    ]
}

/// A run that leaves a marker in the project when (and only when) its command really ran.
fn run_marked(p: &Project, marker: &str) -> Output {
    p.corral(&[
        "run",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        &format!("echo ran > {marker}"),
    ])
}

#[test]
fn a_hostile_project_file_is_refused_with_each_grant_until_trusted() {
    let p = project();
    p.policy(HOSTILE);
    let out = run_marked(&p, "ran1");
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let err = stderr(&out);
    for g in hostile_grants(&p.file()) {
        assert!(err.contains(&g), "missing {g:?} in:\n{err}");
    }
    assert!(err.contains("is not trusted"), "{err}");
    assert!(
        err.contains(&format!("corral trust {}", p.root.display())),
        "{err}"
    );
    assert!(!p.root.join("ran1").exists(), "the command ran");
    // `corral shell` starts the same jail: refused alike.
    let out = p.corral(&["shell", "--network", "none"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(stderr(&out).contains("is not trusted"), "{}", text(&out));

    // The user reviews and trusts it: the grants are shown, the run goes ahead.
    let out = p.corral(&["trust"]);
    assert!(out.status.success(), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    for g in hostile_grants(&p.file()) {
        assert!(shown.contains(&g), "missing {g:?} in:\n{shown}");
    }
    let store = std::fs::read_to_string(p.store()).unwrap();
    let sha = corral_policy::trust::sha256_hex(HOSTILE.as_bytes());
    assert!(store.contains(&sha), "{store}");
    assert!(store.contains(&p.file().display().to_string()), "{store}");
    let out = run_marked(&p, "ran2");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(p.root.join("ran2").exists());

    // An edited file is another content: refused again, and said so.
    p.policy(&format!("{HOSTILE}# edited\n"));
    let out = run_marked(&p, "ran3");
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        stderr(&out).contains("changed since you trusted it"),
        "{}",
        text(&out)
    );
    assert!(!p.root.join("ran3").exists(), "the command ran");
    let out = p.corral(&["trust", "--list"]);
    assert!(out.status.success(), "{}", text(&out));
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains(&p.file().display().to_string()), "{listed}");
    assert!(listed.contains("CHANGED since trusted"), "{listed}");

    // Trusted again, then revoked: refused once more.
    assert!(p.corral(&["trust"]).status.success());
    assert_eq!(run_marked(&p, "ran4").status.code(), Some(0));
    let out = p.corral(&["trust", "--revoke"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = run_marked(&p, "ran5");
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(!p.root.join("ran5").exists());
    let out = p.corral(&["trust", "--list"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("no trusted project policy files"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_project_file_that_only_narrows_runs_without_trust() {
    let p = project();
    p.policy(
        "profile = \"shell\"
[filesystem]
project = \"ro\"
hide = [\"*.sqlite\"]
protect = [\"Makefile\"]
[env]
set = { RUST_LOG = \"debug\" }
[network]
mode = \"none\"
deny = [\"gist.github.com\"]
[limits]
memory = \"1g\"
pids = 200
[executor]
allow = [\"cargo\"]
timeout = \"1m\"
",
    );
    // Limits best-effort from the command line (the user's word), so a host without cgroup
    // access runs it too.
    let out = p.corral(&[
        "run",
        "--enforce",
        "best-effort",
        "--",
        "sh",
        "-c",
        "echo NARROW-RAN; echo x > w 2>/dev/null || echo read-only",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("NARROW-RAN"), "{}", text(&out));
    assert!(stdout.contains("read-only"), "{}", text(&out));
    assert!(!p.store().exists(), "nothing was trusted");
}

#[test]
fn a_policy_file_named_with_the_flag_is_not_gated() {
    let p = project();
    let other = p.base.join("mine.toml");
    std::fs::write(&other, HOSTILE).unwrap();
    let out = p.corral(&[
        "run",
        "--policy",
        other.to_str().unwrap(),
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        "echo POLICY-RAN",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("POLICY-RAN"));
    // The way out the refusal names: the user's own settings only.
    p.policy(HOSTILE);
    let out = p.corral(&[
        "run",
        "--policy",
        "/dev/null",
        "--enforce",
        "best-effort",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        "echo NULL-RAN",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("NULL-RAN"));
}

#[test]
fn plan_shows_what_needs_trust_and_whether_it_is_trusted() {
    let p = project();
    p.policy(HOSTILE);
    let out = p.corral(&["plan"]);
    assert!(out.status.success(), "{}", text(&out));
    let human = String::from_utf8_lossy(&out.stdout);
    assert!(human.contains("needs your trust (4 of these"), "{human}");
    assert!(human.contains("NOT trusted"), "{human}");
    let out = p.corral(&["plan", "--json"]);
    let plan: corral_policy::Plan = serde_json::from_slice(&out.stdout).unwrap();
    let t = plan.project_trust.unwrap();
    assert_eq!(t.file, p.file());
    assert_eq!(
        t.sha256,
        corral_policy::trust::sha256_hex(HOSTILE.as_bytes())
    );
    assert_eq!(t.grants, hostile_grants(&p.file()));

    assert!(p.corral(&["trust"]).status.success());
    let human = String::from_utf8_lossy(&p.corral(&["plan"]).stdout).into_owned();
    assert!(human.contains("trusted (this content"), "{human}");
    // `corral trust` on a file that is not the project's corral.toml says why not.
    let other = p.root.join("other.toml");
    std::fs::write(&other, HOSTILE).unwrap();
    let out = p.corral(&["trust", other.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(
        stderr(&out).contains("is not the project's corral.toml"),
        "{}",
        text(&out)
    );
}

#[test]
fn the_users_own_allow_keeps_a_trusted_file_trusted_and_an_untrusted_one_untrusted() {
    let p = project();
    // A file the user trusted, then edited by the user's own `corral allow`: still trusted.
    p.policy("[network]\nmode = \"proxy\"\nhost_ports = [11434]\n");
    assert!(p.corral(&["trust"]).status.success());
    let allow = p.corral(&["allow", "example.org"]);
    assert!(allow.status.success(), "{}", text(&allow));
    let run = p.corral(&["run", "--enforce", "best-effort", "--", "true"]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run));

    // A hostile file nobody trusted: `corral allow` does not launder the rest of it.
    p.policy("[env]\npass = [\"CALLER_TOKEN\"]\n");
    let allow = p.corral(&["allow", "example.com"]);
    assert!(allow.status.success(), "{}", text(&allow));
    let run = p.corral(&["run", "--enforce", "best-effort", "--", "true"]);
    assert_eq!(run.status.code(), Some(125), "{}", text(&run));
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("CALLER_TOKEN"),
        "{}",
        text(&run)
    );
}
