//! The end-of-run change summary: a jailed run that creates, edits and deletes project files
//! (in a git repository and in a plain directory) ends with a line naming each one, and the
//! audit log has a `changes` event with the full lists; a run that changes nothing prints no
//! change line; a hostile repository's configuration runs nothing on the host.
//!
//! The summary comes from the run's change record (`method: record`) when it sees every change
//! the run's processes can make: the executor's commands too, and past the record's budget.
//! Else (no record kept, a standard descriptor writing the project) it comes from a listing
//! taken at the start (`git`, `metadata`), with the reason in `note`.

mod jail_support;

use std::process::Command;

use jail_support::*;

/// git in the project, as the user outside the jail, with the world's home.
fn git(w: &World, args: &[&str]) {
    let st = Command::new("git")
        .args([
            "-c",
            "user.email=t@example.invalid",
            "-c",
            "user.name=t",
            "-c",
            "core.hooksPath=/dev/null",
        ])
        .args(args)
        .current_dir(&w.project)
        .env("HOME", &w.home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .status()
        .expect("run git");
    assert!(st.success(), "git {args:?} failed");
}

/// The `changes` events of the audit log.
fn change_events(w: &World) -> Vec<serde_json::Value> {
    w.audit_records()
        .into_iter()
        .filter(|r| r["kind"] == "jail" && r["event"] == "changes")
        .collect()
}

/// The detail of the run's one `changes` event (`context` goes with the failure).
fn the_change(w: &World, context: &str) -> serde_json::Value {
    let events = change_events(w);
    assert_eq!(events.len(), 1, "{events:?}\n{context}");
    events[0]["detail"].clone()
}

fn list(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

fn change_lines(out: &Out) -> Vec<&str> {
    out.stderr
        .lines()
        .filter(|l| {
            l.starts_with("corral: changed in")
                || ["created ", "modified ", "deleted ", "and "]
                    .iter()
                    .any(|v| l.starts_with(&format!("corral:   {v}")))
        })
        .collect()
}

/// A committed project with a file already modified and one untracked before the run.
fn git_world() -> World {
    let w = World::new();
    for (name, text) in [
        ("edit.txt", "one\n"),
        ("gone.txt", "bye\n"),
        ("keep.txt", "same\n"),
        ("dirty.txt", "committed\n"),
        ("src/lib.rs", "fn a() {}\n"),
    ] {
        write(&w.project.join(name), text);
    }
    write(&w.project.join(".gitignore"), ".env\nbuild/\n");
    git(
        &w,
        &[
            "add",
            "edit.txt",
            "gone.txt",
            "keep.txt",
            "dirty.txt",
            "src",
            ".gitignore",
        ],
    );
    git(&w, &["commit", "-q", "-m", "start"]);
    // Dirty before the run: a tracked file edited, an untracked file.
    write(&w.project.join("dirty.txt"), "committed\nedited before\n");
    write(&w.project.join("scratch.txt"), "untracked\n");
    w
}

#[test]
fn git_project_lists_created_modified_and_deleted_files() {
    for method in ["record", "git"] {
        git_project_lists_changes(method);
    }
}

fn git_project_lists_changes(method: &str) {
    let w = git_world();
    if method == "git" {
        w.keep_no_record();
    }
    let out = w.sh(
        "none",
        "echo two >> edit.txt && rm gone.txt && echo n > new.txt && \
         mkdir -p deep/er && echo f > deep/er/file && \
         echo 'edited in the jail' >> dirty.txt && \
         touch keep.txt && echo untracked > scratch.txt && \
         mkdir -p build && echo o > build/out && \
         echo END",
    );
    ran(&out, "END");
    assert_eq!(out.code, 0, "{}", out.both());
    let lines = change_lines(&out);
    // A directory the run made is one entry from the record (git lists a new untracked
    // file by its path, a new ignored directory as one entry).
    let deep = if method == "record" {
        "deep/"
    } else {
        "deep/er/file"
    };
    assert_eq!(
        lines,
        vec![format!(
            "corral: changed in {}: created build/, created {deep}, created new.txt, \
             modified dirty.txt, modified edit.txt, deleted gone.txt",
            w.project.display()
        )],
        "{}",
        out.stderr
    );
    let d = &the_change(&w, "");
    assert_eq!(d["method"], method, "{d}");
    if method == "git" {
        assert_eq!(d["note"], "the run keeps no change record", "{d}");
    } else {
        assert!(d.get("note").is_none(), "{d}");
    }
    assert_eq!(d["root"], w.project.to_str().unwrap());
    assert_eq!(list(&d["created"]), ["build/", deep, "new.txt"]);
    assert_eq!(list(&d["modified"]), ["dirty.txt", "edit.txt"]);
    assert_eq!(list(&d["deleted"]), ["gone.txt"]);
}

#[test]
fn a_change_the_agent_commits_is_still_listed() {
    let w = git_world();
    let out = w.sh(
        "none",
        "echo patched > src/lib.rs && echo x > added.txt && \
         git add -A && git -c user.email=a@example.invalid -c user.name=a commit -q -m agent && \
         git status --short && echo END",
    );
    ran(&out, "END");
    let d = &the_change(&w, &out.both());
    assert_eq!(list(&d["created"]), ["added.txt"], "{d}");
    assert_eq!(list(&d["modified"]), ["src/lib.rs"], "{d}");
    assert!(list(&d["deleted"]).is_empty(), "{d}");
}

#[test]
fn plain_directory_lists_created_modified_and_deleted_files() {
    for method in ["record", "metadata"] {
        plain_directory_lists_changes(method);
    }
}

fn plain_directory_lists_changes(method: &str) {
    let w = World::new();
    if method == "metadata" {
        w.keep_no_record();
    }
    std::fs::remove_dir_all(w.project.join(".git")).unwrap();
    write(&w.project.join("a.txt"), "a\n");
    write(&w.project.join("sub/old.md"), "old\n");
    write(&w.project.join("same.txt"), "same\n");
    let out = w.sh(
        "none",
        "echo more >> a.txt && rm sub/old.md && echo n > made.txt && chmod +x same.txt && \
         echo END",
    );
    ran(&out, "END");
    let lines = change_lines(&out);
    assert_eq!(
        lines,
        vec![format!(
            "corral: changed in {}: created made.txt, modified a.txt, modified same.txt, \
             deleted sub/old.md",
            w.project.display()
        )],
        "{}",
        out.stderr
    );
    let d = &the_change(&w, "");
    assert_eq!(d["method"], method, "{d}");
    assert_eq!(list(&d["created"]), ["made.txt"]);
    assert_eq!(list(&d["modified"]), ["a.txt", "same.txt"]);
    assert_eq!(list(&d["deleted"]), ["sub/old.md"]);
}

#[test]
fn many_changes_are_capped() {
    let w = World::new();
    std::fs::remove_dir_all(w.project.join(".git")).unwrap();
    std::fs::create_dir(w.project.join("many")).unwrap();
    let out = w.sh(
        "none",
        "i=0; while [ $i -lt 81 ]; do echo $i > many/f$i; i=$((i+1)); done; echo END",
    );
    ran(&out, "END");
    let lines = change_lines(&out);
    assert_eq!(
        lines[0],
        format!(
            "corral: changed in {}: 81 created, 0 modified, 0 deleted",
            w.project.display()
        ),
        "{}",
        out.stderr
    );
    assert_eq!(lines.len(), 1 + 50 + 1, "{}", out.stderr);
    assert!(lines[51].contains("and 31 more"), "{}", out.stderr);
    let d = &change_events(&w)[0]["detail"];
    assert_eq!(
        list(&d["created"]).len(),
        81,
        "the audit log has the full list"
    );
}

#[test]
fn a_run_that_changes_nothing_prints_no_change_line() {
    for plain in [false, true] {
        let w = git_world();
        if plain {
            std::fs::remove_dir_all(w.project.join(".git")).unwrap();
        }
        let out = w.sh(
            "none",
            "cat edit.txt >/dev/null && ls -R >/dev/null && echo END",
        );
        ran(&out, "END");
        assert!(
            change_lines(&out).is_empty(),
            "plain={plain}: {}",
            out.stderr
        );
        assert!(change_events(&w).is_empty(), "plain={plain}");
        // The private git directory is gone once the run ends (the listing cache may stay),
        // and so is the run's change record (the project's store directory stays, empty:
        // anything in it is listed on its own).
        let leftovers: Vec<_> = walk_names(&w.home.join(".local/state/corral"))
            .into_iter()
            .filter(|p| p.contains("/changes/") && !p.ends_with("/changes/listing"))
            .filter(|p| {
                !p.rsplit_once("/changes/")
                    .is_some_and(|(_, n)| n.starts_with("project-") && !n.contains('/'))
            })
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}

fn walk_names(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.to_string_lossy().into_owned());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

/// A repository whose own configuration would run a program on the host: an fsmonitor hook,
/// a clean filter on every file, a post-index-change hook. corral's git queries run none of
/// them. The same configuration does run them under a plain `git status` (checked last), so
/// the test fails if the traps are not armed.
#[test]
fn a_hostile_repository_config_runs_nothing_on_the_host() {
    let w = git_world();
    let marker = w.outside.join("pwned");
    let trap = w.outside.join("trap.sh");
    write(
        &trap,
        &format!("#!/bin/sh\necho \"$0 $*\" >> {}\ncat\n", marker.display()),
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&trap, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = w.project.join(".git/config");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "[core]\n\tfsmonitor = {t}\n\thooksPath = {h}\n[filter \"trap\"]\n\tclean = {t}\n\tsmudge = cat\n",
        t = trap.display(),
        h = w.outside.join("hooks").display(),
    ));
    std::fs::write(&cfg, text).unwrap();
    write(
        &w.outside.join("hooks/post-index-change"),
        &format!("#!/bin/sh\necho hook >> {}\n", marker.display()),
    );
    std::fs::set_permissions(
        w.outside.join("hooks/post-index-change"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    write(&w.project.join(".gitattributes"), "* filter=trap\n");
    // Stat data out of date, so git would re-read (and filter) the files.
    std::thread::sleep(std::time::Duration::from_millis(20));
    for f in ["edit.txt", "keep.txt", "src/lib.rs"] {
        let p = w.project.join(f);
        let t = std::fs::read(&p).unwrap();
        std::fs::write(&p, t).unwrap();
    }

    // The git method is the one that runs git: the record would run nothing at all.
    w.keep_no_record();
    let out = w.sh("none", "echo changed >> edit.txt && echo END");
    ran(&out, "END");
    assert!(
        !marker.exists(),
        "corral's change summary ran the repository's configured program: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    let d = &change_events(&w)[0]["detail"];
    assert_eq!(d["method"], "git", "{d}");
    assert!(
        list(&d["modified"]).contains(&"edit.txt".to_string()),
        "{d}"
    );

    // The control: the same repository under an ordinary `git status` runs the trap.
    let _ = Command::new("git")
        .args(["status", "--porcelain"])
        .current_dir(&w.project)
        .env("HOME", &w.home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("run git");
    assert!(
        marker.exists(),
        "the trap is not armed: plain git status did not run it"
    );
}

/// A file marked assume-unchanged (or skip-worktree) in the index is still compared: the bit
/// cannot hide an edit.
#[test]
fn an_assume_unchanged_bit_does_not_hide_an_edit() {
    let w = git_world();
    w.keep_no_record();
    git(&w, &["update-index", "--assume-unchanged", "edit.txt"]);
    git(&w, &["update-index", "--skip-worktree", "keep.txt"]);
    let out = w.sh(
        "none",
        "echo hidden >> edit.txt && echo hidden >> keep.txt && echo END",
    );
    ran(&out, "END");
    let d = &the_change(&w, &out.both());
    assert_eq!(d["method"], "git", "{d}");
    assert_eq!(list(&d["modified"]), ["edit.txt", "keep.txt"], "{d}");
}

/// A linked worktree (`.git` is a `gitdir:` file) uses its own index.
#[test]
fn a_linked_worktree_is_compared_with_its_own_index() {
    let w = git_world();
    let side = w.root.join("work/side");
    git(&w, &["worktree", "add", "-q", side.to_str().unwrap()]);
    let mut c = w.sh_command(
        "none",
        "echo x >> edit.txt && rm gone.txt && echo n > wt-new.txt && echo END",
    );
    c.current_dir(&side);
    let out = run(c);
    ran(&out, "END");
    let lines = change_lines(&out);
    assert_eq!(
        lines,
        vec![format!(
            "corral: changed in {}: created wt-new.txt, modified edit.txt, deleted gone.txt",
            side.display()
        )],
        "{}",
        out.stderr
    );
}

/// A new directory whose own `.gitignore` ignores everything in it (itself included) is still
/// listed; a new file in a directory ignored at the start is the documented blind spot.
#[test]
fn a_self_ignoring_directory_is_still_listed() {
    let w = git_world();
    w.keep_no_record();
    write(&w.project.join("build/old"), "o\n");
    let out = w.sh(
        "none",
        "mkdir x && echo '*' > x/.gitignore && echo evil > x/payload && rm -r build && echo END",
    );
    ran(&out, "END");
    let d = &the_change(&w, &out.both());
    assert_eq!(d["method"], "git", "{d}");
    let created = list(&d["created"]);
    assert!(created.iter().any(|c| c == "x/" || c == "x/payload"), "{d}");
    assert_eq!(list(&d["deleted"]), ["build/"], "{d}");
}

/// A directory the jail made unlistable (`chmod 311`: its files still reachable by name) does
/// not hide a later run's edit of a tracked file in it. Rootless, corral cannot list it either,
/// so the next run masks the directory whole (the edit is refused); were it written, the end's
/// shortcut and the listing cache would not vouch for it (they need every directory read, else
/// git runs, which stats tracked paths directly). As root the directory is readable: the edit
/// is made and listed.
#[test]
fn an_unlistable_directory_does_not_hide_an_edit_below_it() {
    let w = git_world();
    let out = w.sh("none", "chmod 311 src && echo END");
    ran(&out, "END");
    // Past the racy window, so the shortcut would be trusted.
    std::thread::sleep(std::time::Duration::from_secs(6));
    let before = std::fs::read(w.project.join("src/lib.rs")).ok();
    let out = w.sh("none", "echo 'fn b() {}' >> src/lib.rs; echo END");
    // The world's directory goes with the test: make it removable again.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        w.project.join("src"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    ran(&out, "END");
    let after = std::fs::read(w.project.join("src/lib.rs")).ok();
    let modified: Vec<String> = change_events(&w)
        .iter()
        .flat_map(|e| list(&e["detail"]["modified"]))
        .collect();
    assert_eq!(
        before != after,
        modified.contains(&"src/lib.rs".to_string()),
        "src/lib.rs changed: {}; listed: {modified:?}\n{}",
        before != after,
        out.stderr
    );
}

/// From the record, an ignored file's change is listed too (the git method does not see a
/// change inside a directory ignored at the start), and a created directory is one entry.
#[test]
fn the_record_lists_ignored_files_and_a_new_directory_once() {
    let w = git_world();
    write(&w.project.join("build/old"), "o\n");
    let out = w.sh(
        "none",
        "echo more >> build/old && mkdir -p node_modules/a/b && echo x > node_modules/a/b/c.js && \
         echo y > node_modules/a/d.js && mkdir x && echo '*' > x/.gitignore && echo END",
    );
    ran(&out, "END");
    let d = &the_change(&w, &out.both());
    assert_eq!(d["method"], "record", "{d}");
    assert_eq!(list(&d["created"]), ["node_modules/", "x/"], "{d}");
    assert_eq!(list(&d["modified"]), ["build/old"], "{d}");
}

/// What the executor's commands change (in jails of their own) is in the run's summary, from
/// the run's record, and `corral undo` puts it back with the rest.
#[test]
fn the_executors_writes_are_in_the_runs_summary() {
    let w = git_world();
    let out = w.sh(
        "none",
        "echo agent > by-agent.txt && \
         corral exec -- sh -c 'echo exec > by-exec.txt && echo more >> edit.txt && rm gone.txt' && \
         echo END",
    );
    ran(&out, "END");
    assert_eq!(
        std::fs::read_to_string(w.project.join("by-exec.txt")).unwrap(),
        "exec\n",
        "{}",
        out.both()
    );
    let d = &the_change(&w, &out.both());
    assert_eq!(d["method"], "record", "{d}");
    assert_eq!(list(&d["created"]), ["by-agent.txt", "by-exec.txt"], "{d}");
    assert_eq!(list(&d["modified"]), ["edit.txt"], "{d}");
    assert_eq!(list(&d["deleted"]), ["gone.txt"], "{d}");
    // The executor's changes are undone with the run's.
    let mut c = w.corral();
    c.arg("undo");
    let undo = run(c);
    assert_eq!(undo.code, 0, "{}", undo.both());
    assert!(!w.project.join("by-exec.txt").exists());
    assert!(!w.project.join("by-agent.txt").exists());
    assert_eq!(
        std::fs::read_to_string(w.project.join("edit.txt")).unwrap(),
        "one\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join("gone.txt")).unwrap(),
        "bye\n"
    );
}

/// A run past the record's budget (`undo.max_size`) keeps no more content, but still notes
/// every name: the summary lists each change, by content within the budget and by metadata
/// beyond it; the run cannot be undone.
#[test]
fn a_run_over_the_records_budget_still_lists_every_change() {
    let w = git_world();
    write(&w.project.join("big.bin"), &"b".repeat(64 * 1024));
    write(&w.project.join("opened.txt"), "same\n");
    let config = w.home.join(".config/corral/config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}[undo]\nmax_size = \"16k\"\n")).unwrap();
    let out = w.sh(
        "none",
        "echo x >> big.bin && i=0; while [ $i -lt 30 ]; do echo $i > f$i.txt; i=$((i+1)); done; \
         echo more >> edit.txt && rm gone.txt && : >> opened.txt && echo END",
    );
    ran(&out, "END");
    let d = &the_change(&w, &out.both());
    assert_eq!(d["method"], "record", "{d}");
    let mut want: Vec<String> = (0..30).map(|i| format!("f{i}.txt")).collect();
    want.sort();
    assert_eq!(list(&d["created"]), want, "{d}");
    assert_eq!(list(&d["modified"]), ["big.bin", "edit.txt"], "{d}");
    assert_eq!(list(&d["deleted"]), ["gone.txt"], "{d}");
    let mut c = w.corral();
    c.arg("undo");
    let undo = run(c);
    assert_ne!(
        undo.code,
        0,
        "an incomplete record was undone: {}",
        undo.both()
    );
    assert!(undo.stderr.contains("incomplete"), "{}", undo.both());
}

/// `corral run ... > project/out.txt`: the caller's shell opened the file, and the jail writes
/// it with no name gate in the way. The record cannot stand for the summary: the project is
/// listed from the start, and the file is in the summary.
/// A run whose standard output is the file `out_file` (made before the run): its output lands
/// there, and the run's change summary event is returned.
fn change_with_stdout_in(w: &World, out_file: &std::path::Path) -> serde_json::Value {
    let file = std::fs::File::create(out_file).unwrap();
    let mut c = w.sh_command("none", "echo to-stdout && echo n > new.txt && echo END >&2");
    c.stdin(std::process::Stdio::null())
        .stdout(file)
        .stderr(std::process::Stdio::piped());
    let done = c.output().expect("run corral");
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(stderr.contains("END"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(out_file).unwrap(),
        "to-stdout\n",
        "{stderr}"
    );
    the_change(w, &stderr)
}

#[test]
fn a_standard_descriptor_into_the_project_falls_back_to_the_listing() {
    let w = git_world();
    let d = &change_with_stdout_in(&w, &w.project.join("out.txt"));
    assert_eq!(d["method"], "git", "{d}");
    assert!(
        d["note"].as_str().unwrap_or("").contains("descriptor 1"),
        "{d}"
    );
    // The shell made it (empty) before corral started: written during the run.
    assert_eq!(list(&d["created"]), ["new.txt"], "{d}");
    assert_eq!(list(&d["modified"]), ["out.txt"], "{d}");
}

/// The control: the same run writing its output to a file beside the project (on the same file
/// system, as a log in the user's home often is) keeps the summary from the record.
#[test]
fn a_standard_descriptor_beside_the_project_keeps_the_record() {
    let w = git_world();
    let d = &change_with_stdout_in(&w, &w.project.parent().unwrap().join("beside-out.txt"));
    assert_eq!(d["method"], "record", "{d}");
    assert_eq!(list(&d["created"]), ["new.txt"], "{d}");
    assert!(list(&d["modified"]).is_empty(), "{d}");
}

/// A host executor (an explicit opt-in) writes the project with no name gate: the record
/// cannot stand for the summary, the project is listed from the start, and the host
/// command's file is listed beside the jail's.
#[test]
fn a_host_executor_falls_back_to_the_listing() {
    let w = git_world();
    write(
        &w.project.join("corral.toml"),
        "[executor]\ntarget = \"host\"\n",
    );
    git(&w, &["add", "corral.toml"]);
    git(&w, &["commit", "-qm", "executor"]);
    w.trust_project(&["--allow-host-executor"]);
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--allow-host-executor",
        "--",
        "sh",
        "-c",
        "echo j > by-jail.txt && corral exec -- sh -c 'echo h > by-host.txt' && echo END",
    ]);
    let out = run(c);
    ran(&out, "END");
    assert!(w.project.join("by-host.txt").exists(), "{}", out.both());
    let d = &the_change(&w, &out.both());
    assert_eq!(d["method"], "git", "{d}");
    assert!(
        d["note"].as_str().unwrap_or("").contains("on the host"),
        "{d}"
    );
    assert_eq!(list(&d["created"]), ["by-host.txt", "by-jail.txt"], "{d}");
}
