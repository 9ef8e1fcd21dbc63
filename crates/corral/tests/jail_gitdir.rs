//! `.git/commondir` written by the jail would make the user's next git command on the host read
//! a repository the jail made (its config, hooks, `core.fsmonitor`): corral moves it aside when
//! the jail ends and says so. Runs as root and, through scripts/test-rootless, unprivileged.

mod jail_support;

use std::process::Command;

use jail_support::*;

fn host_git(w: &World, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .args(args)
        .current_dir(&w.project)
        .env("HOME", &w.home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("git")
}

#[test]
fn a_commondir_planted_by_the_jail_is_moved_aside_before_the_host_runs_git() {
    let w = World::new();
    let out = w.sh(
        "none",
        "git init -q --bare evil && git config -f evil/config core.fsmonitor 'planted-by-jail' \
         && printf '../evil\\n' > .git/commondir && echo PLANTED; \
         git config --get core.fsmonitor; echo END",
    );
    ran(&out, "END");
    // The attack really works inside: git already reads the planted repository's config.
    assert!(out.stdout.contains("PLANTED"), "{}", out.both());
    assert!(out.stdout.contains("planted-by-jail"), "{}", out.both());
    // On the host afterwards: no commondir, the project's own config again, and the move
    // reported on stderr and in the audit log.
    assert!(
        std::fs::symlink_metadata(w.project.join(".git/commondir")).is_err(),
        "{}",
        out.both()
    );
    let got = host_git(&w, &["config", "--get", "core.fsmonitor"]);
    assert!(
        !String::from_utf8_lossy(&got.stdout).contains("planted-by-jail"),
        "the host's git reads the jail's repository"
    );
    assert!(host_git(&w, &["status", "--short"]).status.success());
    assert!(out.stderr.contains(".git/commondir"), "{}", out.both());
    assert!(out.stderr.contains("moved aside"), "{}", out.both());
    let quarantined: Vec<_> = std::fs::read_dir(w.project.join(".git"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("commondir.corral-quarantine-")
        })
        .collect();
    assert_eq!(quarantined.len(), 1);
    let recs = w.audit_records();
    assert!(
        recs.iter()
            .any(|r| r["kind"] == "jail" && r["event"] == "quarantine"),
        "{recs:#?}"
    );
}

#[test]
fn a_run_that_leaves_git_alone_moves_nothing() {
    let w = World::new();
    let out = w.sh("none", "git status --short >/dev/null && echo END");
    ran(&out, "END");
    assert!(!out.stderr.contains("moved aside"), "{}", out.both());
    let names: Vec<String> = std::fs::read_dir(w.project.join(".git"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.contains("corral-quarantine")),
        "{names:?}"
    );
}
