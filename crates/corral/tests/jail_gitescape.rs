//! Git on the host runs nothing the jail wrote: the dangerous
//! parts of existing git directories are read-only in the jail (nested repositories, bare
//! repositories, linked worktrees' administrative files), what the run creates is checked once
//! nothing the run started can write any more (the executor's command jails included), the
//! executor's allowlist cannot be steered by a request's PATH, and an executor command jail
//! leaves no placeholder behind. Runs as root and, through scripts/test-rootless, unprivileged.

mod jail_support;

use std::process::Command;

use jail_support::*;

/// Whether a process whose command line holds `tag` still runs anywhere on the host.
fn still_running(tag: &str) -> String {
    let left = Command::new("pgrep")
        .args(["-af", tag])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&left.stdout).into_owned()
}

/// An executor command that ignores SIGTERM and writes `.git/commondir` only once it is asked
/// to stop, after the agent's jail has ended: the git check must wait for it to be gone.
#[test]
fn an_executor_command_that_outlives_the_jail_is_ended_before_the_git_check() {
    let w = World::new();
    // The check after the run (what the name gate would refuse earlier: jail_gitwindow).
    w.allow_new_repositories();
    let tag = format!("gitescape-{}-{}", std::process::id(), line!());
    // The executor command: on TERM (sent when the agent's client went away), wait a little,
    // then plant a commondir pointing at a repository the jail made; never exit on its own.
    let exec = format!(
        "trap 'sleep 0.3; printf ../evil > .git/commondir; echo > wrote-after-term' TERM; \
         echo > exec-started; while :; do sleep 0.05; done; : {tag}"
    );
    let script = format!(
        "git init -q --bare evil && git config -f evil/config core.fsmonitor 'touch {m}'; \
         corral exec -- sh -c \"{exec}\" & \
         while [ ! -e exec-started ]; do sleep 0.05; done; echo END",
        m = w.outside.join("fsmonitor-ran").display()
    );
    let out = w.sh("none", &script);
    ran(&out, "END");
    // The attack ran: the command wrote after its TERM, i.e. after the agent's jail ended.
    assert!(
        w.project.join("wrote-after-term").exists(),
        "control: the executor command never wrote after the jail ended\n{}",
        out.both()
    );
    // And the check saw it: moved aside and reported.
    assert!(
        std::fs::symlink_metadata(w.project.join(".git/commondir")).is_err(),
        "the commondir the executor wrote after the check is still there\n{}",
        out.both()
    );
    assert!(out.stderr.contains(".git/commondir"), "{}", out.both());
    assert!(out.stderr.contains("moved aside"), "{}", out.both());
    // Nothing of the run is left: the TERM-ignoring command is gone too.
    let left = still_running(&tag);
    assert!(left.is_empty(), "left running after corral exited: {left}");
    let st = w.host_git(&w.project, &["status", "--short"]);
    ok(&st);
    assert!(!w.outside.join("fsmonitor-ran").exists());
}

/// A linked worktree outside the project has its administrative directory in the project's
/// `.git/worktrees/NAME/`: re-pointing its `commondir` at a repository the jail made would run
/// that repository's `core.fsmonitor` in the user's worktree. Those files are read-only in the
/// jail, and committing in the project still works.
#[test]
fn a_linked_worktrees_administrative_files_cannot_be_repointed() {
    let w = World::new();
    // The check after the run (what the name gate would refuse earlier: jail_gitwindow).
    w.allow_new_repositories();
    w.commit_readme();
    let wt = w.outside.join("wt");
    ok(&w.host_git(&w.project, &["worktree", "add", "-q", wt.to_str().unwrap()]));
    let marker = w.outside.join("fsmonitor-ran");
    let script = format!(
        "git clone -q --bare . evil && git config -f evil/config core.fsmonitor 'touch {m}'; \
         a=.git/worktrees/wt; \
         printf '%s\\n' \"$PWD/evil\" > $a/commondir && echo COMMONDIR-WRITTEN; \
         printf '/tmp/x/.git\\n' > $a/gitdir && echo GITDIR-WRITTEN; \
         echo b >> README; git add README && \
         git -c user.name=a -c user.email=a@b commit -qm second && echo COMMITTED; echo END",
        m = marker.display()
    );
    let out = w.sh("none", &script);
    ran(&out, "END");
    assert!(!out.stdout.contains("COMMONDIR-WRITTEN"), "{}", out.both());
    assert!(!out.stdout.contains("GITDIR-WRITTEN"), "{}", out.both());
    assert!(out.stdout.contains("COMMITTED"), "{}", out.both());
    ok(&w.host_git(&wt, &["status", "--short"]));
    assert!(
        !marker.exists(),
        "the user's git in the linked worktree ran the jail's fsmonitor"
    );
    // The repository the jail made was disarmed after the run, as a bare repository.
    assert!(out.stderr.contains("evil/config"), "{}", out.both());
    // Control: the same re-pointing done on the host, with the config armed again, does run
    // the planted command.
    let evil = w.project.join("evil/config");
    let cmd = format!("touch {}", marker.display());
    ok(&w.host_git(
        &w.project,
        &[
            "config",
            "-f",
            evil.to_str().unwrap(),
            "core.fsmonitor",
            &cmd,
        ],
    ));
    let admin = w.project.join(".git/worktrees/wt/commondir");
    std::fs::write(&admin, format!("{}\n", w.project.join("evil").display())).unwrap();
    let _ = w.host_git(&wt, &["status", "--short"]);
    assert!(
        marker.exists(),
        "control: the re-pointed worktree runs nothing"
    );
}

/// A worktree's `commondir` the run re-pointed is moved aside after it (the path the jail can
/// write: an administrative directory it made itself).
#[test]
fn a_worktree_made_in_the_jail_and_repointed_is_disarmed() {
    let w = World::new();
    // The check after the run (what the name gate would refuse earlier: jail_gitwindow).
    w.allow_new_repositories();
    w.commit_readme();
    let marker = w.outside.join("fsmonitor-ran");
    let script = format!(
        "set -e; git clone -q --bare . evil; git config -f evil/config core.fsmonitor 'touch {m}'; \
         git worktree add -q inner; git worktree add -q good; \
         printf '%s\\n' \"$PWD/evil\" > .git/worktrees/inner/commondir; echo END",
        m = marker.display()
    );
    let out = w.sh("none", &script);
    ran(&out, "END");
    let admin = w.project.join(".git/worktrees/inner/commondir");
    assert!(std::fs::symlink_metadata(&admin).is_err(), "{}", out.both());
    assert!(
        out.stderr.contains(".git/worktrees/inner/commondir"),
        "{}",
        out.both()
    );
    // A worktree made by `git worktree add` in the jail and left alone is kept.
    assert!(w.project.join("good/.git").is_file(), "{}", out.both());
    assert!(!out.stderr.contains("good/.git"), "{}", out.both());
    ok(&w.host_git(&w.project.join("good"), &["status", "--short"]));
    let _ = w.host_git(&w.project.join("inner"), &["status", "--short"]);
    assert!(!marker.exists(), "the host's git ran the jail's fsmonitor");
}

/// git takes any directory holding `HEAD`, `objects/` and `refs/` for a bare repository when
/// it runs there (unless the user set `safe.bareRepository=explicit`), and reads its config:
/// one the jail made in a plain directory is disarmed after the run.
#[test]
fn a_plain_directory_turned_into_a_bare_repository_is_disarmed() {
    let w = World::new();
    // The check after the run (what the name gate would refuse earlier: jail_gitwindow).
    w.allow_new_repositories();
    let marker = w.outside.join("pager-ran");
    let fsmon = w.outside.join("fsmonitor-ran");
    std::fs::create_dir_all(w.project.join("plain/deeper")).unwrap();
    let script = format!(
        "set -e; cd plain; mkdir objects refs; echo 'ref: refs/heads/main' > HEAD; \
         printf '[core]\\n\\tbare = true\\n\\tfsmonitor = touch {f}\\n[pager]\\n\\tlog = touch {m}\\n' > config; \
         git -C deeper rev-parse --git-dir; echo END",
        m = marker.display(),
        f = fsmon.display()
    );
    let out = w.sh("none", &script);
    ran(&out, "END");
    let plain = w.project.join("plain");
    assert!(
        std::fs::symlink_metadata(plain.join("config")).is_err(),
        "{}",
        out.both()
    );
    assert!(out.stderr.contains("plain/config"), "{}", out.both());
    assert!(out.stderr.contains("moved aside"), "{}", out.both());
    // The host's git in it and below runs nothing of it.
    let _ = w.host_git(&plain.join("deeper"), &["status"]);
    let _ = w.host_git(&plain, &["-p", "log"]);
    assert!(
        !fsmon.exists() && !marker.exists(),
        "git ran the jail's command"
    );
    // Control: with the config back, git in that directory does read it.
    let aside = std::fs::read_dir(&plain)
        .unwrap()
        .flatten()
        .find(|e| {
            e.file_name()
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
}

/// During the run, the user's prompt runs git in nested repositories: their config and hooks,
/// and those of a bare repository in the project, are read-only in the jail from the start.
#[test]
fn existing_nested_and_bare_repositories_are_read_only_where_git_runs_commands() {
    let w = World::new();
    let sub = w.project.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    ok(&w.host_git(&sub, &["init", "-q"]));
    ok(&w.host_git(&w.project, &["init", "-q", "--bare", "vendor/lib.git"]));
    let script = "git config -f sub/.git/config core.fsmonitor x && echo SUB-CONFIG-WRITTEN; \
         printf '#!/bin/sh\\n' > sub/.git/hooks/post-checkout && echo SUB-HOOK-WRITTEN; \
         git config -f vendor/lib.git/config core.pager x && echo BARE-CONFIG-WRITTEN; \
         printf x > vendor/lib.git/hooks/pre-receive && echo BARE-HOOK-WRITTEN; \
         echo a > sub/a && git -C sub add a && \
         git -C sub -c user.name=a -c user.email=a@b commit -qm one && echo SUB-COMMITTED; \
         echo END";
    let out = w.sh("none", script);
    ran(&out, "END");
    for what in [
        "SUB-CONFIG-WRITTEN",
        "SUB-HOOK-WRITTEN",
        "BARE-CONFIG-WRITTEN",
        "BARE-HOOK-WRITTEN",
    ] {
        assert!(!out.stdout.contains(what), "{what}\n{}", out.both());
    }
    assert!(out.stdout.contains("SUB-COMMITTED"), "{}", out.both());
    assert!(!out.stderr.contains("moved aside"), "{}", out.both());
}

/// With `executor.allow`, a request cannot make an allowed name run another file through its
/// own PATH (or a loader variable), nor read its configuration from the project (`HOME`): a
/// request may set only the variables on the executor's allow-list.
#[test]
fn a_request_cannot_steer_the_executor_allowlist_with_its_environment() {
    let w = World::new();
    write(
        &w.project.join("corral.toml"),
        "[executor]\nallow = [\"echo\"]\n",
    );
    // In the project: the executor's jail can write nothing else.
    let marker = w.project.join("evil-ran");
    let script = format!(
        "mkdir -p evil; printf '#!/bin/sh\\ntouch {m}\\n' > evil/echo; chmod +x evil/echo; \
         tok=$(cat \"$CORRAL_EXECUTOR_TOKEN_FILE\"); \
         for env in '{{\"PATH\":\"'$PWD'/evil:/usr/bin:/bin\"}}' '{{\"LD_PRELOAD\":\"'$PWD'/evil/x.so\"}}' '{{\"HOME\":\"'$PWD'/evil\"}}'; do \
           curl -s --unix-socket /run/corral/executor/exec.sock -H \"Authorization: Bearer $tok\" \
             -d '{{\"command\":[\"echo\",\"hi\"],\"env\":'\"$env\"'}}' http://executor/v1/exec; echo; \
         done; \
         corral exec -- echo allowed-still-runs; echo END",
        m = marker.display()
    );
    let out = w.sh("none", &script);
    ran(&out, "END");
    assert!(
        !marker.exists(),
        "an allowed name ran the request's own file\n{}",
        out.both()
    );
    assert_eq!(
        out.stdout.matches("which a request may not set").count(),
        3,
        "each request is refused, naming the rule\n{}",
        out.both()
    );
    assert!(out.stdout.contains("allowed-still-runs"), "{}", out.both());
    // The end-of-run report names both refusals and the rule.
    assert_eq!(
        out.stderr.matches("corral: the executor refused").count(),
        3,
        "{}",
        out.both()
    );
    assert!(out.stderr.contains("sets PATH"), "{}", out.both());
    assert!(out.stderr.contains("sets LD_PRELOAD"), "{}", out.both());
    assert!(out.stderr.contains("sets HOME"), "{}", out.both());
}

/// The project's absent `corral.toml` is held by a placeholder while the run's jails bind it;
/// an executor command still running when the agent's jail ends (and then killed) leaves no
/// empty `corral.toml` behind.
#[test]
fn an_executor_command_jail_leaves_no_policy_placeholder_behind() {
    let w = World::new();
    let tag = format!("gitescape-{}-{}", std::process::id(), line!());
    let script = format!(
        "corral exec -- sh -c 'echo > exec-started; trap \"\" TERM; while :; do sleep 0.05; done; : {tag}' & \
         while [ ! -e exec-started ]; do sleep 0.05; done; echo END"
    );
    let out = w.sh("none", &script);
    ran(&out, "END");
    assert!(
        std::fs::symlink_metadata(w.project.join("corral.toml")).is_err(),
        "an empty corral.toml placeholder was left behind\n{}",
        out.both()
    );
    let left = still_running(&tag);
    assert!(left.is_empty(), "left running after corral exited: {left}");
}

/// `corral doctor` says whether the user's git uses bare repositories it finds by itself, and
/// how to stop it.
#[test]
fn doctor_says_whether_git_discovers_bare_repositories() {
    let w = World::new();
    let check = |w: &World| -> serde_json::Value {
        let mut c = w.corral();
        c.args(["doctor", "--json"]).env("GIT_CONFIG_NOSYSTEM", "1");
        let out = run(c);
        let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("doctor --json");
        json["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == "git_bare_repository")
            .cloned()
            .unwrap_or_else(|| panic!("no git_bare_repository check: {json}"))
    };
    let git = Command::new("git").arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&git.stdout).into_owned();
    let before = check(&w);
    write(
        &w.home.join(".gitconfig"),
        "[safe]\n\tbareRepository = explicit\n",
    );
    let after = check(&w);
    let old_git = before["detail"]
        .as_str()
        .unwrap()
        .contains("has no safe.bareRepository");
    if old_git {
        eprintln!("skipped in part: {version} predates safe.bareRepository");
        assert_eq!(after["status"], "info", "{after}");
        return;
    }
    assert_eq!(before["status"], "info", "{before}");
    assert!(
        before["fix"]
            .as_str()
            .unwrap()
            .contains("git config --global safe.bareRepository explicit"),
        "{before}"
    );
    assert!(
        before["disables"]
            .as_str()
            .unwrap()
            .contains("bare repository"),
        "{before}"
    );
    assert_eq!(after["status"], "ok", "{after}");
}

/// A repository whose hooks live in its work tree (`core.hooksPath = .githooks`, as husky
/// sets up): the jail cannot rewrite the hook the user's next `git commit` runs.
#[test]
fn hooks_in_the_work_tree_named_by_core_hookspath_are_read_only() {
    let w = World::new();
    write(
        &w.project.join(".githooks/pre-commit"),
        "#!/bin/sh\nexit 0\n",
    );
    ok(&w.host_git(
        &w.project,
        &["config", "-f", ".git/config", "core.hooksPath", ".githooks"],
    ));
    let out = w.sh(
        "none",
        "printf '#!/bin/sh\\ntouch /tmp/x\\n' > .githooks/pre-commit && echo HOOK-WRITTEN; \
         printf x > .githooks/post-checkout && echo HOOK-CREATED; echo END",
    );
    ran(&out, "END");
    assert!(!out.stdout.contains("HOOK-WRITTEN"), "{}", out.both());
    assert!(!out.stdout.contains("HOOK-CREATED"), "{}", out.both());
    assert_eq!(
        std::fs::read_to_string(w.project.join(".githooks/pre-commit")).unwrap(),
        "#!/bin/sh\nexit 0\n"
    );
}
