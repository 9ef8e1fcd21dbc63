//! `corral undo`: a jailed run's changes to the project (shell `rm -rf`, `sed -i`, `chmod`,
//! `fchmod`, `mv`, `ln -s`, `git commit`) are put back byte for byte from the change record the
//! name gate keeps outside the project; a path changed after the run (on the host, or by a
//! later run) is never overwritten; a symlink the jail planted is never written through; the record
//! is out of the jail's reach.

mod jail_support;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use jail_support::*;

/// Every name below `root` (the `.git` directory too): its kind, mode, and content or target.
fn listing(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let mode = m.permissions().mode() & 0o7777;
            let v = if m.file_type().is_symlink() {
                format!("link -> {:?}", std::fs::read_link(&p).unwrap())
            } else if m.is_dir() {
                stack.push(p.clone());
                format!("dir {mode:o}")
            } else {
                format!("file {mode:o} {:?}", std::fs::read(&p).unwrap())
            };
            out.insert(rel, v);
        }
    }
    let mode = std::fs::metadata(root).unwrap().permissions().mode() & 0o7777;
    out.insert(PathBuf::from("."), format!("dir {mode:o}"));
    out
}

/// Where the two listings differ, for a failure message.
fn diff(a: &BTreeMap<PathBuf, String>, b: &BTreeMap<PathBuf, String>) -> String {
    let mut s = String::new();
    for k in a
        .keys()
        .chain(b.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        if a.get(k) != b.get(k) {
            s.push_str(&format!("{k:?}: {:?} != {:?}\n", a.get(k), b.get(k)));
        }
    }
    s
}

/// A committed project with ignored and untracked files.
fn project() -> World {
    let w = World::new();
    write(&w.project.join("src/main.rs"), "fn main() {}\n");
    write(&w.project.join("src/deep/lib.rs"), "pub fn f() {}\n");
    write(
        &w.project.join("node_modules/pkg/index.js"),
        "module.exports = 1;\n",
    );
    write(&w.project.join(".gitignore"), "node_modules/\n.env\n");
    write(&w.project.join("notes.txt"), "untracked\n");
    write(&w.project.join("run.sh"), "#!/bin/sh\necho hi\n");
    std::fs::set_permissions(
        w.project.join("run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    ok(&w.host_git(
        &w.project,
        &["add", "README", "src", ".gitignore", "run.sh"],
    ));
    ok(&w.host_git(
        &w.project,
        &[
            "-c",
            "user.name=u",
            "-c",
            "user.email=u@e",
            "commit",
            "-qm",
            "first",
        ],
    ));
    w
}

fn undo(w: &World, args: &[&str]) -> Out {
    let mut c = w.corral();
    c.arg("undo").args(args);
    run(c)
}

/// The run ids `corral log --runs --json` lists, oldest first.
fn run_ids(w: &World) -> Vec<String> {
    let mut c = w.corral();
    c.args(["log", "--runs", "--json"]);
    let out = run(c);
    assert_eq!(out.code, 0, "{}", out.both());
    out.stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["meta"]["id"].as_str().unwrap().to_string()
        })
        .collect()
}

#[test]
fn each_destructive_run_is_undone_byte_for_byte() {
    let git = "git -c user.name=a -c user.email=a@e";
    for script in [
        "rm -rf src node_modules",
        "sed -i s/hello/bye/ README",
        "chmod 600 run.sh && chmod 700 src",
        "mv src source && mv notes.txt source/notes",
        "ln -s src/main.rs main && rm README && ln -s /etc/passwd README",
        // Calls a shell makes rarely: chmod of `.`, a rename exchange, a directory renamed
        // over an empty one, removals through a directory descriptor, truncate, a write in
        // place, a write through a read-only descriptor reopened by /proc/self/fd.
        "mkdir empty && python3 -c \"\
import os, ctypes\n\
os.chmod('.', 0o700)\n\
libc = ctypes.CDLL(None, use_errno=True)\n\
assert libc.renameat2(-100, b'README', -100, b'run.sh', 2) == 0, ctypes.get_errno()\n\
os.rename('src', 'empty')\n\
d = os.open('empty/deep', os.O_RDONLY)\n\
os.unlink('lib.rs', dir_fd=d)\n\
os.rmdir('empty/deep')\n\
os.truncate('notes.txt', 3)\n\
fd = os.open('.gitignore', os.O_RDWR); os.pwrite(fd, b'XX', 2); os.close(fd)\n\
ro = os.open('empty/main.rs', os.O_RDONLY)\n\
w = os.open('/proc/self/fd/%d' % ro, os.O_WRONLY | os.O_TRUNC); os.write(w, b'gone')\n\
\"",
        "python3 -c \"import os; fd = os.open('notes.txt', os.O_RDONLY); \
         os.truncate('/proc/self/fd/%d' % fd, 1)\"",
        // A hard link, then a write through it: the first name's content comes back too.
        "ln run.sh hard && echo appended >> hard && ln src/main.rs src/also && rm src/main.rs",
        &format!("echo x >> README && {git} commit -qam second && {git} tag t"),
        &format!(
            "rm -rf src node_modules && sed -i s/hello/bye/ README && chmod 600 run.sh && \
             mv notes.txt n2 && ln -s n2 n3 && mkdir -p a/b/c && echo y > a/b/c/f && \
             {git} add -A && {git} commit -qm third"
        ),
    ] {
        let w = project();
        let before = listing(&w.project);
        let out = w.sh("none", &format!("set -e; {script}; echo END"));
        assert!(out.stdout.contains("END"), "{script}\n{}", out.both());
        assert!(
            out.stderr.contains("`corral undo`"),
            "{script}\n{}",
            out.both()
        );
        let after = listing(&w.project);
        assert_ne!(before, after, "{script}: the run changed nothing");
        let out = undo(&w, &[]);
        assert_eq!(out.code, 0, "{script}\n{}", out.both());
        let now = listing(&w.project);
        assert!(
            now == before,
            "{script}: not put back:\n{}",
            diff(&before, &now)
        );
        // The undo again: refused, nothing written.
        let ids = run_ids(&w);
        let again = undo(&w, &[&ids[0]]);
        assert_ne!(again.code, 0, "{}", again.both());
        assert!(again.stderr.contains("already undone"), "{}", again.both());
        assert!(listing(&w.project) == before);
    }
}

/// fchmod(2) changes a mode through a descriptor, no name given: the gate performs it while
/// the run keeps a record, so the record keeps the mode first and undo puts it back. The
/// errors are the kernel's (EBADF for an O_PATH descriptor or none), a set-id mode is still
/// refused (EPERM, the base filter), and a pipe or a socket changes as it would outside the gate.
#[test]
fn a_mode_changed_through_a_descriptor_is_undone() {
    // The call alone, on a committed file opened read-only: a run the record lists.
    let w = project();
    let before = listing(&w.project);
    let out = w.sh(
        "none",
        "python3 -c 'import os; os.fchmod(os.open(\"run.sh\", os.O_RDONLY), 0o600)' && echo END",
    );
    assert!(out.stdout.contains("END"), "{}", out.both());
    let mode = |p: &str| {
        std::fs::metadata(w.project.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("run.sh"), 0o600, "the run's fchmod changed nothing");
    assert_eq!(run_ids(&w).len(), 1, "the record kept no run");
    let out = undo(&w, &[]);
    assert_eq!(out.code, 0, "{}", out.both());
    let now = listing(&w.project);
    assert!(now == before, "not put back:\n{}", diff(&before, &now));

    // A committed file, a directory, a file the run made, and the kernel's errors.
    let w = project();
    let before = listing(&w.project);
    let script = "python3 -c \"\
import os, errno, socket\n\
fd = os.open('run.sh', os.O_RDONLY); os.fchmod(fd, 0o700); os.close(fd)\n\
d = os.open('src', os.O_RDONLY | os.O_DIRECTORY); os.fchmod(d, 0o750)\n\
m = os.open('made.sh', os.O_WRONLY | os.O_CREAT, 0o644)\n\
os.write(m, b'x'); os.fchmod(m, 0o711)\n\
def refused(fd, mode=0o777):\n    try: os.fchmod(fd, mode)\n    except OSError as e: return e.errno\n\
x = os.open('run.sh', os.O_RDONLY)\n\
assert refused(x, 0o4755) == errno.EPERM, refused(x, 0o4755)\n\
p = os.open('notes.txt', os.O_PATH)\n\
assert refused(p) == errno.EBADF, refused(p)\n\
assert refused(987) == errno.EBADF, refused(987)\n\
r, w = os.pipe(); os.fchmod(w, 0o640)\n\
assert os.fstat(r).st_mode & 0o7777 == 0o640, oct(os.fstat(r).st_mode)\n\
s = socket.socket(socket.AF_UNIX); os.fchmod(s.fileno(), 0o604)\n\
st = os.fstat(s.fileno()).st_mode\n\
assert st & 0o7777 == 0o604, oct(st)\n\
names = ['run.sh', 'src', 'made.sh', 'notes.txt']\n\
print('MODES', *[oct(os.stat(n).st_mode) for n in names])\n\
\"";
    let out = w.sh("none", &format!("set -e; {script}; echo END"));
    assert!(out.stdout.contains("END"), "{}", out.both());
    let notes = std::fs::metadata(w.project.join("notes.txt"))
        .unwrap()
        .permissions()
        .mode();
    let modes = format!("MODES 0o100700 0o40750 0o100711 {notes:#o}");
    assert!(out.stdout.contains(&modes), "{modes}\n{}", out.both());
    let out = undo(&w, &[]);
    assert_eq!(out.code, 0, "{}", out.both());
    let now = listing(&w.project);
    assert!(now == before, "not put back:\n{}", diff(&before, &now));
}

#[test]
fn the_undo_of_an_undo_redoes_the_run() {
    let w = project();
    let before = listing(&w.project);
    let out = w.sh("none", "rm -rf src && echo new > new.txt && echo END");
    assert!(out.stdout.contains("END"), "{}", out.both());
    let after = listing(&w.project);
    let out = undo(&w, &[]);
    assert_eq!(out.code, 0, "{}", out.both());
    assert!(listing(&w.project) == before);
    let ids = run_ids(&w);
    assert_eq!(ids.len(), 2, "{ids:?}");
    let out = undo(&w, &[&ids[1]]);
    assert_eq!(out.code, 0, "{}", out.both());
    let now = listing(&w.project);
    assert!(now == after, "not redone:\n{}", diff(&after, &now));
}

#[test]
fn a_file_changed_on_the_host_after_the_run_makes_undo_refuse() {
    let w = project();
    let out = w.sh(
        "none",
        "echo agent > README && echo new > new.txt && echo END",
    );
    assert!(out.stdout.contains("END"), "{}", out.both());
    write(&w.project.join("README"), "the user's edit\n");
    let out = undo(&w, &[]);
    assert_ne!(out.code, 0, "{}", out.both());
    assert!(out.stderr.contains("README"), "{}", out.both());
    assert!(!out.stderr.contains("new.txt"), "{}", out.both());
    assert_eq!(
        std::fs::read_to_string(w.project.join("README")).unwrap(),
        "the user's edit\n"
    );
    assert!(
        w.project.join("new.txt").exists(),
        "nothing is undone on a conflict"
    );
    // --force puts it back, and the user's edit can be had again from the undo's record.
    let out = undo(&w, &["--force"]);
    assert_eq!(out.code, 0, "{}", out.both());
    assert_eq!(
        std::fs::read_to_string(w.project.join("README")).unwrap(),
        "hello from the project\n"
    );
    let ids = run_ids(&w);
    let out = undo(&w, &[ids.last().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.both());
    assert_eq!(
        std::fs::read_to_string(w.project.join("README")).unwrap(),
        "the user's edit\n"
    );
}

#[test]
fn an_older_run_under_a_later_one_touching_the_same_file_refuses() {
    let w = project();
    let out = w.sh("none", "echo one > README && echo END");
    assert!(out.stdout.contains("END"), "{}", out.both());
    let out = w.sh("none", "echo two > README && echo END");
    assert!(out.stdout.contains("END"), "{}", out.both());
    let ids = run_ids(&w);
    assert_eq!(ids.len(), 2, "{ids:?}");
    let out = undo(&w, &[&ids[0]]);
    assert_ne!(out.code, 0, "{}", out.both());
    assert!(
        out.stderr.contains("README") && out.stderr.contains(&ids[1]),
        "{}",
        out.both()
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join("README")).unwrap(),
        "two\n"
    );
    // In order, both go back.
    assert_eq!(undo(&w, &[]).code, 0);
    let out = undo(&w, &[&ids[0]]);
    assert_eq!(out.code, 0, "{}", out.both());
    assert_eq!(
        std::fs::read_to_string(w.project.join("README")).unwrap(),
        "hello from the project\n"
    );
}

#[test]
fn undo_never_writes_through_a_symlink_the_jail_planted() {
    let w = project();
    let victim = w.outside.join("secret.txt");
    let was = std::fs::read_to_string(&victim).unwrap();
    let outside_before = listing(&w.outside);
    let before = listing(&w.project);
    // The jail cannot see `outside`, but a symlink's target is only text: it points there on
    // the host. A file and a directory of the project are replaced by such links.
    let script = format!(
        "rm README && ln -s {v} README && mv src src.old && ln -s {o} src && echo END",
        v = victim.display(),
        o = w.outside.display()
    );
    let out = w.sh("none", &script);
    assert!(out.stdout.contains("END"), "{}", out.both());
    // Control: a restore by path, as a naive undo would write it, lands outside the project.
    assert!(
        std::fs::symlink_metadata(w.project.join("README"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(
        std::fs::canonicalize(w.project.join("src/secret.txt")).unwrap(),
        victim
    );
    let out = undo(&w, &[]);
    assert_eq!(out.code, 0, "{}", out.both());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), was);
    assert!(
        listing(&w.outside) == outside_before,
        "{}",
        diff(&outside_before, &listing(&w.outside))
    );
    let now = listing(&w.project);
    assert!(now == before, "{}", diff(&before, &now));
}

#[test]
fn the_change_record_is_out_of_the_jails_reach() {
    let w = project();
    let store = w.home.join(".local/state/corral/changes");
    // A first run, so the store holds a record to find.
    let out = w.sh("none", "echo one > README && echo END");
    assert!(out.stdout.contains("END"), "{}", out.both());
    // Control: on the host the store is there, with the run's manifest.
    let manifests: Vec<_> = walk(&store)
        .into_iter()
        .filter(|p| p.ends_with("manifest.jsonl"))
        .collect();
    assert_eq!(manifests.len(), 1, "{manifests:?}");
    // In the jail: by its path, through PID 1's descriptors, or by a search of the root.
    let script = format!(
        "ls -la /proc/1/fd/ 2>&1; for f in /proc/1/fd/*; do ls \"$f/\" 2>&1; done; \
         ls {s} 2>&1; find / -xdev -name manifest.jsonl 2>/dev/null; \
         find /proc/1/ -maxdepth 2 -name 'manifest*' 2>/dev/null; \
         echo pwn > /proc/1/fd/3/manifest.jsonl 2>&1; echo END",
        s = store.display()
    );
    let out = w.sh("none", &script);
    assert!(out.stdout.contains("END"), "{}", out.both());
    assert!(!out.stdout.contains("meta.json"), "{}", out.both());
    assert!(!out.stdout.contains("manifest.jsonl\n"), "{}", out.both());
    for m in walk(&store)
        .into_iter()
        .filter(|p| p.ends_with("manifest.jsonl"))
    {
        let text = std::fs::read_to_string(&m).unwrap();
        assert!(!text.contains("pwn"), "{text}");
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

/// corral's state directory (the change record's home) where the jail would see it: in the
/// project, the run is refused (policy); in a read-write bind, the run keeps no record and
/// says so (`corral-run/src/record.rs: try_begin`), and nothing of a record is there. With it elsewhere
/// (the control) the same run is recorded.
#[test]
fn a_store_the_jail_could_reach_keeps_no_record() {
    let w = project();
    let inside = w.project.join("state");
    std::fs::create_dir_all(&inside).unwrap();
    let mut c = w.sh_command("none", "echo agent > README && echo END");
    c.env("XDG_STATE_HOME", &inside);
    let out = run(c);
    assert!(!out.stdout.contains("END"), "{}", out.both());
    assert!(
        out.stderr.contains("corral's own directory"),
        "{}",
        out.both()
    );
    let bound = w.outside.join("state");
    std::fs::create_dir_all(&bound).unwrap();
    let mut c = w.corral();
    c.args(["run", "--network", "none", "--rw"]).arg(&w.outside);
    c.args(["--", "sh", "-c", "echo agent > README && echo END"]);
    c.env("XDG_STATE_HOME", &bound);
    let out = run(c);
    assert!(out.stdout.contains("END"), "{}", out.both());
    assert!(
        out.stderr.contains("keeps no change record"),
        "{}",
        out.both()
    );
    assert!(!bound.join("corral/changes").exists(), "{:?}", walk(&bound));
    let out = w.sh("none", "echo again > README && echo END");
    assert!(out.stdout.contains("END"), "{}", out.both());
    assert!(
        !out.stderr.contains("keeps no change record"),
        "{}",
        out.both()
    );
    assert_eq!(run_ids(&w).len(), 1);
}

/// `corral log --runs`: one row per recorded run (id, start, counts, size, command, its undo),
/// and the store's use of its bounds (the user config's `[undo]`).
#[test]
fn corral_log_runs_shows_each_run_and_the_bounds() {
    let w = project();
    let config = w.home.join(".config/corral/config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{text}[undo]\nkeep_runs = 7\nmax_size = \"3m\"\n"),
    )
    .unwrap();
    let out = w.sh("none", "rm -rf src && echo new > new.txt && echo END");
    assert!(out.stdout.contains("END"), "{}", out.both());
    assert_eq!(undo(&w, &[]).code, 0);
    let mut c = w.corral();
    c.args(["log", "--runs"]);
    let out = run(c);
    assert_eq!(out.code, 0, "{}", out.both());
    let ids = run_ids(&w);
    // Ids, times and sizes vary: each row with them replaced, compared whole.
    let rows: Vec<String> = out
        .stdout
        .lines()
        .map(|l| {
            let mut l = l.to_string();
            for (i, id) in ids.iter().enumerate() {
                l = l.replace(id.as_str(), &format!("RUN{i}"));
            }
            let cols: Vec<&str> = l.split_whitespace().collect();
            match cols.first() {
                Some(c) if c.starts_with("RUN") && cols.len() > 7 => format!(
                    "{} TIME {} {} {} SIZE {}",
                    cols[0],
                    cols[2],
                    cols[3],
                    cols[4],
                    cols[7..].join(" ")
                ),
                _ => cols.join(" "),
            }
        })
        .map(|l| match l.split_once(" kept in ") {
            Some((usage, _)) => usage.replace(char::is_numeric, "#"),
            None => l,
        })
        .collect();
    assert_eq!(
        rows,
        [
            "RUN STARTED CREATED MODIFIED DELETED RECORD COMMAND",
            "RUN0 TIME 1 0 4 SIZE /usr/bin/sh -c rm -rf src && echo new > new.txt && echo END (undone by RUN1)",
            "RUN1 TIME 4 0 1 SIZE corral undo RUN0",
            "change record: # run(s), #.# KiB",
        ],
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("at most 7 runs and 3.0 MiB"),
        "{}",
        out.stdout
    );
}
