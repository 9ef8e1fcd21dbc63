//! Review mode (`corral run --review`): the jail's writes to the project are held in an
//! overlay's upper directory; the host's project is byte-identical during and after the run
//! until `corral accept` applies exactly what `corral diff` showed. The attacks: a link the
//! jail plants (accept never writes through it), a change set changed after diff (accept
//! refuses), a git repository, git hooks, hidden names and set-id files in the change set
//! (accept refuses what a normal run's name gate or end-of-run checks refuse), host files and
//! refs that moved since the run started (accept refuses). Runs as root and, through
//! scripts/test-rootless, unprivileged.

mod jail_support;

use std::io::{BufRead, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use jail_support::*;

/// The review's upper directory of this world's project.
fn upper(w: &World) -> PathBuf {
    let key = std::fs::read_dir(w.home.join(".local/state/corral/review"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("meta.json").exists())
        .expect("a pending review");
    key.join("upper")
}

fn review(w: &World, script: &str) -> Out {
    let mut c = w.corral();
    c.args([
        "run",
        "--review",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        script,
    ]);
    let out = run(c);
    ran(&out, "END");
    out
}

fn corral(w: &World, args: &[&str]) -> Out {
    let mut c = w.corral();
    c.args(args);
    run(c)
}

#[track_caller]
fn ok_out(out: &Out) {
    assert_eq!(out.code, 0, "{}", out.both());
}

fn git_log(w: &World) -> String {
    let out = w.host_git(&w.project, &["log", "--format=%s"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const GIT: &str = "git -c user.name=j -c user.email=j@e";

#[test]
fn the_host_project_is_unchanged_during_and_after_the_run_and_accept_applies_the_changes() {
    let w = World::new();
    write(&w.project.join("src/main.c"), "int main() { return 0; }\n");
    write(
        &w.project.join("node_modules/x/index.js"),
        "module.exports = 1;\n",
    );
    write(&w.project.join("lib/a.txt"), "a\n");
    write(&w.project.join("lib/b/c.txt"), "c\n");
    w.commit_readme();
    let before = tree(&w.project);
    // The jail makes its changes, then waits on stdin while the test looks at the host.
    let script = format!(
        "rm -rf node_modules && rm -rf lib && mkdir lib && echo d > lib/d.txt && \
         sed -i s/hello/HELLO/ README && chmod 755 README && \
         mv src/main.c src/app.c && echo new > new.txt && ln -s README link && \
         {GIT} add README new.txt link src && {GIT} commit -qm 'jail commit' && echo CHANGED && read line && \
         cat README && echo END"
    );
    let mut c = w.corral();
    c.args([
        "run",
        "--review",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("CHANGED") {
        line.clear();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "the jail ended early"
        );
    }
    // During the run: the host's project is as it was; diff already shows the change set.
    same_tree(&before, &tree(&w.project), "during the run");
    let during = corral(&w, &["diff", "--stat"]);
    assert_eq!(during.code, 0, "{}", during.both());
    assert!(during.stdout.contains("M README"), "{}", during.both());
    // accept and discard wait for the run to end.
    let busy = corral(&w, &["accept"]);
    assert_ne!(busy.code, 0);
    assert!(busy.stderr.contains("in progress"), "{}", busy.both());
    writeln!(child.stdin.take().unwrap()).unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    assert!(rest.contains("HELLO") && rest.contains("END"), "{rest}");
    // After the run: still unchanged, and the summary said how to go on.
    same_tree(&before, &tree(&w.project), "after the run");
    let stat = corral(&w, &["diff", "--stat"]);
    for want in [
        "D node_modules/",
        "D lib/a.txt",
        "D lib/b/",
        "A lib/d.txt",
        "M README (23 bytes) mode 644 -> 755",
        "D src/main.c",
        "A src/app.c",
        "A new.txt",
        "A link -> README",
        "M .git/refs/heads/",
    ] {
        assert!(
            stat.stdout.contains(want),
            "no {want:?} in\n{}",
            stat.both()
        );
    }
    let diff = corral(&w, &["diff", "README"]);
    assert!(
        diff.stdout
            .contains("-hello from the project\n+HELLO from the project\n"),
        "{}",
        diff.both()
    );
    // accept applies what the last diff showed: README only, so far.
    let partial = corral(&w, &["accept"]);
    assert_ne!(partial.code, 0);
    assert!(
        partial
            .stderr
            .contains("was not shown by the last `corral diff`"),
        "{}",
        partial.both()
    );
    ok_out(&corral(&w, &["diff"]));
    let accepted = corral(&w, &["accept"]);
    assert_eq!(accepted.code, 0, "{}", accepted.both());
    let readme = w.project.join("README");
    assert_eq!(
        std::fs::read_to_string(&readme).unwrap(),
        "HELLO from the project\n"
    );
    assert_eq!(std::fs::metadata(&readme).unwrap().mode() & 0o777, 0o755);
    assert!(!w.project.join("node_modules").exists());
    let lib: Vec<_> = std::fs::read_dir(w.project.join("lib"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        lib,
        ["d.txt"],
        "the directory the jail made anew is not what it made"
    );
    assert!(!w.project.join("src/main.c").exists());
    assert_eq!(
        std::fs::read_to_string(w.project.join("src/app.c")).unwrap(),
        "int main() { return 0; }\n"
    );
    assert_eq!(
        std::fs::read_link(w.project.join("link")).unwrap(),
        Path::new("README")
    );
    assert_eq!(git_log(&w), "jail commit\nfirst\n");
    ok(&w.host_git(&w.project, &["fsck", "--strict"]));
    let status = w.host_git(
        &w.project,
        &["status", "--porcelain", "--untracked-files=no"],
    );
    assert_eq!(
        String::from_utf8_lossy(&status.stdout),
        "",
        "the index is not the commit's"
    );
    // The review is done.
    let none = corral(&w, &["diff"]);
    assert_ne!(none.code, 0);
    assert!(none.stderr.contains("no review"), "{}", none.both());
}

#[test]
fn a_pending_review_refuses_a_new_run_and_discard_drops_it() {
    let w = World::new();
    let before = tree(&w.project);
    review(&w, "echo x > made.txt && rm README && echo END");
    let again = run({
        let mut c = w.corral();
        c.args(["run", "--review", "--", "true"]);
        c
    });
    assert_ne!(again.code, 0);
    assert!(
        again.stderr.contains("pending") && again.stderr.contains("--discard-pending"),
        "{}",
        again.both()
    );
    // --discard-pending drops it and starts over.
    let mut c = w.corral();
    c.args([
        "run",
        "--review",
        "--discard-pending",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        "test ! -e made.txt && test -e README && echo y > other.txt && echo END",
    ]);
    ran(&run(c), "END");
    let stat = corral(&w, &["diff", "--stat"]);
    assert_eq!(stat.stdout, "A other.txt (2 bytes)\n", "{}", stat.both());
    let discarded = corral(&w, &["discard"]);
    assert_eq!(discarded.code, 0, "{}", discarded.both());
    same_tree(&before, &tree(&w.project), "after discard");
    let none = corral(&w, &["diff"]);
    assert!(none.stderr.contains("no review"), "{}", none.both());
}

#[test]
fn accept_never_writes_through_a_link_to_a_host_directory() {
    let w = World::new();
    // The host's own link to a directory outside the project, there before the run.
    std::os::unix::fs::symlink(&w.outside, w.project.join("cache")).unwrap();
    // Control: a write to the project's path cache/pwned lands outside the project.
    assert_eq!(
        std::fs::canonicalize(w.project.join("cache")).unwrap(),
        w.outside
    );
    let outside_before = tree(&w.outside);
    // The jail replaces the link with a directory holding a file, and plants links of its own
    // to the outside directory and to /etc.
    review(
        &w,
        &format!(
            "rm cache && mkdir cache && echo pwned > cache/pwned && ln -s {} out && \
             ln -s /etc etc && echo END",
            w.outside.display()
        ),
    );
    let accepted = corral(&w, &["accept"]);
    assert_eq!(accepted.code, 0, "{}", accepted.both());
    assert_eq!(
        tree(&w.outside),
        outside_before,
        "accept wrote outside the project"
    );
    let cache = std::fs::symlink_metadata(w.project.join("cache")).unwrap();
    assert!(cache.is_dir(), "the link was not replaced by the directory");
    assert_eq!(
        std::fs::read_to_string(w.project.join("cache/pwned")).unwrap(),
        "pwned\n"
    );
    assert_eq!(
        std::fs::read_link(w.project.join("out")).unwrap(),
        w.outside
    );
    assert_eq!(
        std::fs::read_link(w.project.join("etc")).unwrap(),
        Path::new("/etc")
    );
}

#[test]
fn accept_refuses_a_change_set_that_changed_after_diff() {
    let w = World::new();
    review(&w, "echo shown > notes.txt && echo END");
    let diff = corral(&w, &["diff"]);
    assert!(diff.stdout.contains("+shown"), "{}", diff.both());
    // What a jail (or anything) writes into the upper directory after diff showed it.
    std::fs::write(upper(&w).join("notes.txt"), "not shown\n").unwrap();
    std::fs::write(upper(&w).join("extra.txt"), "not shown either\n").unwrap();
    let refused = corral(&w, &["accept"]);
    assert_ne!(refused.code, 0, "{}", refused.both());
    assert!(
        refused
            .stderr
            .contains("no longer what `corral diff` showed"),
        "{}",
        refused.both()
    );
    assert!(!w.project.join("notes.txt").exists());
    assert!(!w.project.join("extra.txt").exists());
    // Control: shown again, the same change set is applied.
    let diff = corral(&w, &["diff"]);
    assert!(diff.stdout.contains("+not shown"), "{}", diff.both());
    let accepted = corral(&w, &["accept"]);
    assert_eq!(accepted.code, 0, "{}", accepted.both());
    assert_eq!(
        std::fs::read_to_string(w.project.join("notes.txt")).unwrap(),
        "not shown\n"
    );
}

#[test]
fn a_git_repository_made_in_review_mode_is_refused_at_accept() {
    let w = World::new();
    // No name gate: the jail can make `.git` in the project's overlay (the control: it did).
    w.allow_new_repositories();
    review(
        &w,
        "mkdir inner && git init -q inner && echo x > inner/f && echo END",
    );
    let stat = corral(&w, &["diff", "--stat"]);
    assert!(stat.stdout.contains("A inner/.git/"), "{}", stat.both());
    let refused = corral(&w, &["accept"]);
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("inner/.git") && refused.stderr.contains("git repository"),
        "{}",
        refused.both()
    );
    assert!(
        !w.project.join("inner").exists(),
        "accept applied part of it"
    );
    // The rest can be accepted on its own.
    let some = corral(&w, &["accept", "inner/f"]);
    assert_eq!(some.code, 0, "{}", some.both());
    assert!(w.project.join("inner/f").exists());
    assert!(!w.project.join("inner/.git").exists());
}

#[test]
fn accept_refuses_hooks_hidden_names_and_set_id_bits_in_the_change_set() {
    let w = World::new();
    w.commit_readme();
    review(&w, "echo ok > fine.txt && echo END");
    // What a jail past the name gate and seccomp would leave in the upper directory.
    let up = upper(&w);
    write(
        &up.join(".git/hooks/post-checkout"),
        "#!/bin/sh\necho pwned\n",
    );
    write(&up.join(".env.local"), "TOKEN=x\n");
    write(&up.join("tool"), "#!/bin/sh\n");
    std::fs::set_permissions(up.join("tool"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    let stat = corral(&w, &["diff", "--stat"]);
    assert!(
        stat.stdout.contains(".git/hooks/post-checkout"),
        "{}",
        stat.both()
    );
    let refused = corral(&w, &["accept"]);
    assert_ne!(refused.code, 0);
    for want in [".git/hooks/post-checkout", ".env.local", "tool: mode 4755"] {
        assert!(
            refused.stderr.contains(want),
            "no {want:?} in\n{}",
            refused.both()
        );
    }
    assert!(!w.project.join(".git/hooks/post-checkout").exists());
    assert!(!w.project.join(".env.local").exists());
    assert!(!w.project.join("tool").exists());
    assert!(
        !w.project.join("fine.txt").exists(),
        "accept applied part of a refused set"
    );
    // Control: the harmless change alone is applied.
    let fine = corral(&w, &["accept", "fine.txt"]);
    assert_eq!(fine.code, 0, "{}", fine.both());
    assert!(w.project.join("fine.txt").exists());
}

#[test]
fn accept_refuses_what_the_host_changed_since_the_run_started() {
    let w = World::new();
    w.commit_readme();
    write(&w.project.join("notes.txt"), "the user's notes\n");
    review(
        &w,
        &format!(
            "echo jail >> README && echo jail >> notes.txt && echo n > n.txt && \
             {GIT} commit -qam jail && echo END"
        ),
    );
    // The host changes a file and commits, and deletes another, while the review is pending.
    std::fs::write(w.project.join("README"), "the user's edit\n").unwrap();
    std::fs::remove_file(w.project.join("notes.txt")).unwrap();
    ok(&w.host_git(
        &w.project,
        &[
            "-c",
            "user.name=u",
            "-c",
            "user.email=u@e",
            "commit",
            "-qam",
            "user",
        ],
    ));
    let refused = corral(&w, &["accept"]);
    assert_ne!(refused.code, 0);
    assert!(
        refused
            .stderr
            .contains("README: changed on the host since the run started"),
        "{}",
        refused.both()
    );
    assert!(refused.stderr.contains("refs moved"), "{}", refused.both());
    assert!(
        refused
            .stderr
            .contains("notes.txt: deleted or moved on the host since the run started"),
        "{}",
        refused.both()
    );
    assert!(!w.project.join("notes.txt").exists());
    assert_eq!(
        std::fs::read_to_string(w.project.join("README")).unwrap(),
        "the user's edit\n"
    );
    assert_eq!(git_log(&w), "user\nfirst\n");
    // Control: what the host did not touch is applied.
    let some = corral(&w, &["accept", "n.txt"]);
    assert_eq!(some.code, 0, "{}", some.both());
    assert!(w.project.join("n.txt").exists());
}

#[test]
fn diff_prints_no_terminal_sequence_the_jail_wrote() {
    let w = World::new();
    // A name and a content with an OSC 52 clipboard write and a cursor move.
    review(
        &w,
        "printf 'x\\033]52;c;cHduZWQ=\\007\\033[2Ay\\n' > \"$(printf 'n\\033]52;c;QQ==\\007')\" && \
         echo END",
    );
    // Control: the change set holds the raw sequences.
    let raw = std::fs::read_dir(upper(&w))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.starts_with('n'))
        .unwrap();
    assert!(raw.contains('\u{1b}'));
    for args in [&["diff", "--stat"][..], &["diff"][..]] {
        let out = corral(&w, args);
        assert_eq!(out.code, 0, "{}", out.both());
        assert!(out.stdout.contains("\\u{1b}]52;c;"), "{}", out.stdout);
        assert!(
            !out.both().contains('\u{1b}'),
            "{args:?} printed an escape: {:?}",
            out.both()
        );
        assert!(
            !out.both().contains('\u{7}'),
            "{args:?} printed a bell: {:?}",
            out.both()
        );
    }
}

#[test]
fn corral_undo_undoes_an_accepted_review_byte_for_byte() {
    let w = World::new();
    write(&w.project.join("src/lib.rs"), "pub fn f() {}\n");
    w.commit_readme();
    let before = tree(&w.project);
    review(
        &w,
        &format!(
            "rm -rf src && sed -i s/hello/bye/ README && chmod 700 README && echo n > n.txt && \
             mkdir -p a/b && echo deep > a/b/c && {GIT} commit -qam jail && echo END"
        ),
    );
    ok_out(&corral(&w, &["diff"]));
    let accepted = corral(&w, &["accept"]);
    assert_eq!(accepted.code, 0, "{}", accepted.both());
    assert!(
        accepted.stderr.contains("`corral undo` puts them back"),
        "{}",
        accepted.both()
    );
    assert_eq!(git_log(&w), "jail\nfirst\n");
    assert!(!w.project.join("src").exists());
    // The control: the accept changed the project; undo puts every byte and mode back.
    assert_ne!(tree(&w.project), before);
    let undone = corral(&w, &["undo"]);
    assert_eq!(undone.code, 0, "{}", undone.both());
    same_tree(&before, &tree(&w.project), "after undo");
    assert_eq!(git_log(&w), "first\n");
}

#[test]
fn a_review_run_that_changed_nothing_leaves_no_review() {
    let w = World::new();
    let out = review(
        &w,
        "cat README > /dev/null && echo scratch > /tmp/x && echo END",
    );
    assert!(
        out.stderr.contains("the run changed nothing"),
        "{}",
        out.both()
    );
    let none = corral(&w, &["diff"]);
    assert!(none.stderr.contains("no review"), "{}", none.both());
    // Control: a run that writes leaves one.
    review(&w, "echo x > y && echo END");
    ok_out(&corral(&w, &["diff", "--stat"]));
}

#[test]
fn a_partial_accept_leaves_exactly_the_rest_pending() {
    let w = World::new();
    write(&w.project.join("lib/a.txt"), "a\n");
    write(&w.project.join("lib/b/c.txt"), "c\n");
    // A directory made anew (opaque in the overlay), and a file elsewhere.
    review(
        &w,
        "rm -rf lib && mkdir lib && echo d > lib/d.txt && echo o > other.txt && echo END",
    );
    let stat = |w: &World| corral(w, &["diff", "--stat"]).stdout;
    assert_eq!(
        stat(&w),
        "A lib/d.txt (2 bytes)\nD lib/a.txt\nD lib/b/\nA other.txt (2 bytes)\n"
    );
    ok_out(&corral(&w, &["accept", "lib/d.txt"]));
    assert!(w.project.join("lib/d.txt").exists() && w.project.join("lib/a.txt").exists());
    assert_eq!(stat(&w), "D lib/a.txt\nD lib/b/\nA other.txt (2 bytes)\n");
    ok_out(&corral(&w, &["accept", "lib"]));
    assert_eq!(stat(&w), "A other.txt (2 bytes)\n");
    let names: Vec<_> = std::fs::read_dir(w.project.join("lib"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["d.txt"]);
    ok_out(&corral(&w, &["accept"]));
    assert!(w.project.join("other.txt").exists());
    assert!(corral(&w, &["diff"]).stderr.contains("no review"));
}

/// The control of the byte-identical checks: the same kind of run without `--review` changes
/// the host's project, and `same_tree` sees it.
#[test]
fn control_without_review_the_run_changes_the_host_project() {
    let w = World::new();
    let before = tree(&w.project);
    let out = w.sh(
        "none",
        "sed -i s/hello/HELLO/ README && echo x > made.txt && echo END",
    );
    ran(&out, "END");
    let after = tree(&w.project);
    let seen = std::panic::catch_unwind(|| same_tree(&before, &after, "in the control"));
    assert!(seen.is_err(), "same_tree did not see the run's changes");
}
