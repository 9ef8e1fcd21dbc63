//! The store, the record and undo, on real files (no jail: the test plays the name gate,
//! calling the record before each change as the gate does).

use std::collections::BTreeMap;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use crate::{Options, Place, Retention, RunRecord, Store, UndoError, undo};

/// Every name below `root`: kind, mode, and content or link target.
fn listing(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let mode = m.permissions().mode() & 0o7777;
            let v = if m.file_type().is_symlink() {
                format!("link {:?}", fs::read_link(&p).unwrap())
            } else if m.is_dir() {
                stack.push(p.clone());
                format!("dir {mode:o}")
            } else {
                format!("file {mode:o} {:?}", fs::read(&p).unwrap())
            };
            out.insert(rel, v);
        }
    }
    let m = fs::metadata(root).unwrap();
    out.insert(
        PathBuf::new(),
        format!("root {:o}", m.permissions().mode() & 0o7777),
    );
    out
}

struct Fixture {
    _tmp: tempfile::TempDir,
    project: PathBuf,
    store: Store,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    fs::create_dir_all(project.join("src/deep")).unwrap();
    fs::write(project.join("src/main.rs"), "fn main() {}\n").unwrap();
    fs::write(project.join("src/deep/lib.rs"), "pub fn f() {}\n").unwrap();
    fs::write(project.join("README"), "hello\n").unwrap();
    fs::set_permissions(project.join("README"), fs::Permissions::from_mode(0o640)).unwrap();
    symlink("src/main.rs", project.join("link")).unwrap();
    let store = Store::open(&tmp.path().join("state"), "project-0000").unwrap();
    Fixture {
        _tmp: tmp,
        project,
        store,
    }
}

/// The gate's part: the record of `rel` before it changes.
fn before(rec: &RunRecord, project: &Path, rel: &str) {
    let (dir, name) = crate::path::split(rel.as_bytes());
    let d = OwnedFd::from(fs::File::open(project.join(std::str::from_utf8(dir).unwrap())).unwrap());
    rec.before_change(Place {
        dir: d.as_fd(),
        rel_dir: dir,
        name,
    })
    .unwrap();
}

fn before_rename(rec: &RunRecord, project: &Path, from: &str, to: &str) {
    let open = |rel: &str| {
        let (dir, _) = crate::path::split(rel.as_bytes());
        OwnedFd::from(fs::File::open(project.join(std::str::from_utf8(dir).unwrap())).unwrap())
    };
    let (fd, td) = (open(from), open(to));
    let (f, t) = (
        crate::path::split(from.as_bytes()),
        crate::path::split(to.as_bytes()),
    );
    rec.before_rename(
        Place {
            dir: fd.as_fd(),
            rel_dir: f.0,
            name: f.1,
        },
        Place {
            dir: td.as_fd(),
            rel_dir: t.0,
            name: t.1,
        },
        false,
    )
    .unwrap();
}

/// A record of `fx`'s project whose content budget is 1 KiB.
fn begin_with_1k_budget(fx: &Fixture) -> RunRecord {
    let keep = Retention {
        runs: 5,
        bytes: 1024,
    };
    fx.store.begin(&["x".into()], &fx.project, keep).unwrap()
}

fn finish(fx: &Fixture, rec: &RunRecord) {
    finish_keeping(fx, rec, Retention::default())
}

fn finish_keeping(fx: &Fixture, rec: &RunRecord, keep: Retention) {
    let root = OwnedFd::from(fs::File::open(&fx.project).unwrap());
    fx.store.finish(rec.id(), root.as_fd(), keep).unwrap();
}

fn opts() -> Options {
    Options::default()
}

/// A destructive run: every kind of change, each recorded first.
fn destructive_run(fx: &Fixture) -> String {
    let p = &fx.project;
    let rec = fx
        .store
        .begin(&["agent".into()], p, Retention::default())
        .unwrap();
    before(&rec, p, "README");
    fs::write(p.join("README"), "changed\n").unwrap();
    before(&rec, p, "README");
    fs::set_permissions(p.join("README"), fs::Permissions::from_mode(0o755)).unwrap();
    before(&rec, p, "new.txt");
    fs::write(p.join("new.txt"), "new").unwrap();
    before(&rec, p, "link");
    fs::remove_file(p.join("link")).unwrap();
    before(&rec, p, "link");
    symlink("/etc/passwd", p.join("link")).unwrap();
    before_rename(&rec, p, "src", "moved");
    fs::rename(p.join("src"), p.join("moved")).unwrap();
    before(&rec, p, "moved/deep/lib.rs");
    fs::remove_file(p.join("moved/deep/lib.rs")).unwrap();
    before(&rec, p, "moved/deep");
    fs::remove_dir(p.join("moved/deep")).unwrap();
    before(&rec, p, "newdir");
    fs::create_dir(p.join("newdir")).unwrap();
    before(&rec, p, "newdir/x");
    fs::write(p.join("newdir/x"), "x").unwrap();
    before(&rec, p, "");
    fs::set_permissions(p, fs::Permissions::from_mode(0o750)).unwrap();
    finish(fx, &rec);
    rec.id().to_string()
}

#[test]
fn a_destructive_run_is_undone_byte_for_byte_and_the_undo_can_be_undone() {
    let fx = fixture();
    let was = listing(&fx.project);
    let id = destructive_run(&fx);
    let after_run = listing(&fx.project);
    assert_ne!(was, after_run);
    let info = fx.store.run(&id).unwrap();
    assert_eq!(
        (info.created, info.modified, info.deleted),
        (5, 3, 4),
        "{info:?}"
    );
    let report = undo(&fx.store, &id, &fx.project, opts()).unwrap();
    assert_eq!(listing(&fx.project), was);
    // Twice: refused, nothing written.
    let again = undo(&fx.store, &id, &fx.project, opts()).unwrap_err();
    assert!(matches!(again, UndoError::Refused { .. }), "{again}");
    // The undo's own record redoes the run.
    undo(&fx.store, &report.record, &fx.project, opts()).unwrap();
    assert_eq!(listing(&fx.project), after_run);
    // And the run may be undone again.
    undo(&fx.store, &id, &fx.project, opts()).unwrap();
    assert_eq!(listing(&fx.project), was);
}

#[test]
fn a_file_changed_on_the_host_after_the_run_is_never_overwritten() {
    let fx = fixture();
    let p = &fx.project;
    let rec = fx
        .store
        .begin(&["agent".into()], p, Retention::default())
        .unwrap();
    before(&rec, p, "README");
    fs::write(p.join("README"), "agent\n").unwrap();
    before(&rec, p, "new.txt");
    fs::write(p.join("new.txt"), "agent").unwrap();
    finish(&fx, &rec);
    fs::write(p.join("README"), "the user's own edit\n").unwrap();
    let err = undo(&fx.store, rec.id(), p, opts()).unwrap_err();
    let UndoError::Conflicts(c) = &err else {
        panic!("{err}")
    };
    assert_eq!(c.len(), 1, "{err}");
    assert_eq!(c[0].path, "README");
    assert!(err.to_string().contains("README"), "{err}");
    assert_eq!(
        fs::read_to_string(p.join("README")).unwrap(),
        "the user's own edit\n"
    );
    assert!(
        p.join("new.txt").exists(),
        "nothing is undone when one path conflicts"
    );
    // A file the user made in a directory the run made: the directory is not removed.
    let fx = fixture();
    let p = &fx.project;
    let rec = fx
        .store
        .begin(&["agent".into()], p, Retention::default())
        .unwrap();
    before(&rec, p, "made");
    fs::create_dir(p.join("made")).unwrap();
    finish(&fx, &rec);
    fs::write(p.join("made/mine"), "mine").unwrap();
    let err = undo(&fx.store, rec.id(), p, opts()).unwrap_err();
    assert!(err.to_string().contains("made/mine"), "{err}");
    // --force puts back what was recorded; the user's edit is kept in the undo's record.
    let fx = fixture();
    let p = &fx.project;
    let rec = fx
        .store
        .begin(&["agent".into()], p, Retention::default())
        .unwrap();
    before(&rec, p, "README");
    fs::write(p.join("README"), "agent\n").unwrap();
    finish(&fx, &rec);
    fs::write(p.join("README"), "user\n").unwrap();
    let forced = Options {
        force: true,
        ..opts()
    };
    let report = undo(&fx.store, rec.id(), p, forced).unwrap();
    assert_eq!(fs::read_to_string(p.join("README")).unwrap(), "hello\n");
    undo(&fx.store, &report.record, p, opts()).unwrap();
    assert_eq!(fs::read_to_string(p.join("README")).unwrap(), "user\n");
}

#[test]
fn an_older_run_under_a_later_one_that_touched_the_same_paths_is_refused() {
    let fx = fixture();
    let p = &fx.project;
    let first = fx
        .store
        .begin(&["one".into()], p, Retention::default())
        .unwrap();
    before(&first, p, "README");
    fs::write(p.join("README"), "one\n").unwrap();
    finish(&fx, &first);
    std::thread::sleep(std::time::Duration::from_millis(5));
    let second = fx
        .store
        .begin(&["two".into()], p, Retention::default())
        .unwrap();
    before(&second, p, "README");
    fs::write(p.join("README"), "two\n").unwrap();
    finish(&fx, &second);
    let err = undo(&fx.store, first.id(), p, opts()).unwrap_err();
    assert!(err.to_string().contains(second.id()), "{err}");
    assert_eq!(fs::read_to_string(p.join("README")).unwrap(), "two\n");
    // Undone in order, both go back.
    undo(&fx.store, second.id(), p, opts()).unwrap();
    undo(&fx.store, first.id(), p, opts()).unwrap();
    assert_eq!(fs::read_to_string(p.join("README")).unwrap(), "hello\n");
}

#[test]
fn undo_never_writes_through_a_symlink_planted_where_a_recorded_name_was() {
    let fx = fixture();
    let p = &fx.project;
    let outside = fx._tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("victim"), "victim").unwrap();
    fs::write(outside.join("main.rs"), "outside").unwrap();
    let rec = fx
        .store
        .begin(&["agent".into()], p, Retention::default())
        .unwrap();
    // The run replaces a file and a directory with symlinks out of the project.
    before(&rec, p, "README");
    fs::remove_file(p.join("README")).unwrap();
    symlink(outside.join("victim"), p.join("README")).unwrap();
    before_rename(&rec, p, "src", "src.old");
    fs::rename(p.join("src"), p.join("src.old")).unwrap();
    before(&rec, p, "src");
    symlink(&outside, p.join("src")).unwrap();
    finish(&fx, &rec);
    // Control: a restore by path would write through them.
    fs::write(p.join("README"), "through").unwrap();
    assert_eq!(
        fs::read_to_string(outside.join("victim")).unwrap(),
        "through"
    );
    fs::write(outside.join("victim"), "victim").unwrap();
    let was_outside = listing(&outside);
    undo(&fx.store, rec.id(), p, opts()).unwrap();
    assert_eq!(listing(&outside), was_outside);
    assert_eq!(fs::read_to_string(p.join("README")).unwrap(), "hello\n");
    assert!(fs::symlink_metadata(p.join("src")).unwrap().is_dir());
    assert_eq!(
        fs::read_to_string(p.join("src/main.rs")).unwrap(),
        "fn main() {}\n"
    );
}

#[test]
fn a_record_naming_a_path_outside_the_project_is_damage() {
    let fx = fixture();
    let rec = fx
        .store
        .begin(&["x".into()], &fx.project, Retention::default())
        .unwrap();
    let manifest = fx.store.root().join(rec.id()).join("manifest.jsonl");
    fs::write(
        &manifest,
        "{\"path\":\"../escape\",\"before\":{\"kind\":\"absent\"}}\n",
    )
    .unwrap();
    let root = OwnedFd::from(fs::File::open(&fx.project).unwrap());
    let err = fx
        .store
        .finish(rec.id(), root.as_fd(), Retention::default())
        .unwrap_err();
    assert!(err.to_string().contains("outside the project"), "{err}");
    assert!(fx.store.run("../x").is_err());
    assert!(Store::open(fx._tmp.path(), "../up").is_err());
}

#[test]
fn retention_keeps_the_newest_runs_within_the_byte_bound() {
    let fx = fixture();
    let p = &fx.project;
    let keep = Retention {
        runs: 3,
        bytes: 1 << 20,
    };
    let mut ids = Vec::new();
    for i in 0..5 {
        let rec = fx.store.begin(&[format!("run{i}")], p, keep).unwrap();
        before(&rec, p, "README");
        fs::write(p.join("README"), format!("{i}\n")).unwrap();
        finish_keeping(&fx, &rec, keep);
        ids.push(rec.id().to_string());
    }
    let runs: Vec<String> = fx
        .store
        .runs()
        .unwrap()
        .into_iter()
        .map(|r| r.meta.id)
        .collect();
    assert_eq!(runs, ids[2..].to_vec());
    // Bytes: a bound below one run's record leaves only the newest.
    fs::write(p.join("big"), vec![7u8; 64 << 10]).unwrap();
    let small = Retention {
        runs: 10,
        bytes: 100 << 10,
    };
    for i in 0..2u8 {
        let rec = fx.store.begin(&["big".into()], p, small).unwrap();
        before(&rec, p, "big");
        fs::write(p.join("big"), vec![8 + i; 64 << 10]).unwrap();
        finish_keeping(&fx, &rec, small);
        ids.push(rec.id().to_string());
    }
    let runs: Vec<String> = fx
        .store
        .runs()
        .unwrap()
        .into_iter()
        .map(|r| r.meta.id)
        .collect();
    assert_eq!(runs.last(), ids.last());
    let (_, bytes) = fx.store.usage().unwrap();
    assert!(
        bytes <= small.bytes,
        "{bytes} {:#?}",
        fx.store.runs().unwrap()
    );
}

#[test]
fn undoing_the_oldest_run_of_a_full_store_reads_it_before_it_is_pruned() {
    let fx = fixture();
    let p = &fx.project;
    let keep = Retention {
        runs: 2,
        bytes: 1 << 20,
    };
    let rec = fx.store.begin(&["one".into()], p, keep).unwrap();
    before(&rec, p, "README");
    fs::write(p.join("README"), "one\n").unwrap();
    finish_keeping(&fx, &rec, keep);
    let other = fx.store.begin(&["two".into()], p, keep).unwrap();
    before(&other, p, "new");
    fs::write(p.join("new"), "two").unwrap();
    finish_keeping(&fx, &other, keep);
    let opts = Options {
        force: false,
        retention: keep,
    };
    undo(&fx.store, rec.id(), p, opts).unwrap();
    assert_eq!(fs::read_to_string(p.join("README")).unwrap(), "hello\n");
    assert_eq!(fs::read_to_string(p.join("new")).unwrap(), "two");
}

#[test]
fn a_run_over_its_budget_is_incomplete_and_refuses_undo() {
    let fx = fixture();
    let p = &fx.project;
    fs::write(p.join("big"), vec![1u8; 4096]).unwrap();
    let rec = begin_with_1k_budget(&fx);
    before(&rec, p, "big");
    fs::write(p.join("big"), "small").unwrap();
    finish(&fx, &rec);
    let info = fx.store.runs().unwrap().pop().unwrap();
    assert!(info.incomplete.is_some());
    let err = undo(&fx.store, rec.id(), p, opts()).unwrap_err();
    assert!(err.to_string().contains("incomplete"), "{err}");
    assert_eq!(fs::read_to_string(p.join("big")).unwrap(), "small");
}

#[test]
fn a_run_that_changed_nothing_keeps_no_record() {
    let fx = fixture();
    let p = &fx.project;
    let rec = fx
        .store
        .begin(&["x".into()], p, Retention::default())
        .unwrap();
    before(&rec, p, "tmpfile");
    fs::write(p.join("tmpfile"), "x").unwrap();
    before(&rec, p, "tmpfile");
    fs::remove_file(p.join("tmpfile")).unwrap();
    before(&rec, p, "README");
    fs::write(p.join("README"), "hello\n").unwrap();
    let root = fs::File::open(p).map(OwnedFd::from).unwrap();
    let (info, changes) = fx
        .store
        .finish_listed(rec.id(), root.as_fd(), Retention::default())
        .unwrap();
    assert!(changes.is_empty());
    assert_eq!((info.created, info.modified, info.deleted), (0, 0, 0));
    assert!(info.finished.is_some() && info.incomplete.is_none());
    assert!(fx.store.runs().unwrap().is_empty());
    // Nothing left of the run; the project's store stays for the next one.
    assert_eq!(fs::read_dir(fx.store.root()).unwrap().count(), 0);
}

#[test]
fn the_first_state_of_a_path_in_a_run_is_the_one_kept() {
    let fx = fixture();
    let p = &fx.project;
    let rec = fx
        .store
        .begin(&["x".into()], p, Retention::default())
        .unwrap();
    // sed -i: a temporary file renamed over the original.
    before(&rec, p, "src/sedtmp");
    fs::write(p.join("src/sedtmp"), "fn main() { changed }\n").unwrap();
    before_rename(&rec, p, "src/sedtmp", "src/main.rs");
    fs::rename(p.join("src/sedtmp"), p.join("src/main.rs")).unwrap();
    before(&rec, p, "src/main.rs");
    fs::write(p.join("src/main.rs"), "again").unwrap();
    finish(&fx, &rec);
    let info = fx.store.run(rec.id()).unwrap();
    assert_eq!(
        (info.created, info.modified, info.deleted),
        (0, 1, 0),
        "{info:?}"
    );
    undo(&fx.store, rec.id(), p, opts()).unwrap();
    assert_eq!(
        fs::read_to_string(p.join("src/main.rs")).unwrap(),
        "fn main() {}\n"
    );
    assert!(!p.join("src/sedtmp").exists());
}

#[test]
fn a_host_writer_records_by_project_path() {
    let fx = fixture();
    let p = &fx.project;
    let root = OwnedFd::from(fs::File::open(p).unwrap());
    let rec = fx
        .store
        .begin(&["accept".into()], p, Retention::default())
        .unwrap();
    for rel in ["README", "new/dir", "new/dir/file", "new"] {
        rec.before_path(root.as_fd(), rel.as_bytes()).unwrap();
    }
    fs::write(p.join("README"), "accepted\n").unwrap();
    fs::create_dir_all(p.join("new/dir")).unwrap();
    fs::write(p.join("new/dir/file"), "x").unwrap();
    // Through a symlink: refused.
    symlink(fx._tmp.path(), p.join("out")).unwrap();
    assert!(rec.before_path(root.as_fd(), b"out/x").is_err());
    assert!(rec.before_path(root.as_fd(), b"../x").is_err());
    fs::remove_file(p.join("out")).unwrap();
    finish(&fx, &rec);
    undo(&fx.store, rec.id(), p, opts()).unwrap();
    assert_eq!(fs::read_to_string(p.join("README")).unwrap(), "hello\n");
    assert!(!p.join("new").exists());
}

#[test]
fn a_record_over_its_budget_still_notes_every_name_and_compares_by_metadata() {
    let fx = fixture();
    let p = &fx.project;
    fs::write(p.join("big"), vec![1u8; 4096]).unwrap();
    fs::write(p.join("kept"), "same\n").unwrap();
    let rec = begin_with_1k_budget(&fx);
    // Over the budget at once: no content is kept, but every name is noted.
    before(&rec, p, "big");
    fs::write(p.join("big"), "small").unwrap();
    before(&rec, p, "new-after-budget");
    fs::write(p.join("new-after-budget"), "n").unwrap();
    before(&rec, p, "src/main.rs");
    fs::remove_file(p.join("src/main.rs")).unwrap();
    // Opened for writing, not written: the same inode, size and times.
    before(&rec, p, "kept");
    drop(
        fs::OpenOptions::new()
            .append(true)
            .open(p.join("kept"))
            .unwrap(),
    );
    let root = OwnedFd::from(fs::File::open(p).unwrap());
    let (info, changes) = fx
        .store
        .finish_listed(rec.id(), root.as_fd(), Retention::default())
        .unwrap();
    assert!(info.incomplete.is_some());
    let listed: Vec<(String, &str, &str)> = changes
        .iter()
        .map(|c| {
            (
                String::from_utf8(c.path.clone()).unwrap(),
                c.before.kind(),
                c.after.kind(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("big".to_string(), "file", "file"),
            ("new-after-budget".to_string(), "absent", "file"),
            ("src/main.rs".to_string(), "file", "absent"),
        ]
    );
}

#[test]
fn two_writers_of_one_record_keep_the_first_state_and_distinct_blobs() {
    let fx = fixture();
    let p = &fx.project;
    let rec = fx
        .store
        .begin(&["x".into()], p, Retention::default())
        .unwrap();
    // A second writer of the same run's directory (an executor command's jail), opened while
    // the first one writes.
    let dir = OwnedFd::from(fs::File::open(fx.store.root().join(rec.id())).unwrap());
    let other = RunRecord::from_dir_fd(dir).unwrap();
    before(&rec, p, "README");
    fs::write(p.join("README"), "first writer\n").unwrap();
    // The other does not know the path yet: its line comes second, and the first wins.
    before(&other, p, "README");
    fs::write(p.join("README"), "second writer\n").unwrap();
    before(&other, p, "src/main.rs");
    fs::write(p.join("src/main.rs"), "changed\n").unwrap();
    before(&rec, p, "src/deep/lib.rs");
    fs::write(p.join("src/deep/lib.rs"), "changed too\n").unwrap();
    finish(&fx, &rec);
    undo(&fx.store, rec.id(), p, opts()).unwrap();
    assert_eq!(fs::read_to_string(p.join("README")).unwrap(), "hello\n");
    assert_eq!(
        fs::read_to_string(p.join("src/main.rs")).unwrap(),
        "fn main() {}\n"
    );
    assert_eq!(
        fs::read_to_string(p.join("src/deep/lib.rs")).unwrap(),
        "pub fn f() {}\n"
    );
}

#[test]
fn a_writer_joining_a_record_mid_line_leaves_that_line_to_its_writer() {
    let fx = fixture();
    let p = &fx.project;
    let rec = fx
        .store
        .begin(&["x".into()], p, Retention::default())
        .unwrap();
    before(&rec, p, "README");
    // Another writer's line, half written.
    let dir = fx.store.root().join(rec.id());
    let mut m = fs::OpenOptions::new()
        .append(true)
        .open(dir.join("manifest.jsonl"))
        .unwrap();
    std::io::Write::write_all(&mut m, b"{\"path\":\"src/ma").unwrap();
    let joined = RunRecord::from_dir_fd(OwnedFd::from(fs::File::open(&dir).unwrap()));
    assert!(joined.is_ok(), "{:?}", joined.err());
    // Read whole at the end, the cut line is damage.
    let root = OwnedFd::from(fs::File::open(p).unwrap());
    assert!(
        fx.store
            .finish(rec.id(), root.as_fd(), Retention::default())
            .is_err()
    );
}
