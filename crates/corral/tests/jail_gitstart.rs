//! The change summary's baseline and the jail's start run side by side: the jail's
//! root is built while the baseline is taken, and only the command's exec waits for it. A file
//! the command writes in its very first instant is still listed; and the git method's shortcut
//! for an unchanged project (a metadata walk at both ends, changes.rs `Quick`) gives the lists
//! git gives. These are the listing methods' (the fallback when the run's change record cannot
//! stand for the summary): each world keeps no record.

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

fn change_lines(out: &Out) -> Vec<&str> {
    out.stderr
        .lines()
        .filter(|l| l.starts_with("corral: changed in"))
        .collect()
}

/// The baseline of this project takes a while: 30 untracked files of 8 MiB (sparse: no disk
/// used) are hashed at the start, in name order, before `zz-last.txt`. The command appends to
/// `zz-last.txt` and creates `aa-new.txt` first thing. Were the command to run before the
/// baseline was complete, `zz-last.txt` would be fingerprinted after its edit (and not listed),
/// or `aa-new.txt` listed as there at the start. Checked by hand against a build that releases
/// the exec before `Session::await_baseline`: this test then fails (zz-last.txt unlisted).
#[test]
fn a_file_written_in_the_commands_first_instant_is_listed() {
    let w = World::new();
    w.keep_no_record();
    write(&w.project.join("README.md"), "readme\n");
    git(&w, &["init", "-q"]);
    git(&w, &["add", "README.md"]);
    git(&w, &["commit", "-qm", "init"]);
    std::fs::create_dir_all(w.project.join("big")).unwrap();
    for i in 0..30 {
        let f = std::fs::File::create(w.project.join(format!("big/{i:02}.bin"))).unwrap();
        f.set_len(8 << 20).unwrap();
    }
    write(&w.project.join("zz-last.txt"), "before\n");
    let out = w.sh(
        "none",
        "echo first >> zz-last.txt; echo new > aa-new.txt; echo END",
    );
    ran(&out, "END");
    assert_eq!(out.code, 0, "{}", out.both());
    assert_eq!(
        change_lines(&out),
        vec![format!(
            "corral: changed in {}: created aa-new.txt, modified zz-last.txt",
            w.project.display()
        )],
        "{}",
        out.stderr
    );
}

/// A committed project whose files are old enough for the shortcut (changes.rs
/// `QUICK_RACY_NS`: 5 s), with an ignored `build/` and an untracked, ignored `debug.log`.
fn settled_world() -> World {
    let w = World::new();
    w.keep_no_record();
    for (name, text) in [
        ("edit.txt", "one\n"),
        ("gone.txt", "bye\n"),
        ("keep.txt", "same\n"),
        ("dirty.txt", "committed\n"),
        ("src/lib.rs", "fn a() {}\n"),
        ("build/old.o", "o\n"),
        ("debug.log", "x\n"),
    ] {
        write(&w.project.join(name), text);
    }
    write(&w.project.join(".gitignore"), "*.log\nbuild/\n");
    git(&w, &["init", "-q"]);
    git(&w, &["add", "-A"]);
    git(&w, &["commit", "-qm", "init"]);
    write(&w.project.join("dirty.txt"), "changed before the run\n");
    write(&w.project.join("untracked.txt"), "u\n");
    // Not a timing assertion: the files must be older than the shortcut's racy window.
    std::thread::sleep(std::time::Duration::from_secs(6));
    w
}

/// With the shortcut in play (settled files), a run that changes nothing lists nothing, one
/// that only writes a file inside the ignored `build/` lists nothing (git does not enter it),
/// and one that changes things gets git's lists (the same run as jail_changes' git test).
#[test]
fn a_settled_project_gets_the_same_lists_as_git_gives() {
    let w = settled_world();
    for script in [
        "cat edit.txt >/dev/null && ls -R >/dev/null && echo END",
        "echo more >> build/old.o && echo END",
    ] {
        let out = w.sh("none", script);
        ran(&out, "END");
        assert!(change_lines(&out).is_empty(), "{script}: {}", out.stderr);
    }
    let out = w.sh(
        "none",
        "echo two >> edit.txt && rm gone.txt && echo n > new.txt && \
         mkdir -p deep/er && echo f > deep/er/file && \
         echo 'edited in the jail' >> dirty.txt && touch keep.txt && \
         echo y >> debug.log && echo END",
    );
    ran(&out, "END");
    assert_eq!(
        change_lines(&out),
        vec![format!(
            "corral: changed in {}: created deep/er/file, created new.txt, \
             modified dirty.txt, modified edit.txt, deleted gone.txt",
            w.project.display()
        )],
        "{}",
        out.stderr
    );
}

/// The shortcut must not hide an edit that keeps the size and puts the mtime back: ctime
/// still moves, and git (run because the walk differs) sees the content.
#[test]
fn a_settled_edit_with_its_mtime_put_back_is_listed() {
    let w = settled_world();
    let out = w.sh(
        "none",
        "touch -r keep.txt /tmp/ref && echo SAME > keep.txt && touch -r /tmp/ref keep.txt && \
         echo END",
    );
    ran(&out, "END");
    assert_eq!(
        change_lines(&out),
        vec![format!(
            "corral: changed in {}: modified keep.txt",
            w.project.display()
        )],
        "{}",
        out.stderr
    );
}
