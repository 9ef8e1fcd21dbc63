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
    // The check after the run (what the name gate would refuse earlier: jail_gitwindow).
    w.allow_new_repositories();
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

/// The files under `dir` whose names start with `prefix` and hold a quarantine suffix.
fn quarantined(dir: &std::path::Path, prefix: &str) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(prefix) && n.contains(".corral-quarantine-")
        })
        .map(|e| e.path())
        .collect()
}

#[test]
fn a_nested_repository_or_module_the_jail_armed_is_disarmed_before_the_host_runs_git() {
    let w = World::new();
    // The check after the run (what the name gate would refuse earlier: jail_gitwindow).
    w.allow_new_repositories();
    let marker = w.outside.join("fsmonitor-ran");
    let hook_marker = w.outside.join("hook-ran");
    let script = format!(
        "set -e; git init -q sub; cd sub; echo a > a; git add a; \
         git -c user.name=a -c user.email=a@b commit -qm one; cd ..; \
         git config -f sub/.git/config core.fsmonitor 'touch {m}'; \
         printf '#!/bin/sh\\ntouch {h}\\n' > sub/.git/hooks/post-checkout; \
         chmod +x sub/.git/hooks/post-checkout; \
         mkdir -p .git/modules/m m; \
         printf '[core]\\n\\thooksPath = /tmp\\n' > .git/modules/m/config; \
         printf 'gitdir: ../.git/modules/m\\n' > m/.git; echo END",
        m = marker.display(),
        h = hook_marker.display()
    );
    let out = w.sh("none", &script);
    ran(&out, "END");
    let p = &w.project;
    // Moved aside, and said so.
    for (dir, name) in [
        ("sub/.git", "config"),
        ("sub/.git/hooks", "post-checkout"),
        (".git/modules/m", "config"),
        ("m", ".git"),
    ] {
        let path = p.join(dir).join(name);
        assert!(
            std::fs::symlink_metadata(&path).is_err(),
            "{} is still there\n{}",
            path.display(),
            out.both()
        );
        assert_eq!(
            quarantined(&p.join(dir), name).len(),
            1,
            "{dir}/{name}\n{}",
            out.both()
        );
        assert!(
            out.stderr.contains(&format!("{dir}/{name}")),
            "{dir}/{name}\n{}",
            out.both()
        );
    }
    assert!(out.stderr.contains("core.fsmonitor"), "{}", out.both());
    let recs = w.audit_records();
    let events = recs
        .iter()
        .filter(|r| r["kind"] == "jail" && r["event"] == "quarantine")
        .count();
    assert_eq!(events, 4, "{recs:#?}");
    // The host's git in the nested repository runs neither the fsmonitor command nor the hook.
    let status = host_git(&w, &["-C", "sub", "status", "--short"]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let co = host_git(&w, &["-C", "sub", "checkout", "-q", "HEAD"]);
    assert!(
        co.status.success(),
        "{}",
        String::from_utf8_lossy(&co.stderr)
    );
    assert!(
        !marker.exists(),
        "the planted core.fsmonitor ran on the host"
    );
    assert!(!hook_marker.exists(), "the planted hook ran on the host");
    // And the attack was real: with the planted config back (in a copy), the host's git runs
    // the jail's command.
    let copy = w.outside.join("sub-copy");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(p.join("sub"))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success());
    let aside = quarantined(&copy.join(".git"), "config").remove(0);
    std::fs::rename(aside, copy.join(".git/config")).unwrap();
    let status = host_git(&w, &["-C", copy.to_str().unwrap(), "status", "--short"]);
    assert!(status.status.success());
    assert!(
        marker.exists(),
        "control: the planted config does not run its command"
    );
}

#[test]
fn a_nested_repository_made_and_committed_to_in_the_jail_keeps_working() {
    let w = World::new();
    // The check after the run (what the name gate would refuse earlier: jail_gitwindow).
    w.allow_new_repositories();
    let out = w.sh(
        "none",
        "set -e; git init -q sub2; cd sub2; echo a > a; git add a; \
         git -c user.name=a -c user.email=a@b commit -qm one; \
         git config alias.st status; echo END",
    );
    ran(&out, "END");
    assert!(!out.stderr.contains("moved aside"), "{}", out.both());
    let recs = w.audit_records();
    assert!(
        !recs.iter().any(|r| r["event"] == "quarantine"),
        "{recs:#?}"
    );
    let git = w.project.join("sub2/.git");
    assert!(git.join("config").is_file());
    assert!(quarantined(&git, "config").is_empty());
    assert!(quarantined(&git.join("hooks"), "").is_empty());
    let log = host_git(&w, &["-C", "sub2", "st", "--short"]);
    assert!(
        log.status.success(),
        "{}",
        String::from_utf8_lossy(&log.stderr)
    );
    let log = host_git(&w, &["-C", "sub2", "log", "--oneline"]);
    assert!(String::from_utf8_lossy(&log.stdout).contains("one"));
}
