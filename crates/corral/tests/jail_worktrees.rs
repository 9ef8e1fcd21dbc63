//! `corral run --worktree NAME`: each agent in its own git worktree and
//! branch, jailed to it. A process in the jail tries to write the main repository's config,
//! hooks, packed-refs and objects, the main worktree's files, another worktree's files and admin
//! directory, its own worktree's `.git` file and admin `commondir`, and another branch's ref:
//! none of it reaches the host, while its commit on its own branch does. `corral worktree ls`
//! (and its old spelling `corral worktrees`) and `corral worktree rm`. Runs as root and, through scripts/test-rootless, unprivileged.

mod jail_support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use jail_support::*;

fn git(dir: &Path, w: &World, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=host", "-c", "user.email=host@example.com"])
        .args(args)
        .current_dir(dir)
        .env("HOME", &w.home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The world's project with a first commit on `main` and a branch `victim`.
fn repo() -> World {
    let w = World::new();
    git(&w.project, &w, &["checkout", "-q", "-b", "main"]);
    git(&w.project, &w, &["add", "README"]);
    git(&w.project, &w, &["commit", "-q", "-m", "first"]);
    git(&w.project, &w, &["branch", "victim"]);
    w
}

/// Where corral puts the worktree `name` of the world's project.
fn worktree_path(w: &World, name: &str) -> PathBuf {
    let base = w.home.join(".local/state/corral/worktrees");
    let key = std::fs::read_dir(&base)
        .expect("the worktrees directory")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("project-")
        })
        .expect("the project's worktrees");
    key.join(name)
}

/// `corral run --worktree NAME --network none -- sh -c SCRIPT`.
fn run_in(w: &World, name: &str, script: &str) -> Out {
    let mut c = w.corral();
    c.args([
        "run",
        "--worktree",
        name,
        "--network",
        "none",
        "--",
        "sh",
        "-c",
    ])
    .arg(script);
    run(c)
}

fn corral(w: &World, args: &[&str]) -> Out {
    let mut c = w.corral();
    c.args(args);
    run(c)
}

/// The host can append to `path` (the control: the jail's failure is the jail's doing).
fn host_can_append(path: &Path) {
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("control: the host cannot append to {}: {e}", path.display()));
}

#[test]
fn a_worktree_jail_writes_its_worktree_and_branch_and_nothing_else_of_the_repository() {
    let w = repo();
    let main = w.project.clone();
    let gitdir = main.join(".git");
    // Another agent's worktree, made the same way.
    let out = run_in(&w, "other", "echo END");
    ran(&out, "END");
    let other = worktree_path(&w, "other");
    assert!(other.join("README").is_file(), "{}", out.both());
    git(&main, &w, &["pack-refs", "--all"]);
    git(&main, &w, &["branch", "victim2"]);
    let victim = git(&main, &w, &["rev-parse", "victim"]);
    let victim2 = git(&main, &w, &["rev-parse", "victim2"]);
    let blob = git(&main, &w, &["rev-parse", "HEAD:README"]);
    let object = gitdir.join("objects").join(&blob[..2]).join(&blob[2..]);
    let config = std::fs::read(gitdir.join("config")).unwrap();

    let targets: Vec<(&str, PathBuf)> = vec![
        ("config", gitdir.join("config")),
        ("hook", gitdir.join("hooks/pre-commit")),
        ("packed-refs", gitdir.join("packed-refs")),
        ("other-admin", gitdir.join("worktrees/other/HEAD")),
        ("main-index", gitdir.join("index")),
    ];
    // Not in the jail at all: the main worktree's files and the other worktree. (Their paths
    // may lie in the jail's private /tmp, where a write creates a file of the jail's own: the
    // host's files are checked after the run.)
    let hidden: Vec<(&str, PathBuf)> = vec![
        ("main-file", main.join("README")),
        ("other-file", other.join("README")),
    ];
    for (_, p) in targets.iter().chain(&hidden) {
        host_can_append(p);
    }
    let mut script = String::from("set -u; ");
    for (what, p) in &targets {
        script.push_str(&format!(
            "echo x >> '{}' 2>/dev/null && echo WROTE-{what}; ",
            p.display()
        ));
    }
    for (what, p) in &hidden {
        script.push_str(&format!(
            "grep -q hello '{p}' 2>/dev/null && echo VISIBLE-{what}; echo x >> '{p}' 2>/dev/null; ",
            p = p.display()
        ));
    }
    // Hooks the host's git would run, an object a branch uses, the files that say where git
    // finds the repository and its config, another branch's ref (loose and packed).
    script.push_str(&format!(
        "printf '#!/bin/sh\\ntouch /tmp/pwned\\n' > '{g}/hooks/post-commit' 2>/dev/null && echo WROTE-new-hook; \
         rm -f '{obj}' 2>/dev/null; [ -e '{obj}' ] || echo WROTE-object; \
         echo 'gitdir: /tmp/evil' > .git 2>/dev/null && echo WROTE-dotgit; \
         echo /tmp/evil > '{g}/worktrees/w1/commondir' 2>/dev/null && echo WROTE-commondir; \
         echo /tmp/evil > \"$GIT_OBJECT_DIRECTORY/info/alternates\" 2>/dev/null && echo WROTE-alternates; \
         echo new > jailfile && git add jailfile \
         && git -c user.name=agent -c user.email=agent@example.com commit -q -m jailcommit \
         && echo COMMITTED; \
         git update-ref refs/heads/victim HEAD && git update-ref refs/heads/victim2 HEAD \
         && [ \"$(git rev-parse victim)\" = \"$(git rev-parse HEAD)\" ] && echo MOVED-IN-JAIL; \
         echo END",
        g = gitdir.display(),
        obj = object.display(),
    ));
    let out = run_in(&w, "w1", &script);
    ran(&out, "END");
    assert!(!out.stdout.contains("WROTE-"), "{}", out.both());
    assert!(!out.stdout.contains("VISIBLE-"), "{}", out.both());
    assert!(out.stdout.contains("COMMITTED"), "{}", out.both());
    // The attack on other branches "works" in the jail's private copy only.
    assert!(out.stdout.contains("MOVED-IN-JAIL"), "{}", out.both());

    // On the host: the commit is on branch w1, nothing else moved or changed.
    assert_eq!(
        git(&main, &w, &["log", "--format=%s", "-1", "w1"]),
        "jailcommit"
    );
    assert_eq!(git(&main, &w, &["rev-parse", "victim"]), victim);
    assert_eq!(git(&main, &w, &["rev-parse", "victim2"]), victim2);
    assert_eq!(std::fs::read(gitdir.join("config")).unwrap(), config);
    assert!(!gitdir.join("hooks/post-commit").exists());
    assert!(object.is_file());
    for (_, p) in &hidden {
        assert_eq!(
            std::fs::read_to_string(p).unwrap(),
            "hello from the project\n"
        );
    }
    git(&main, &w, &["fsck", "--no-dangling"]);
    let wt = worktree_path(&w, "w1");
    assert!(
        std::fs::read_to_string(wt.join(".git"))
            .unwrap()
            .contains("worktrees/w1")
    );
    // The worktree's status is clean on the host: index, HEAD and branch agree.
    assert_eq!(git(&wt, &w, &["status", "--porcelain"]), "");
    // gitguard's check raised no alarm for the legitimate worktree.
    assert!(!out.stderr.contains("moved aside"), "{}", out.both());
    assert!(
        !w.audit_records().iter().any(|r| r["event"] == "quarantine"),
        "{}",
        out.both()
    );
}

#[test]
fn without_worktree_the_same_jail_writes_the_main_files_and_moves_other_branches() {
    // The control of the test above: a plain `corral run` in the repository (its project
    // read-write, as before --worktree) writes the main worktree's files and moves any branch.
    let w = repo();
    let victim = git(&w.project, &w, &["rev-parse", "victim"]);
    let out = w.sh(
        "none",
        "echo x >> README && git -c user.name=a -c user.email=a@example.com commit -qam c \
         && git update-ref refs/heads/victim HEAD && echo WROTE; echo END",
    );
    ran(&out, "END");
    assert!(out.stdout.contains("WROTE"), "{}", out.both());
    assert_ne!(git(&w.project, &w, &["rev-parse", "victim"]), victim);
}

#[test]
fn a_worktree_is_reused_listed_locked_while_running_and_removed() {
    let w = repo();
    let main = w.project.clone();
    let out = run_in(
        &w,
        "w2",
        "echo one > f1 && git add f1 && git -c user.name=a -c user.email=a@example.com \
         commit -q -m one && echo END",
    );
    ran(&out, "END");
    let wt = worktree_path(&w, "w2");
    assert!(out.stderr.contains("created worktree w2"), "{}", out.both());
    assert!(
        out.stderr.contains(&wt.display().to_string()),
        "{}",
        out.both()
    );

    // A second run: the same worktree, its file and commit there; it leaves a file uncommitted
    // and waits for the host while `corral worktree ls` and `worktree rm` look at it.
    let mut c = w.corral();
    c.args([
        "run",
        "--worktree",
        "w2",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
    ])
    .arg(
        "cat f1; git log --oneline | wc -l; echo u > u.txt; echo READY; \
             while [ ! -e go ]; do sleep 0.05; done; echo END",
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("READY") {
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap() == 0 {
            let _ = child.kill();
            panic!("the second run ended early: {seen}");
        }
        seen.push_str(&line);
    }
    assert!(seen.starts_with("one\n2\n"), "{seen}");
    let listed = corral(&w, &["worktree", "ls", "--json"]);
    assert_eq!(listed.code, 0, "{}", listed.both());
    // The old spelling prints the same, and says the new one on stderr.
    let old = corral(&w, &["worktrees", "--json"]);
    assert_eq!(old.code, 0, "{}", old.both());
    assert_eq!(old.stdout, listed.stdout);
    assert!(
        old.stderr.contains("is now `corral worktree ls`"),
        "{}",
        old.both()
    );
    assert!(!listed.stderr.contains("is now"), "{}", listed.both());
    let list: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    let e = &list[0];
    assert_eq!(e["name"], "w2", "{list:#}");
    assert_eq!(e["running"], true, "{list:#}");
    assert_eq!(e["branch"], "w2", "{list:#}");
    assert_eq!(
        (e["ahead"].as_u64(), e["behind"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(e["changed"], 1, "{list:#}");
    // u.txt, and while the jail runs the placeholder of the protected corral.toml.
    assert!(e["uncommitted"].as_u64() >= Some(1), "{list:#}");
    assert_eq!(e["path"], wt.display().to_string());
    let refused = corral(&w, &["worktree", "rm", "w2"]);
    assert_ne!(refused.code, 0, "{}", refused.both());
    assert!(
        refused.stderr.contains("already runs"),
        "{}",
        refused.both()
    );
    let twice = run_in(&w, "w2", "echo SECOND-RAN");
    assert_ne!(twice.code, 0, "{}", twice.both());
    assert!(!twice.stdout.contains("SECOND-RAN"), "{}", twice.both());
    assert!(twice.stderr.contains("already runs"), "{}", twice.both());
    std::fs::write(wt.join("go"), "").unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");

    let listed = corral(&w, &["worktree", "list"]);
    assert!(
        listed.stdout.contains("w2\t-\tw2\t1\t0\t1\t2\t"),
        "{}",
        listed.both()
    );
    // Uncommitted work is kept unless --force.
    let kept = corral(&w, &["worktree", "rm", "w2"]);
    assert_ne!(kept.code, 0, "{}", kept.both());
    assert!(wt.join("u.txt").is_file());
    let removed = corral(&w, &["worktree", "rm", "--force", "w2"]);
    assert_eq!(removed.code, 0, "{}", removed.both());
    assert!(!wt.exists());
    assert!(!main.join(".git/worktrees/w2").exists());
    assert_eq!(git(&main, &w, &["log", "--format=%s", "-1", "w2"]), "one");
    assert!(!wt.parent().unwrap().join(".corral/w2.git").exists());
    let listed = corral(&w, &["worktree", "ls", "--json"]);
    assert_eq!(listed.stdout.trim(), "[]", "{}", listed.both());

    // A worktree with nothing uncommitted goes without --force; --delete-branch takes its
    // branch too.
    ran(&run_in(&w, "w3", "echo END"), "END");
    let removed = corral(&w, &["worktree", "rm", "--delete-branch", "w3"]);
    assert_eq!(removed.code, 0, "{}", removed.both());
    assert_eq!(git(&main, &w, &["branch", "--list", "w3"]), "");
}

#[test]
fn bad_worktree_names_and_places_get_a_clear_error() {
    let w = repo();
    for bad in ["../x", "a/b", "-x", "x.lock"] {
        let mut c = w.corral();
        c.args(["run", &format!("--worktree={bad}"), "--", "echo", "RAN"]);
        let out = run(c);
        assert_ne!(out.code, 0, "{bad}: {}", out.both());
        assert!(!out.stdout.contains("RAN"), "{}", out.both());
        assert!(out.stderr.contains("worktree name"), "{}", out.both());
    }
    // The container engines are refused before a worktree is made.
    let mut c = w.corral();
    c.args([
        "run",
        "--worktree",
        "pod",
        "--engine",
        "podman",
        "--",
        "echo",
        "RAN",
    ]);
    let out = run(c);
    assert_ne!(out.code, 0, "{}", out.both());
    assert!(out.stderr.contains("native backend only"), "{}", out.both());
    assert!(!w.project.join(".git/worktrees/pod").exists());
    let mut c = w.corral();
    c.current_dir(&w.outside)
        .args(["run", "--worktree", "w", "--", "true"]);
    let out = run(c);
    assert_ne!(out.code, 0, "{}", out.both());
    assert!(out.stderr.contains("a git repository"), "{}", out.both());
}

#[test]
fn a_branch_moved_on_the_host_during_the_run_is_left_and_the_commits_kept_aside() {
    let w = repo();
    let main = w.project.clone();
    ran(&run_in(&w, "w4", "echo END"), "END");
    // The host moves w4 while the jail works on it.
    let mut c = w.corral();
    c.args([
        "run",
        "--worktree",
        "w4",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
    ])
    .arg(
        "echo x > j && git add j && git -c user.name=a -c user.email=a@example.com \
             commit -q -m jail && echo READY; while [ ! -e go ]; do sleep 0.05; done; echo END",
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("READY") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "the run ended early"
        );
    }
    git(&main, &w, &["commit", "-q", "--allow-empty", "-m", "host"]);
    git(&main, &w, &["update-ref", "refs/heads/w4", "main"]);
    let moved = git(&main, &w, &["rev-parse", "w4"]);
    std::fs::write(worktree_path(&w, "w4").join("go"), "").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refs/corral/import/w4"), "{stderr}");
    assert_eq!(git(&main, &w, &["rev-parse", "w4"]), moved);
    assert_eq!(
        git(
            &main,
            &w,
            &["log", "--format=%s", "-1", "refs/corral/import/w4"]
        ),
        "jail"
    );
}

#[test]
fn commits_of_a_killed_run_are_brought_back_by_the_next_run() {
    let w = repo();
    let main = w.project.clone();
    let mut c = w.corral();
    c.args([
        "run",
        "--worktree",
        "w5",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
    ])
    .arg(
        "echo x > k && git add k && git -c user.name=a -c user.email=a@example.com \
             commit -q -m killed && echo READY; while :; do sleep 1; done",
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("READY") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "the run ended early"
        );
    }
    // `kill -9` of corral: the jail dies with it, nothing is brought back.
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(git(&main, &w, &["log", "--format=%s", "-1", "w5"]), "first");
    let out = run_in(&w, "w5", "git log --format=%s -1; echo END");
    ran(&out, "END");
    assert!(out.stdout.starts_with("killed\n"), "{}", out.both());
    assert!(out.stderr.contains("branch w5 is now at"), "{}", out.both());
    assert_eq!(
        git(&main, &w, &["log", "--format=%s", "-1", "w5"]),
        "killed"
    );
}

#[test]
fn four_agents_at_once_each_commit_on_their_own_branch() {
    let w = repo();
    let children: Vec<_> = (0..4)
        .map(|i| {
            let mut c = w.corral();
            c.args(["run", "--worktree", &format!("c{i}"), "--network", "none"])
                .args(["--", "sh", "-c"])
                .arg(format!(
                    "echo {i} > mine && git add mine && git -c user.name=a \
                     -c user.email=a@example.com commit -q -m agent{i} && echo END"
                ))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("END"),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for i in 0..4 {
        let branch = format!("c{i}");
        assert_eq!(
            git(&w.project, &w, &["log", "--format=%s", "-1", &branch]),
            format!("agent{i}")
        );
        assert_eq!(
            git(&w.project, &w, &["show", &format!("{branch}:mine")]),
            i.to_string()
        );
    }
    // Each worktree is a project of its own: its own audit log.
    let logs = std::fs::read_dir(w.home.join(".local/state/corral"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("audit.jsonl").is_file())
        .filter(|e| e.file_name().to_string_lossy().starts_with('c'))
        .count();
    assert_eq!(logs, 4);
}

/// What a repository's `corral.toml` grants that needs the user's trust.
const GRANTING: &str = "[network]\nhost_ports = [5432]\n";

/// The repository of `dir` with `corral.toml` (GRANTING) and a README committed on `main`.
fn commit_policy(w: &World, dir: &Path) {
    std::fs::write(dir.join("corral.toml"), GRANTING).unwrap();
    std::fs::write(dir.join("README"), "hello\n").unwrap();
    git(dir, w, &["checkout", "-q", "-b", "main"]);
    git(dir, w, &["add", "README", "corral.toml"]);
    git(dir, w, &["commit", "-q", "-m", "policy"]);
}

fn refused_untrusted(out: &Out, marker: &str) {
    assert_eq!(out.code, 125, "{}", out.both());
    assert!(!out.stdout.contains(marker), "{}", out.both());
    assert!(out.stderr.contains("corral trust"), "{}", out.both());
}

#[test]
fn a_worktree_runs_with_the_policy_trusted_for_its_repository_and_only_those_bytes() {
    let w = World::new();
    commit_policy(&w, &w.project);
    // Control: the worktree's corral.toml needs trust at all (nothing trusted yet).
    let out = run_in(&w, "t1", "echo T1-RAN");
    refused_untrusted(&out, "T1-RAN");
    let wt = worktree_path(&w, "t1");
    assert_eq!(
        std::fs::read_to_string(wt.join("corral.toml")).unwrap(),
        GRANTING
    );
    // The user trusts the main worktree's file: the same bytes in its worktree run, no new
    // trust asked.
    w.trust_project(&[]);
    let out = run_in(&w, "t1", "echo T1-RAN");
    ran(&out, "T1-RAN");
    assert!(
        out.stderr.contains("exactly the content you trusted for"),
        "{}",
        out.both()
    );
    let store = w.home.join(".config/corral/trusted.json");
    let trusted = std::fs::read_to_string(&store).unwrap();
    assert!(!trusted.contains(&wt.display().to_string()), "{trusted}");
    // The agent in the worktree tries to change the file the next run reads.
    let out = run_in(
        &w,
        "t1",
        "printf '[network]\\nhost_ports = [5432, 22]\\n' > corral.toml 2>/dev/null \
         && echo WROTE; echo END",
    );
    ran(&out, "END");
    assert!(!out.stdout.contains("WROTE"), "{}", out.both());
    // Other bytes in the worktree (as the user's editor or a later checkout leaves them): not
    // what was trusted, refused.
    std::fs::write(
        wt.join("corral.toml"),
        "[network]\nhost_ports = [5432, 22]\n",
    )
    .unwrap();
    let out = run_in(&w, "t1", "echo CHANGED-RAN");
    refused_untrusted(&out, "CHANGED-RAN");
    // Back to the trusted bytes: it runs again.
    std::fs::write(wt.join("corral.toml"), GRANTING).unwrap();
    ran(&run_in(&w, "t1", "echo BACK-RAN"), "BACK-RAN");

    // Another repository with byte-identical content: the trust of this one does not carry.
    let other = w.sibling.clone();
    git(&other, &w, &["init", "-q"]);
    commit_policy(&w, &other);
    let mut c = w.corral();
    c.current_dir(&other)
        .args(["run", "--worktree", "o1", "--network", "none", "--"])
        .args(["sh", "-c", "echo OTHER-RAN"]);
    refused_untrusted(&run(c), "OTHER-RAN");
}
