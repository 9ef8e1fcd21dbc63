//! Every rule of the gate as rows of a table, run through the whole path of a stopped call
//! ([`handle`]: the caller's memory read, the path resolved, the name checked, the call
//! performed) with the [`Fake`] system: no jail, no seccomp, no root. Each row names the rule
//! it checks. The jail tests (crates/corral/tests/jail_gitwindow.rs, jail_hidden.rs) attack
//! the same rules for real.

use std::collections::HashSet;
use std::os::fd::OwnedFd;

use super::fake::{self, Fake};
use super::protected::{Use, refusal_errno};
use super::*;

/// Errors a lookup can give that say nothing about whether the name is there.
const NOT_ENOENT: [i32; 7] = [
    libc::EACCES,
    libc::ELOOP,
    libc::EIO,
    libc::ENOMEM,
    libc::ENOTDIR,
    libc::ENAMETOOLONG,
    libc::EOVERFLOW,
];

/// The caller's socket descriptors in the fake (a Unix one, an INET one).
const UNIX_SOCK: i32 = 7;
const INET_SOCK: i32 = 8;
/// A directory descriptor of the caller, open on /work/proj/sub.
const SUB_FD: i32 = 5;

/// The tree every row starts from:
/// - `/work/proj`: the project, on the host's file system (device 1), `filesystem.hide`
///   patterns `.env` and `.env.*`;
/// - `/work/proj/.git`: a git directory of the run (`HEAD`, `objects`, `refs/remotes/origin`,
///   `logs`); `/work/bare.git`: one with no `HEAD` yet;
/// - `/work/proj/halfrepo` holds a `HEAD`, `/work/proj/.git/logs/objdir` an `objects`;
/// - `/tmp`: the jail's own tmpfs (device 2); `/mnt/fat`: vfat (device 3); `/mnt/cf`: an ext4
///   directory with the casefold flag; `/proc/1`: procfs.
fn world() -> (Fake, HashSet<(u64, u64)>) {
    let mut f = Fake::new();
    f.caller_sockets.insert(UNIX_SOCK, libc::AF_UNIX);
    let dir = |p: &str| f.add(p.as_bytes(), libc::S_IFDIR, 1, fake::EXT4);
    let file = |p: &str| f.add(p.as_bytes(), libc::S_IFREG, 1, fake::EXT4);
    let mut git_dirs = HashSet::new();
    dir("/work");
    dir("/work/proj");
    dir("/work/proj/sub");
    file("/work/proj/file");
    git_dirs.insert((1, dir("/work/proj/.git")));
    file("/work/proj/.git/HEAD");
    dir("/work/proj/.git/objects");
    dir("/work/proj/.git/refs");
    dir("/work/proj/.git/refs/remotes");
    dir("/work/proj/.git/refs/remotes/origin");
    dir("/work/proj/.git/logs");
    dir("/work/proj/.git/logs/objdir");
    dir("/work/proj/.git/logs/objdir/objects");
    git_dirs.insert((1, dir("/work/bare.git")));
    dir("/work/bare.git/objects");
    dir("/work/bare.git/refs");
    dir("/work/proj/halfrepo");
    file("/work/proj/halfrepo/HEAD");
    f.add(b"/tmp", libc::S_IFDIR, 2, fake::TMPFS);
    dir("/mnt");
    f.add(b"/mnt/fat", libc::S_IFDIR, 3, fake::VFAT);
    dir("/mnt/cf");
    f.nodes.borrow_mut().get_mut(&b"/mnt/cf"[..]).unwrap().flags = Ok(FS_CASEFOLD_FL);
    f.add(b"/proc", libc::S_IFDIR, 4, fake::PROC);
    f.add(b"/proc/1", libc::S_IFDIR, 4, fake::PROC);
    (f, git_dirs)
}

/// The gate over `fake`, with the run's git directories, the jail's own device 2, and the
/// project's hide patterns.
fn gate(fake: Fake, git_dirs: HashSet<(u64, u64)>) -> Gate<Fake> {
    let mut g = Gate::new(&[], [2].into_iter().collect(), b"")
        .unwrap()
        .with_sys(fake);
    g.git_dirs = git_dirs;
    let patterns = [".env", ".env.*", "config/secrets.yml"].map(String::from);
    g.hidden = Some(Hidden::new(&patterns, b"/work/proj").unwrap());
    g
}

/// The syscall a row makes, creating (or, for truncate, writing) the name at a path.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// openat(AT_FDCWD, path, O_CREAT|O_WRONLY, 0644)
    OpenCreat,
    /// openat(AT_FDCWD, path, O_CREAT|O_EXCL|O_WRONLY, 0644)
    OpenExcl,
    /// mkdirat(AT_FDCWD, path, 0755)
    Mkdir,
    /// mknodat(AT_FDCWD, path, S_IFIFO|0644, 0)
    Mknod,
    /// symlinkat("anywhere", AT_FDCWD, path)
    Symlink,
    /// linkat(AT_FDCWD, /work/proj/file, AT_FDCWD, path, 0)
    Link,
    /// renameat2(AT_FDCWD, /work/proj/file, AT_FDCWD, path, 0): the target
    RenameTo,
    /// renameat2(AT_FDCWD, path, AT_FDCWD, /work/proj/file, RENAME_EXCHANGE): the source gets
    /// a new entry too
    ExchangeFrom,
    /// renameat2(AT_FDCWD, path, AT_FDCWD, /work/proj/sub/renamed, 0): a plain rename's source
    RenameFrom,
    /// bind(UNIX_SOCK, {AF_UNIX, path}, len)
    Bind,
    /// truncate(path, 0)
    Truncate,
}

const CREATING: [Kind; 8] = [
    Kind::OpenCreat,
    Kind::Mkdir,
    Kind::Mknod,
    Kind::Symlink,
    Kind::Link,
    Kind::RenameTo,
    Kind::ExchangeFrom,
    Kind::Bind,
];

fn fdcwd() -> u64 {
    libc::AT_FDCWD as u32 as u64
}

/// The stopped call for `kind` on `path`, its strings in the fake caller's memory.
fn call_of(f: &mut Fake, kind: Kind, path: &[u8]) -> Call {
    let p = f.put_str(path);
    let file = f.put_str(b"/work/proj/file");
    let (nr, args): (i64, [u64; 6]) = match kind {
        Kind::OpenCreat | Kind::OpenExcl => {
            let excl = if kind == Kind::OpenExcl {
                libc::O_EXCL
            } else {
                0
            };
            let flags = (libc::O_CREAT | libc::O_WRONLY | excl) as u64;
            (libc::SYS_openat, [fdcwd(), p, flags, 0o644, 0, 0])
        }
        Kind::Mkdir => (libc::SYS_mkdirat, [fdcwd(), p, 0o755, 0, 0, 0]),
        Kind::Mknod => (
            libc::SYS_mknodat,
            [fdcwd(), p, u64::from(libc::S_IFIFO | 0o644), 0, 0, 0],
        ),
        Kind::Symlink => {
            let target = f.put_str(b"anywhere");
            (libc::SYS_symlinkat, [target, fdcwd(), p, 0, 0, 0])
        }
        Kind::Link => (libc::SYS_linkat, [fdcwd(), file, fdcwd(), p, 0, 0]),
        Kind::RenameTo => (libc::SYS_renameat2, [fdcwd(), file, fdcwd(), p, 0, 0]),
        Kind::ExchangeFrom => {
            if f.node(path).is_none() {
                f.add(path, libc::S_IFREG, 1, fake::EXT4);
            }
            let flags = u64::from(libc::RENAME_EXCHANGE);
            (libc::SYS_renameat2, [fdcwd(), p, fdcwd(), file, flags, 0])
        }
        Kind::RenameFrom => {
            let to = f.put_str(b"/work/proj/sub/renamed");
            (libc::SYS_renameat2, [fdcwd(), p, fdcwd(), to, 0, 0])
        }
        Kind::Bind => {
            let family = (libc::AF_UNIX as libc::sa_family_t).to_ne_bytes();
            let addr = [family.as_slice(), path, b"\0"].concat();
            let len = addr.len() as u64;
            let at = f.put(&addr);
            (libc::SYS_bind, [UNIX_SOCK as u64, at, len, 0, 0, 0])
        }
        Kind::Truncate => (libc::SYS_truncate, [p, 0, 0, 0, 0, 0]),
    };
    Call {
        id: 1,
        tid: f.tid,
        nr,
        args,
    }
}

/// What the call made, as the fake records it.
fn made_line(kind: Kind, path: &str) -> String {
    match kind {
        Kind::OpenCreat | Kind::OpenExcl => format!("create {path}"),
        Kind::Mkdir => format!("mkdir {path}"),
        Kind::Mknod => format!("mknod {path}"),
        Kind::Symlink => format!("symlink {path}"),
        Kind::Link => format!("link /work/proj/file -> {path}"),
        Kind::RenameTo => format!("rename /work/proj/file -> {path}"),
        Kind::ExchangeFrom => format!("rename {path} -> /work/proj/file"),
        Kind::RenameFrom => format!("rename {path} -> /work/proj/sub/renamed"),
        Kind::Bind => format!("bind socket:{UNIX_SOCK} {path}"),
        Kind::Truncate => format!("truncate {path} 0"),
    }
}

/// What the caller's call returned.
#[derive(Debug, PartialEq)]
enum Out {
    Value(i64),
    Errno(i32),
    Fd,
    Continue,
    Answered,
}

fn out(v: Verdict) -> Out {
    match v {
        Verdict::Value(v) => Out::Value(v),
        Verdict::Errno(e) => Out::Errno(e),
        Verdict::Fd(..) => Out::Fd,
        Verdict::Continue => Out::Continue,
        Verdict::Answered => Out::Answered,
    }
}

/// Run `call` through the gate: its answer, and the calls the fake recorded.
fn run(g: &Gate<Fake>, call: &Call) -> (Out, Vec<String>) {
    let listener: OwnedFd = g.sys.handle(b"listener");
    let v = out(handle(g, &listener, call));
    (v, g.sys.done.borrow().clone())
}

/// What a row expects.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// The name is made (the call performed, 0 or a descriptor returned).
    Made,
    /// Refused with this errno by a rule of the gate, and reported on stderr once.
    Refused(i32),
    /// This errno, nothing performed (the caller's own error, as the kernel would give it).
    Fails(i32),
}

struct Row {
    rule: String,
    kind: Kind,
    path: &'static str,
    setup: fn(&mut Fake),
    want: Want,
}

fn row(rule: &str, kind: Kind, path: &'static str, setup: fn(&mut Fake), want: Want) -> Row {
    Row {
        rule: rule.to_string(),
        kind,
        path,
        setup,
        want,
    }
}

fn nothing(_: &mut Fake) {}

/// Is `line` a call that makes or changes something (not a lock, not the umask)?
fn performs(line: &str) -> bool {
    !(line.starts_with("lock ") || line == "umask")
}

fn check_row(i: usize, r: &Row) {
    let (mut f, git_dirs) = world();
    (r.setup)(&mut f);
    let call = call_of(&mut f, r.kind, r.path.as_bytes());
    let g = gate(f, git_dirs);
    let (got, done) = run(&g, &call);
    let what = format!("row {i} ({}): {:?} {}", r.rule, r.kind, r.path);
    match r.want {
        Want::Made => {
            assert!(
                matches!(got, Out::Value(0) | Out::Fd),
                "{what}: answered {got:?}, done {done:?}"
            );
            let line = made_line(r.kind, r.path);
            assert!(done.contains(&line), "{what}: {line:?} not in {done:?}");
        }
        Want::Refused(e) | Want::Fails(e) => {
            assert_eq!(got, Out::Errno(e), "{what}: done {done:?}");
            assert!(
                !done.iter().any(|l| performs(l)),
                "{what}: refused, yet performed {done:?}"
            );
        }
    }
    if let Want::Refused(_) = r.want {
        // The refusal is said on stderr, once per path.
        let seen = g.reports.state.lock().unwrap();
        assert!(
            seen.seen.contains(r.path.as_bytes()),
            "{what}: no report of {}",
            r.path
        );
    }
}

/// The name rules, each for every syscall that makes a name: open with O_CREAT, mkdir, mknod,
/// symlink, link, rename's target, an exchanging rename's source, bind of a Unix socket.
fn name_rows() -> Vec<Row> {
    use Want::*;
    let cases: [(&str, &'static str, Want); 17] = [
        (
            "`.git` is refused where the host sees it",
            "/work/proj/sub/.git",
            Refused(libc::EPERM),
        ),
        (
            "`commondir` is refused where the host sees it",
            "/work/proj/sub/commondir",
            Refused(libc::EPERM),
        ),
        (
            "`commondir` is refused in a git directory of the run too",
            "/work/proj/.git/commondir",
            Refused(libc::EPERM),
        ),
        (
            "`HEAD` is refused outside the run's git directories",
            "/work/proj/sub/HEAD",
            Refused(libc::EPERM),
        ),
        (
            "`HEAD` is refused beside `objects`, even below a git directory of the run",
            "/work/proj/.git/logs/objdir/HEAD",
            Refused(libc::EPERM),
        ),
        (
            "`objects` is refused beside a `HEAD`",
            "/work/proj/halfrepo/objects",
            Refused(libc::EPERM),
        ),
        (
            "`HEAD` below a git directory of the run, beside no `objects`, is git's own",
            "/work/proj/.git/refs/remotes/origin/HEAD",
            Made,
        ),
        (
            "`HEAD` in a git directory of the run is git's own",
            "/work/bare.git/HEAD",
            Made,
        ),
        (
            "`objects` beside no `HEAD` is any name",
            "/work/proj/sub/objects",
            Made,
        ),
        (
            "git's names are made on the jail's own file systems",
            "/tmp/.git",
            Made,
        ),
        (
            "a variant spelling is another name where names do not fold",
            "/work/proj/.GIT",
            Made,
        ),
        (
            "a variant spelling is `.git` on a file system that folds names",
            "/mnt/fat/.GIT",
            Refused(libc::EPERM),
        ),
        (
            "a trailing dot is `.git` in a casefold directory",
            "/mnt/cf/.git.",
            Refused(libc::EPERM),
        ),
        (
            "a non-ASCII name is refused where names fold (it may stand for a git name)",
            "/mnt/fat/objects\u{17f}",
            Refused(libc::EPERM),
        ),
        (
            "a non-ASCII name is any name where names do not fold",
            "/work/proj/objects\u{17f}",
            Made,
        ),
        (
            "a name `filesystem.hide` matches is refused in the project",
            "/work/proj/.env.local",
            Refused(libc::EACCES),
        ),
        (
            "hide patterns are not the concern of the jail's own file systems",
            "/tmp/.env.local",
            Made,
        ),
    ];
    let mut rows = Vec::new();
    for (rule, path, want) in cases {
        for kind in CREATING {
            rows.push(row(rule, kind, path, nothing, want));
        }
    }
    rows
}

/// Fail closed: a lookup that errs otherwise than with ENOENT counts as finding the name.
fn lookup_error_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for (i, e) in NOT_ENOENT.into_iter().enumerate() {
        // The setup functions cannot capture: one per errno, by index.
        const OBJECTS: [fn(&mut Fake); 7] = [
            |f| objects_fails(f, 0),
            |f| objects_fails(f, 1),
            |f| objects_fails(f, 2),
            |f| objects_fails(f, 3),
            |f| objects_fails(f, 4),
            |f| objects_fails(f, 5),
            |f| objects_fails(f, 6),
        ];
        const HEAD: [fn(&mut Fake); 7] = [
            |f| head_fails(f, 0),
            |f| head_fails(f, 1),
            |f| head_fails(f, 2),
            |f| head_fails(f, 3),
            |f| head_fails(f, 4),
            |f| head_fails(f, 5),
            |f| head_fails(f, 6),
        ];
        const NAME: [fn(&mut Fake); 7] = [
            |f| name_fails(f, 0),
            |f| name_fails(f, 1),
            |f| name_fails(f, 2),
            |f| name_fails(f, 3),
            |f| name_fails(f, 4),
            |f| name_fails(f, 5),
            |f| name_fails(f, 6),
        ];
        let kind = if i % 2 == 0 {
            Kind::Mkdir
        } else {
            Kind::OpenCreat
        };
        rows.push(row(
            &format!("`objects` whose lookup fails with errno {e} counts as there: no `HEAD`"),
            kind,
            "/work/proj/.git/logs/e/HEAD",
            OBJECTS[i],
            Want::Refused(libc::EPERM),
        ));
        rows.push(row(
            &format!("`HEAD` whose lookup fails with errno {e} counts as there: no `objects`"),
            kind,
            "/work/proj/sub/objects",
            HEAD[i],
            Want::Refused(libc::EPERM),
        ));
        rows.push(row(
            &format!(
                "an O_CREAT open whose own name's lookup fails with errno {e} gets that error \
                 (never taken for absent)"
            ),
            Kind::OpenCreat,
            "/work/proj/sub/x",
            NAME[i],
            Want::Fails(e),
        ));
    }
    rows
}

fn objects_fails(f: &mut Fake, i: usize) {
    f.add(b"/work/proj/.git/logs/e", libc::S_IFDIR, 1, fake::EXT4);
    f.lookup_fails
        .insert(b"/work/proj/.git/logs/e/objects".to_vec(), NOT_ENOENT[i]);
}

fn head_fails(f: &mut Fake, i: usize) {
    f.lookup_fails
        .insert(b"/work/proj/sub/HEAD".to_vec(), NOT_ENOENT[i]);
}

fn name_fails(f: &mut Fake, i: usize) {
    f.lookup_fails
        .insert(b"/work/proj/sub/x".to_vec(), NOT_ENOENT[i]);
}

/// Where the gate cannot tell (a directory's flags, its stat, the way up), it refuses; the
/// caller's path resolved as the kernel would (its cwd, its descriptors, /proc refused).
fn fail_closed_and_resolution_rows() -> Vec<Row> {
    use Want::*;
    vec![
        row(
            "a directory whose inode flags cannot be read (EACCES) counts as folding names",
            Kind::Mkdir,
            "/mnt/noflags/.GIT",
            |f| {
                f.add(b"/mnt/noflags", libc::S_IFDIR, 1, fake::EXT4);
                f.nodes
                    .borrow_mut()
                    .get_mut(&b"/mnt/noflags"[..])
                    .unwrap()
                    .flags = Err(libc::EACCES);
            },
            Refused(libc::EPERM),
        ),
        row(
            "a file system without inode flags (ENOTTY) folds nothing",
            Kind::Mkdir,
            "/mnt/noflags/.GIT",
            |f| {
                f.add(b"/mnt/noflags", libc::S_IFDIR, 1, fake::EXT4);
                f.nodes
                    .borrow_mut()
                    .get_mut(&b"/mnt/noflags"[..])
                    .unwrap()
                    .flags = Err(libc::ENOTTY);
            },
            Made,
        ),
        row(
            "a directory whose file system cannot be told is refused",
            Kind::Mkdir,
            "/mnt/unknown/x",
            |f| {
                f.add(b"/mnt/unknown", libc::S_IFDIR, 1, fake::EXT4);
                f.statfs_fails.insert(b"/mnt/unknown".to_vec(), libc::EIO);
            },
            Fails(libc::EIO),
        ),
        row(
            "a directory that cannot be stat'ed refuses git's names (it is not taken for the \
             jail's own)",
            Kind::Mkdir,
            "/mnt/nostat/.git",
            |f| {
                f.add(b"/mnt/nostat", libc::S_IFDIR, 1, fake::EXT4);
                f.fstat_fails.insert(b"/mnt/nostat".to_vec(), libc::EIO);
            },
            Refused(libc::EPERM),
        ),
        row(
            "`HEAD` is refused when the way up to a git directory cannot be walked",
            Kind::Mkdir,
            "/work/proj/.git/refs/x/HEAD",
            |f| {
                f.add(b"/work/proj/.git/refs/x", libc::S_IFDIR, 1, fake::EXT4);
                f.fstat_fails
                    .insert(b"/work/proj/.git/refs".to_vec(), libc::EACCES);
            },
            Refused(libc::EPERM),
        ),
        row(
            "a hidden name in a directory that cannot be named is refused (it may be in the \
             project)",
            Kind::OpenCreat,
            "/work/proj/sub/.env",
            |f| {
                f.unnamed.insert(b"/work/proj/sub".to_vec());
            },
            Fails(libc::EACCES),
        ),
        row(
            "in a directory that cannot be named, an anchored pattern's last component is \
             refused (it may be that directory)",
            Kind::OpenCreat,
            "/work/proj/sub/secrets.yml",
            |f| {
                f.unnamed.insert(b"/work/proj/sub".to_vec());
            },
            Fails(libc::EACCES),
        ),
        row(
            "an anchored pattern matches only where it is anchored",
            Kind::OpenCreat,
            "/work/proj/sub/secrets.yml",
            nothing,
            Made,
        ),
        row(
            "an anchored pattern refuses its name where it is anchored",
            Kind::Mkdir,
            "/work/proj/config/secrets.yml",
            |f| {
                f.add(b"/work/proj/config", libc::S_IFDIR, 1, fake::EXT4);
            },
            Refused(libc::EACCES),
        ),
        row(
            "a directory on /proc is refused (another process's files)",
            Kind::Mkdir,
            "/proc/1/x",
            nothing,
            Fails(libc::EACCES),
        ),
        row(
            "a path through a directory that cannot be searched is the caller's error",
            Kind::Mkdir,
            "/work/proj/sub/locked/.git",
            |f| {
                f.add(b"/work/proj/sub/locked", libc::S_IFDIR, 1, fake::EXT4);
                f.lookup_fails
                    .insert(b"/work/proj/sub/locked".to_vec(), libc::EACCES);
            },
            Fails(libc::EACCES),
        ),
        row(
            "a relative path is resolved from the caller's cwd",
            Kind::Mkdir,
            "sub/.git",
            |f| f.cwd = b"/work/proj".to_vec(),
            Fails(libc::EPERM),
        ),
        row(
            "an O_CREAT open follows a final symlink and checks the name it leads to",
            Kind::OpenCreat,
            "/work/proj/sub/link",
            |f| {
                f.add(b"/work/proj/sub/link", libc::S_IFLNK, 1, fake::EXT4);
                f.nodes
                    .borrow_mut()
                    .get_mut(&b"/work/proj/sub/link"[..])
                    .unwrap()
                    .target = b".git".to_vec();
            },
            Fails(libc::EPERM),
        ),
        row(
            "an O_CREAT open follows a final symlink to an absolute path",
            Kind::OpenCreat,
            "/work/proj/sub/link",
            |f| {
                f.add(b"/work/proj/sub/link", libc::S_IFLNK, 1, fake::EXT4);
                f.nodes
                    .borrow_mut()
                    .get_mut(&b"/work/proj/sub/link"[..])
                    .unwrap()
                    .target = b"/work/proj/halfrepo/objects".to_vec();
            },
            Fails(libc::EPERM),
        ),
        row(
            "O_CREAT|O_EXCL follows no symlink: the link is there",
            Kind::OpenExcl,
            "/work/proj/sub/link",
            |f| {
                f.add(b"/work/proj/sub/link", libc::S_IFLNK, 1, fake::EXT4);
            },
            Fails(libc::EEXIST),
        ),
        row(
            "a plain rename's source makes no name: `.git` may be renamed away",
            Kind::RenameFrom,
            "/work/proj/sub/.git",
            |f| {
                f.add(b"/work/proj/sub/.git", libc::S_IFDIR, 1, fake::EXT4);
            },
            Made,
        ),
        row(
            "truncate makes no name: a missing file is ENOENT",
            Kind::Truncate,
            "/work/proj/sub/none",
            nothing,
            Fails(libc::ENOENT),
        ),
        row(
            "truncate of a directory is EISDIR",
            Kind::Truncate,
            "/work/proj/sub",
            nothing,
            Fails(libc::EISDIR),
        ),
        row(
            "truncate of a file is performed on the descriptor the gate opened",
            Kind::Truncate,
            "/work/proj/file",
            nothing,
            Made,
        ),
        row(
            "truncate of a name whose lookup fails is that error, not ENOENT",
            Kind::Truncate,
            "/work/proj/sub/x",
            |f| {
                f.lookup_fails
                    .insert(b"/work/proj/sub/x".to_vec(), libc::EACCES);
            },
            Fails(libc::EACCES),
        ),
    ]
}

#[test]
fn every_name_rule_for_every_creating_syscall() {
    let rows = name_rows();
    assert!(rows.len() >= 100, "{} rows", rows.len());
    for (i, r) in rows.iter().enumerate() {
        check_row(i, r);
    }
}

#[test]
fn a_lookup_error_other_than_enoent_never_lets_a_name_through() {
    for (i, r) in lookup_error_rows().iter().enumerate() {
        check_row(i, r);
    }
}

/// mkdir of a name that is there is EEXIST, as the kernel's own lookup says before any other
/// check: nothing is checked, locked, reported or made, whatever the name (a git name, a
/// hidden one, a file). A name that is absent, or whose lookup fails, goes through every rule.
#[test]
fn mkdir_of_a_name_that_is_there_is_eexist_at_once() {
    for path in [
        "/work/proj/sub",
        "/work/proj/.git",
        "/work/proj/halfrepo/HEAD",
        "/work/proj/.git/objects",
        "/work/proj/file",
        "/work/proj/file/",
        "/tmp",
    ] {
        let (mut f, git_dirs) = world();
        let call = call_of(&mut f, Kind::Mkdir, path.as_bytes());
        let g = gate(f, git_dirs);
        let (got, done) = run(&g, &call);
        assert_eq!(got, Out::Errno(libc::EEXIST), "{path}: done {done:?}");
        assert!(done.is_empty(), "{path}: looked up, yet did {done:?}");
        assert!(g.reports.state.lock().unwrap().seen.is_empty(), "{path}");
    }
    // Control: the same names absent are made or refused by their rules.
    check_row(
        0,
        &row(
            "absent",
            Kind::Mkdir,
            "/work/proj/sub/new",
            nothing,
            Want::Made,
        ),
    );
    check_row(
        1,
        &row(
            "absent .git",
            Kind::Mkdir,
            "/work/proj/sub/.git",
            nothing,
            Want::Refused(libc::EPERM),
        ),
    );
    // A lookup that fails with anything but ENOENT is not "there": the rules decide.
    check_row(
        2,
        &row(
            "unreadable .git",
            Kind::Mkdir,
            "/work/proj/sub/.git",
            |f| {
                f.lookup_fails
                    .insert(b"/work/proj/sub/.git".to_vec(), libc::EACCES);
            },
            Want::Refused(libc::EPERM),
        ),
    );
}

#[test]
fn what_cannot_be_told_is_refused_and_paths_resolve_as_the_kernels() {
    for (i, r) in fail_closed_and_resolution_rows().iter().enumerate() {
        check_row(i, r);
    }
}

/// The second of a pair (`HEAD`, `objects`) sees the first, in either order, under the
/// directory's lock.
#[test]
fn the_second_of_head_and_objects_sees_the_first() {
    // (first, second, what the second gets)
    let rows: [(&str, &str, Want); 2] = [
        (
            "/work/proj/.git/logs/new/objects",
            "/work/proj/.git/logs/new/HEAD",
            Want::Refused(libc::EPERM),
        ),
        (
            "/work/proj/.git/logs/new/HEAD",
            "/work/proj/.git/logs/new/objects",
            Want::Refused(libc::EPERM),
        ),
    ];
    for (first, second, want) in rows {
        let (mut f, git_dirs) = world();
        f.add(b"/work/proj/.git/logs/new", libc::S_IFDIR, 1, fake::EXT4);
        let one = call_of(&mut f, Kind::Mkdir, first.as_bytes());
        let two = call_of(&mut f, Kind::OpenCreat, second.as_bytes());
        let g = gate(f, git_dirs);
        let (got, done) = run(&g, &one);
        assert_eq!(got, Out::Value(0), "{first}: {done:?}");
        let (got, done) = run(&g, &two);
        let Want::Refused(e) = want else {
            unreachable!()
        };
        assert_eq!(got, Out::Errno(e), "{second} after {first}: {done:?}");
        // Each was checked under the directory's lock.
        let locks = done
            .iter()
            .filter(|l| *l == "lock /work/proj/.git/logs/new")
            .count();
        assert_eq!(locks, 2, "{done:?}");
    }
}

/// The caller's memory and descriptors: what cannot be read, or changes hands after the read,
/// makes nothing.
#[test]
fn the_callers_memory_and_descriptors_fail_closed() {
    type Setup = fn(&mut Fake) -> Call;
    let rows: Vec<(&str, Setup, Out, Option<&str>)> = vec![
        (
            "a caller gone after its path was read gets nothing made",
            |f| {
                f.waiting.set(false);
                call_of(f, Kind::Mkdir, b"/work/proj/sub/new")
            },
            Out::Errno(libc::ENOENT),
            None,
        ),
        (
            "a path the caller's memory does not hold is EFAULT",
            |f| {
                let mut c = call_of(f, Kind::Mkdir, b"/work/proj/sub/new");
                c.args[1] = 0xdead_0000;
                c
            },
            Out::Errno(libc::EFAULT),
            None,
        ),
        (
            "a NULL path is EFAULT",
            |f| {
                let mut c = call_of(f, Kind::Mkdir, b"/work/proj/sub/new");
                c.args[1] = 0;
                c
            },
            Out::Errno(libc::EFAULT),
            None,
        ),
        (
            "a path without its NUL before unmapped memory is EFAULT",
            |f| {
                let at = f.put(b"/work/proj/sub/new");
                Call {
                    id: 1,
                    tid: f.tid,
                    nr: libc::SYS_mkdirat,
                    args: [fdcwd(), at, 0o755, 0, 0, 0],
                }
            },
            Out::Errno(libc::EFAULT),
            None,
        ),
        (
            "an empty path is ENOENT",
            |f| call_of(f, Kind::Mkdir, b""),
            Out::Errno(libc::ENOENT),
            None,
        ),
        (
            "a relative path from a directory descriptor of the caller is checked there",
            |f| {
                f.caller_dirs.insert(SUB_FD, b"/work/proj/sub".to_vec());
                let mut c = call_of(f, Kind::Mkdir, b".git");
                c.args[0] = SUB_FD as u64;
                c
            },
            Out::Errno(libc::EPERM),
            None,
        ),
        (
            "a directory descriptor the caller does not hold is EBADF",
            |f| {
                let mut c = call_of(f, Kind::Mkdir, b"x");
                c.args[0] = 9;
                c
            },
            Out::Errno(libc::EBADF),
            None,
        ),
        (
            "the caller's own /proc/self/cwd names its cwd, checked there",
            |f| {
                f.cwd = b"/work/proj/sub".to_vec();
                call_of(f, Kind::Mkdir, b"/proc/self/cwd/.git")
            },
            Out::Errno(libc::EPERM),
            None,
        ),
        (
            "a Unix socket's path is bound through the checked directory",
            |f| call_of(f, Kind::Bind, b"/work/proj/sub/sock"),
            Out::Value(0),
            Some("bind socket:7 /work/proj/sub/sock"),
        ),
        (
            "an abstract Unix address names nothing and is bound as given",
            |f| {
                let mut c = call_of(f, Kind::Bind, b"");
                let family = (libc::AF_UNIX as libc::sa_family_t).to_ne_bytes();
                let addr = [family.as_slice(), b"\0.git"].concat();
                c.args[2] = addr.len() as u64;
                c.args[1] = f.put(&addr);
                c
            },
            Out::Value(0),
            Some("bind socket:7 "),
        ),
        (
            "an INET socket is bound as given, whatever its address's bytes",
            |f| {
                f.caller_sockets.insert(INET_SOCK, libc::AF_INET);
                let mut c = call_of(f, Kind::Bind, b"/work/proj/sub/.git");
                c.args[0] = INET_SOCK as u64;
                c
            },
            Out::Value(0),
            Some("bind socket:8 /work/proj/sub/.git"),
        ),
        (
            "a socket the caller does not hold is EBADF",
            |f| {
                let mut c = call_of(f, Kind::Bind, b"/work/proj/sub/sock");
                c.args[0] = 11;
                c
            },
            Out::Errno(libc::EBADF),
            None,
        ),
        (
            "a bind length past a sockaddr_storage is EINVAL",
            |f| {
                let mut c = call_of(f, Kind::Bind, b"/work/proj/sub/sock");
                c.args[2] = 129;
                c
            },
            Out::Errno(libc::EINVAL),
            None,
        ),
    ];
    for (i, (rule, setup, want, line)) in rows.into_iter().enumerate() {
        let (mut f, git_dirs) = world();
        let call = setup(&mut f);
        let g = gate(f, git_dirs);
        let (got, done) = run(&g, &call);
        assert_eq!(got, want, "row {i} ({rule}): done {done:?}");
        match line {
            Some(line) => assert!(
                done.iter().any(|l| l == line),
                "row {i} ({rule}): {line:?} not in {done:?}"
            ),
            None => assert!(
                !done.iter().any(|l| performs(l)),
                "row {i} ({rule}): performed {done:?}"
            ),
        }
    }
}

/// No stopped call is let continue but umask(2): each of the others is answered by the gate
/// on what it read, whatever its path.
#[test]
fn no_call_continues_but_umask() {
    let mut rows: Vec<(&str, i64, bool)> = vec![
        ("umask takes no path: let continue", libc::SYS_umask, true),
        ("openat is performed", libc::SYS_openat, false),
        ("mkdirat is performed", libc::SYS_mkdirat, false),
        ("mknodat is performed", libc::SYS_mknodat, false),
        ("symlinkat is performed", libc::SYS_symlinkat, false),
        ("linkat is performed", libc::SYS_linkat, false),
        ("renameat2 is performed", libc::SYS_renameat2, false),
        ("bind is performed", libc::SYS_bind, false),
        ("truncate is performed", libc::SYS_truncate, false),
        ("unlinkat is performed", libc::SYS_unlinkat, false),
        ("fchmodat is performed", libc::SYS_fchmodat, false),
        ("fchmodat2 is performed", SYS_FCHMODAT2, false),
        ("fchmod is performed", libc::SYS_fchmod, false),
        (
            "a call the gate does not know is ENOSYS",
            libc::SYS_getpid,
            false,
        ),
    ];
    #[cfg(target_arch = "x86_64")]
    rows.extend([
        ("open is performed", libc::SYS_open, false),
        ("creat is performed", libc::SYS_creat, false),
        ("mkdir is performed", libc::SYS_mkdir, false),
        ("mknod is performed", libc::SYS_mknod, false),
        ("symlink is performed", libc::SYS_symlink, false),
        ("link is performed", libc::SYS_link, false),
        ("rename is performed", libc::SYS_rename, false),
        ("renameat is performed", libc::SYS_renameat, false),
        ("unlink is performed", libc::SYS_unlink, false),
        ("rmdir is performed", libc::SYS_rmdir, false),
        ("chmod is performed", libc::SYS_chmod, false),
    ]);
    for (rule, nr, continues) in rows {
        let (mut f, git_dirs) = world();
        let p = f.put_str(b"/work/proj/sub/.git");
        let call = Call {
            id: 1,
            tid: f.tid,
            nr,
            // Every argument a pointer to `.git`, or the caller's cwd: whatever the call reads.
            args: [fdcwd(), p, fdcwd(), p, 0, 0],
        };
        let g = gate(f, git_dirs);
        let (got, _) = run(&g, &call);
        assert_eq!(got == Out::Continue, continues, "{rule}: {got:?}");
    }
}

/// A protected file or directory refuses each use with the errno its read-only bind gave.
#[test]
fn a_protected_name_refuses_each_use_with_the_binds_errno() {
    // (use, a directory, something at the name now, errno)
    let rows = [
        (Use::Write, false, true, libc::EROFS),
        (Use::Write, true, true, libc::EISDIR),
        (Use::Below, true, true, libc::EROFS),
        (Use::Create, false, true, libc::EEXIST),
        (Use::Create, false, false, libc::EROFS),
        (Use::Bind, false, true, libc::EADDRINUSE),
        (Use::Bind, false, false, libc::EROFS),
        (Use::Rename, false, true, libc::EBUSY),
        (Use::Rename, true, true, libc::EBUSY),
        (Use::Link, false, true, libc::EXDEV),
    ];
    for (what, is_dir, exists, want) in rows {
        assert_eq!(
            refusal_errno(what, is_dir, exists),
            want,
            "{what:?} dir={is_dir} exists={exists}"
        );
    }
}

/// The removals and mode changes the gate performs while the run keeps a change record
/// (the filter stops them only then): each resolved as the kernel would, the last component
/// of a removal never followed, a mode changed on the inode the name leads to, and every
/// error the kernel would give given without anything performed.
#[test]
fn removals_and_mode_changes_are_performed_through_the_seam_as_the_kernel_would() {
    enum Then {
        Done(&'static str),
        Fails(i32),
    }
    use Then::*;
    let empty = libc::AT_EMPTY_PATH as u64;
    let nofollow = libc::AT_SYMLINK_NOFOLLOW as u64;
    // (rule, nr, args but the path: [dirfd, flags-or-mode...], path (None: NULL), want)
    type Row = (&'static str, i64, [u64; 4], Option<&'static [u8]>, Then);
    let rows: Vec<Row> = vec![
        (
            "unlinkat removes a file",
            libc::SYS_unlinkat,
            [fdcwd(), 0, 0, 0],
            Some(b"/work/proj/file"),
            Done("unlink /work/proj/file"),
        ),
        (
            "unlinkat AT_REMOVEDIR removes an empty directory",
            libc::SYS_unlinkat,
            [fdcwd(), libc::AT_REMOVEDIR as u64, 0, 0],
            Some(b"/work/proj/sub"),
            Done("unlink /work/proj/sub"),
        ),
        (
            "unlinkat of a name relative to the caller's directory descriptor",
            libc::SYS_unlinkat,
            [SUB_FD as u64, 0, 0, 0],
            Some(b"inner"),
            Done("unlink /work/proj/sub/inner"),
        ),
        (
            "unlinkat of a symlink removes the link, never what it names",
            libc::SYS_unlinkat,
            [fdcwd(), 0, 0, 0],
            Some(b"/work/proj/link"),
            Done("unlink /work/proj/link"),
        ),
        (
            "unlinkat of a directory without AT_REMOVEDIR: EISDIR",
            libc::SYS_unlinkat,
            [fdcwd(), 0, 0, 0],
            Some(b"/work/proj/sub"),
            Fails(libc::EISDIR),
        ),
        (
            "rmdir of a directory that holds something: ENOTEMPTY",
            libc::SYS_unlinkat,
            [fdcwd(), libc::AT_REMOVEDIR as u64, 0, 0],
            Some(b"/work/proj/.git"),
            Fails(libc::ENOTEMPTY),
        ),
        (
            "unlinkat with a flag it does not know: EINVAL",
            libc::SYS_unlinkat,
            [fdcwd(), 0x8000, 0, 0],
            Some(b"/work/proj/file"),
            Fails(libc::EINVAL),
        ),
        (
            "unlinkat of what is not there: ENOENT",
            libc::SYS_unlinkat,
            [fdcwd(), 0, 0, 0],
            Some(b"/work/proj/absent"),
            Fails(libc::ENOENT),
        ),
        (
            "fchmodat changes the file's mode",
            libc::SYS_fchmodat,
            [fdcwd(), 0o600, 0, 0],
            Some(b"/work/proj/file"),
            Done("chmod /work/proj/file 600"),
        ),
        (
            "fchmodat follows a final symlink: the file it names changes",
            libc::SYS_fchmodat,
            [fdcwd(), 0o600, 0, 0],
            Some(b"/work/proj/link"),
            Done("chmod /work/proj/file 600"),
        ),
        (
            "fchmodat2 AT_SYMLINK_NOFOLLOW on a symlink: EOPNOTSUPP, as the kernel",
            SYS_FCHMODAT2,
            [fdcwd(), 0o600, nofollow, 0],
            Some(b"/work/proj/link"),
            Fails(libc::EOPNOTSUPP),
        ),
        (
            "fchmodat2 AT_EMPTY_PATH with a NULL path: the descriptor's directory",
            SYS_FCHMODAT2,
            [SUB_FD as u64, 0o700, empty, 0],
            None,
            Done("chmod /work/proj/sub 700"),
        ),
        (
            "fchmodat2 AT_EMPTY_PATH of a descriptor the caller does not have: EBADF",
            SYS_FCHMODAT2,
            [9, 0o700, empty, 0],
            None,
            Fails(libc::EBADF),
        ),
        (
            "fchmodat2 with a flag it does not know: EINVAL",
            SYS_FCHMODAT2,
            [fdcwd(), 0o600, 0x8000, 0],
            Some(b"/work/proj/file"),
            Fails(libc::EINVAL),
        ),
        (
            "fchmodat of what is not there: ENOENT",
            libc::SYS_fchmodat,
            [fdcwd(), 0o600, 0, 0],
            Some(b"/work/proj/absent"),
            Fails(libc::ENOENT),
        ),
        (
            "fchmod changes the mode of the file the caller's descriptor is open on",
            libc::SYS_fchmod,
            [FILE_FD as u64, 0o755, 0, 0],
            None,
            Done("fchmod /work/proj/file 755"),
        ),
        (
            "fchmod of a directory descriptor",
            libc::SYS_fchmod,
            [SUB_FD as u64, 0o700, 0, 0],
            None,
            Done("fchmod /work/proj/sub 700"),
        ),
        (
            "fchmod of a descriptor outside the project: changed as the kernel would",
            libc::SYS_fchmod,
            [OUTSIDE_FD as u64, 0o600, 0, 0],
            None,
            Done("fchmod /tmp/out 600"),
        ),
        (
            "fchmod of a pipe: changed as the kernel would",
            libc::SYS_fchmod,
            [PIPE_FD as u64, 0o600, 0, 0],
            None,
            Done("fchmod pipe:[77] 600"),
        ),
        (
            "fchmod of an O_PATH descriptor: EBADF, as the kernel",
            libc::SYS_fchmod,
            [PATH_FD as u64, 0o755, 0, 0],
            None,
            Fails(libc::EBADF),
        ),
        (
            "fchmod of a descriptor the caller does not have: EBADF",
            libc::SYS_fchmod,
            [9, 0o755, 0, 0],
            None,
            Fails(libc::EBADF),
        ),
        (
            "fchmod of a negative descriptor: EBADF",
            libc::SYS_fchmod,
            [u64::MAX, 0o755, 0, 0],
            None,
            Fails(libc::EBADF),
        ),
    ];
    const FILE_FD: i32 = 11;
    const PATH_FD: i32 = 12;
    const OUTSIDE_FD: i32 = 13;
    const PIPE_FD: i32 = 14;
    for (i, (rule, nr, a, path, want)) in rows.into_iter().enumerate() {
        let (mut f, git_dirs) = world();
        f.add(b"/work/proj/sub/inner", libc::S_IFREG, 1, fake::EXT4);
        f.add(b"/work/proj/link", libc::S_IFLNK, 1, fake::EXT4);
        f.nodes
            .borrow_mut()
            .get_mut(&b"/work/proj/link"[..])
            .unwrap()
            .target = b"file".to_vec();
        f.caller_dirs.insert(SUB_FD, b"/work/proj/sub".to_vec());
        f.add(b"/tmp/out", libc::S_IFREG, 2, fake::TMPFS);
        let files = [
            (FILE_FD, &b"/work/proj/file"[..], libc::O_RDONLY),
            (
                SUB_FD,
                b"/work/proj/sub",
                libc::O_RDONLY | libc::O_DIRECTORY,
            ),
            (PATH_FD, b"/work/proj/file", libc::O_PATH),
            (OUTSIDE_FD, b"/tmp/out", libc::O_RDWR),
            (PIPE_FD, b"pipe:[77]", libc::O_WRONLY),
        ];
        for (fd, on, flags) in files {
            f.caller_files.insert(fd, (on.to_vec(), flags));
        }
        let p = path.map_or(0, |p| f.put_str(p));
        let args = match nr {
            // unlinkat(dirfd, path, flags)
            libc::SYS_unlinkat => [a[0], p, a[1], 0, 0, 0],
            // fchmod(fd, mode)
            libc::SYS_fchmod => [a[0], a[1], 0, 0, 0, 0],
            // fchmodat(dirfd, path, mode) / fchmodat2(dirfd, path, mode, flags)
            _ => [a[0], p, a[1], a[2], 0, 0],
        };
        let call = Call {
            id: 1,
            tid: f.tid,
            nr,
            args,
        };
        if rule.contains("removes an empty directory") {
            f.nodes.borrow_mut().remove(&b"/work/proj/sub/inner"[..]);
        }
        let g = gate(f, git_dirs);
        let (got, done) = run(&g, &call);
        let what = format!("row {i} ({rule})");
        match want {
            Done(line) => {
                assert_eq!(got, Out::Value(0), "{what}: done {done:?}");
                assert!(
                    done.iter().any(|l| l == line),
                    "{what}: {line:?} not in {done:?}"
                );
                if line.starts_with("unlink ") {
                    let path = line.trim_start_matches("unlink ").as_bytes();
                    assert!(g.sys.node(path).is_none(), "{what}: still there");
                }
            }
            Fails(e) => {
                assert_eq!(got, Out::Errno(e), "{what}: done {done:?}");
                assert!(
                    !done.iter().any(|l| performs(l)),
                    "{what}: failed, yet performed {done:?}"
                );
            }
        }
    }
}
