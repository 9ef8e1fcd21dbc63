//! The run lifecycle (crates/corral-session): the same session around every backend, and an
//! executor's commands inside the session of their run.
//!
//! Native tests run as root and as an unprivileged user (scripts/test-rootless); the container
//! test needs root and the image `localhost/corral-ci-harness:latest` (ci/podman-setup.sh,
//! ci/docker-setup.sh), like crates/corral/tests/engine_containers.rs.

mod engine_support;
mod jail_support;

use std::process::Command;

use engine_support::{Engine, IMAGE, on_every_engine};
use jail_support::*;

/// The `Jail` events named `event` in the audit log.
fn events(w: &World, event: &str) -> Vec<serde_json::Value> {
    w.audit_records()
        .into_iter()
        .filter(|r| r["kind"] == "jail" && r["event"] == event)
        .collect()
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// An executor command runs inside its run's session: it takes no change baseline (nor git
/// snapshot) of its own, so the run's one change summary lists what the command made, and no
/// second `changes` record (the command jail's own) appears.
#[test]
fn an_executor_command_is_listed_by_its_runs_change_summary_only() {
    let w = World::new();
    let script = "corral exec -- sh -c 'echo x > made-by-executor.txt' && echo END";
    let out = w.sh("none", script);
    ran(&out, "END");
    assert!(
        w.project.join("made-by-executor.txt").exists(),
        "{}",
        out.both()
    );
    let starts = events(&w, "start");
    // The agent's jail and the command's jail each have a session (start and exit records).
    assert_eq!(starts.len(), 2, "{starts:#?}\n{}", out.both());
    let changes = events(&w, "changes");
    assert_eq!(changes.len(), 1, "{changes:#?}\n{}", out.both());
    let outer = &starts[0]["jail"];
    assert_eq!(&changes[0]["jail"], outer, "{changes:#?}\n{starts:#?}");
    assert_eq!(
        strings(&changes[0]["detail"]["created"]),
        ["made-by-executor.txt"]
    );
    assert!(
        out.stderr.contains("made-by-executor.txt"),
        "{}",
        out.both()
    );
}

/// `corral plan --json` is the Plan the jail gets: the start record of a run (the Plan the
/// backend consumed) equals the plan printed before it, without its `attachments` and with the
/// run's jail id and the secret's placeholder (both made when the run starts) put in. The run
/// attaches an executor, the DNS stub's /etc files, a secret's placeholder and the gateway's
/// CA files, and holds a nested repository's config and hooks read-only.
#[test]
fn the_plan_shown_is_the_plan_the_jail_gets() {
    let w = World::new();
    let nested = w.project.join("vendored");
    std::fs::create_dir_all(&nested).unwrap();
    let git = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&nested)
        .env("HOME", &w.home)
        .status()
        .expect("git");
    assert!(git.success());
    let policy = w.outside.join("policy.toml");
    write(
        &policy,
        "[network]\nmode = \"proxy\"\ndns = \"stub\"\nallow = [\"api.example.invalid\"]\n\
         [secrets]\nMY_API_KEY = { from_env = \"CALLER_REAL_KEY\", hosts = [\"api.example.invalid\"] }\n",
    );
    let with_policy = |c: &mut Command| {
        c.arg("--policy")
            .arg(&policy)
            .env("CALLER_REAL_KEY", "sk-test-0123456789abcdef0123456789");
    };
    let mut c = w.corral();
    c.arg("plan");
    with_policy(&mut c);
    c.args(["--json", "--", "sh", "-c", "echo END"]);
    let shown = run(c);
    assert_eq!(shown.code, 0, "{}", shown.both());
    let mut c = w.corral();
    c.arg("run");
    with_policy(&mut c);
    c.args(["--", "sh", "-c", "echo END"]);
    let out = run(c);
    ran(&out, "END");

    let mut shown: serde_json::Value = serde_json::from_str(&shown.stdout).unwrap();
    let attachments = shown
        .as_object_mut()
        .unwrap()
        .remove("attachments")
        .expect("plan --json has the attachments");
    // Each attachment is there (else the comparison below proves little).
    for key in ["secrets", "executor", "dns"] {
        assert!(!attachments[key].is_null(), "no {key}: {attachments:#}");
    }
    let protected = strings(&attachments["git_protected"]);
    assert!(
        protected.iter().any(|p| p.ends_with("vendored/.git/hooks")),
        "{protected:?}"
    );
    let starts = events(&w, "start");
    assert_eq!(starts.len(), 1, "{starts:#?}");
    let consumed = &starts[0]["detail"];
    let jail_id = starts[0]["jail"].as_str().unwrap();
    let placeholder = consumed["env"]["MY_API_KEY"].as_str().unwrap();
    assert!(!placeholder.contains("0123456789abcdef"), "{placeholder}");
    let shown = serde_json::to_string(&shown)
        .unwrap()
        .replace("JAILID", jail_id)
        .replace("<placeholder of $CALLER_REAL_KEY>", placeholder);
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    similar_asserts::assert_eq!(shown, consumed.clone());
}

// ---- Container backends ----------------------------------------------------------------

on_every_engine!(a_container_runs_git_plant_is_disarmed_and_its_changes_listed);

/// `corral run --engine E` in `w`'s project with `script`; the engine objects carry `prefix`.
fn container_run(w: &World, e: Engine, prefix: &str, script: &str) -> Out {
    let mut c = w.corral();
    c.args(["run", "--engine", e.name(), "--", "/bin/bash", "-c", script])
        .env("CORRAL_ENGINE_PREFIX", prefix)
        // The test binary is dynamically linked; the CI image has this host's glibc.
        .env(
            "CORRAL_CONTAINER_BIN",
            std::env::var_os("CORRAL_CONTAINER_BIN")
                .unwrap_or_else(|| corral_bin().into_os_string()),
        );
    run(c)
}

/// The harness container turns a plain directory of the bind-mounted project into a bare
/// repository whose config runs a command (`core.fsmonitor`) on the user's next `git status`
/// there. The session's git check, the same as after a native run, moves that config aside
/// and records it; the change summary lists what the container made.
fn a_container_runs_git_plant_is_disarmed_and_its_changes_listed(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new();
    // The check after the run is what this tests: without the name gate, which would refuse
    // the plant during the run (engine_containers::no_repository_planted_during_the_run_...).
    w.allow_new_repositories();
    let prefix = format!("cs{}{}", &e.name()[..1], std::process::id());
    write(
        &w.project.join("corral.toml"),
        &format!("[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"none\"\n"),
    );
    std::fs::create_dir_all(w.project.join("plain/deeper")).unwrap();
    let fsmon = w.outside.join("fsmonitor-ran");
    let script = format!(
        "set -e; cd plain; mkdir objects refs; echo 'ref: refs/heads/main' > HEAD; \
         printf '[core]\\n\\tbare = true\\n\\tfsmonitor = touch {f}\\n' > config; echo END",
        f = fsmon.display()
    );
    let _down = Down {
        w: &w,
        e,
        prefix: &prefix,
    };
    let out = container_run(&w, e, &prefix, &script);
    ran(&out, "END");
    let plain = w.project.join("plain");
    assert!(
        std::fs::symlink_metadata(plain.join("config")).is_err(),
        "the container's bare-repository config is still in place\n{}",
        out.both()
    );
    assert!(out.stderr.contains("plain/config"), "{}", out.both());
    assert!(out.stderr.contains("moved aside"), "{}", out.both());
    let quarantined = events(&w, "quarantine");
    assert_eq!(quarantined.len(), 1, "{quarantined:#?}");
    let changes = events(&w, "changes");
    assert_eq!(changes.len(), 1, "{changes:#?}\n{}", out.both());
    let created = strings(&changes[0]["detail"]["created"]);
    assert!(
        created.iter().any(|c| c.starts_with("plain/")),
        "{created:?}"
    );
    // Control: with the config put back, the host's git in that directory does take it.
    let aside = std::fs::read_dir(&plain)
        .unwrap()
        .flatten()
        .find(|d| {
            d.file_name()
                .to_string_lossy()
                .starts_with("config.corral-quarantine-")
        })
        .expect("the config was moved aside")
        .path();
    std::fs::rename(aside, plain.join("config")).unwrap();
    let got = w.host_git(&plain.join("deeper"), &["config", "core.fsmonitor"]);
    assert!(
        String::from_utf8_lossy(&got.stdout).contains("touch"),
        "control: git does not take the directory for a repository"
    );
    assert!(!fsmon.exists());
}

/// `corral down` and the networks of the test's prefix, when the test ends (passed or not).
struct Down<'a> {
    w: &'a World,
    e: Engine,
    prefix: &'a str,
}

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let mut c = self.w.corral();
        c.args(["down", "--engine", self.e.name()])
            .env("CORRAL_ENGINE_PREFIX", self.prefix);
        let _ = c.output();
        let nets = self.e.cli(&["network", "ls", "--format", "{{.Name}}"]);
        for n in String::from_utf8_lossy(&nets.stdout).lines() {
            if n.starts_with(self.prefix) {
                self.e.cli(&["network", "rm", n]);
            }
        }
    }
}
