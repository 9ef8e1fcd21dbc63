//! Shared harness of the jail tests: a temporary world (home with a fake SSH key, the project,
//! a sibling project, a directory outside), and a helper that runs corral in it.
//!
//! These binaries also run as an unprivileged user (scripts/test-rootless) with `CORRAL_BIN`
//! pointing at a copy of corral, so nothing here assumes root.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

pub const SSH_SECRET: &str = "SSH-SECRET-d41d8cd98f00";
pub const OUTSIDE_SECRET: &str = "OUTSIDE-SECRET-5f4dcc3b5aa7";
pub const SIBLING_SECRET: &str = "SIBLING-SECRET-9e107d9d372b";
pub const ENV_SECRET: &str = "ENV-SECRET-e4d909c290d0";

pub fn corral_bin() -> PathBuf {
    std::env::var_os("CORRAL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_corral")))
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The temporary world of one test. Removed on drop.
pub struct World {
    pub root: PathBuf,
    pub home: PathBuf,
    pub project: PathBuf,
    pub sibling: PathBuf,
    pub outside: PathBuf,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

impl World {
    pub fn new() -> World {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let root =
            std::env::temp_dir().join(format!("corral-jail-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let home = root.join("home");
        let project = root.join("work/project");
        let sibling = root.join("work/sibling");
        let outside = root.join("outside");
        for d in [&home, &project, &sibling, &outside] {
            std::fs::create_dir_all(d).unwrap();
        }
        let w = World {
            root: std::fs::canonicalize(&root).unwrap(),
            home: std::fs::canonicalize(&home).unwrap(),
            project: std::fs::canonicalize(&project).unwrap(),
            sibling: std::fs::canonicalize(&sibling).unwrap(),
            outside: std::fs::canonicalize(&outside).unwrap(),
        };
        write(&w.home.join(".ssh/id_ed25519"), SSH_SECRET);
        write(&w.outside.join("secret.txt"), OUTSIDE_SECRET);
        write(&w.sibling.join("secret.txt"), SIBLING_SECRET);
        // The user layer of the policy: what every test project hides and protects. Limits are
        // best-effort so the rootless pass (no delegated cgroup) can run; the limit tests set
        // their own.
        write(
            &w.home.join(".config/corral/config.toml"),
            "[filesystem]\n\
             hide = [\".env\", \".env.*\"]\n\
             protect = [\".git/hooks\", \".git/config\"]\n\
             [limits]\n\
             enforce = \"best-effort\"\n",
        );
        // A real git repository, so the project root is found by git and `git` works inside.
        let git = Command::new("git")
            .args(["init", "-q"])
            .current_dir(&w.project)
            .env("HOME", &w.home)
            .status()
            .expect("git");
        assert!(git.success());
        write(
            &w.project.join(".git/hooks/pre-commit"),
            "#!/bin/sh\nexit 0\n",
        );
        write(&w.project.join(".env"), ENV_SECRET);
        write(&w.project.join("sub/dir/.env"), ENV_SECRET);
        write(&w.project.join("README"), "hello from the project\n");
        w
    }

    /// A `corral` command in this world: cwd the project, a clean environment with HOME set.
    pub fn corral(&self) -> Command {
        let mut c = Command::new(corral_bin());
        c.current_dir(&self.project)
            .env_clear()
            .env("HOME", &self.home)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("LANG", "C.UTF-8")
            .env("TMPDIR", std::env::temp_dir());
        c
    }

    /// `filesystem.allow_new_repositories = true` in the user config: no name gate, what the
    /// jail creates is checked when the run ends (the tests of that check).
    pub fn allow_new_repositories(&self) {
        let file = self.home.join(".config/corral/config.toml");
        let text = std::fs::read_to_string(&file).unwrap();
        let text = text.replacen(
            "[filesystem]\n",
            "[filesystem]\nallow_new_repositories = true\n",
            1,
        );
        assert!(
            text.contains("allow_new_repositories"),
            "no [filesystem] in the user config"
        );
        std::fs::write(&file, text).unwrap();
    }

    /// `[undo] keep_runs = 0` in the user config: no change record is kept, so the change
    /// summary lists the project at the start and the end (the git or metadata method) instead
    /// of coming from the record.
    pub fn keep_no_record(&self) {
        let config = self.home.join(".config/corral/config.toml");
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(&config, format!("{text}[undo]\nkeep_runs = 0\n")).unwrap();
    }

    /// git on the host in `dir`, as the user (or their shell prompt) runs it: the world's home,
    /// no system config, no GIT_DIR/GIT_WORK_TREE from the test's environment.
    pub fn host_git(&self, dir: &Path, args: &[&str]) -> std::process::Output {
        Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("HOME", &self.home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .output()
            .expect("git")
    }

    /// A first commit of the project's README, made on the host.
    pub fn commit_readme(&self) {
        ok(&self.host_git(&self.project, &["add", "README"]));
        ok(&self.host_git(
            &self.project,
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
    }

    /// Every record of the audit logs under this world's home.
    pub fn audit_records(&self) -> Vec<serde_json::Value> {
        let mut lines = Vec::new();
        let mut stack = vec![self.home.join(".local/state/corral")];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "jsonl") {
                    lines.extend(
                        std::fs::read_to_string(&p)
                            .unwrap()
                            .lines()
                            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()),
                    );
                }
            }
        }
        lines
    }

    /// `corral trust` for the project's corral.toml (with the run options `args`), as the user
    /// does after reviewing what it grants.
    pub fn trust_project(&self, args: &[&str]) {
        let mut c = self.corral();
        c.arg("trust").args(args);
        let out = run(c);
        assert_eq!(out.code, 0, "corral trust failed:\n{}", out.both());
    }

    /// `corral run --network NET -- sh -c SCRIPT` with stdin closed.
    pub fn sh(&self, net: &str, script: &str) -> Out {
        run(self.sh_command(net, script))
    }

    /// The command `sh` runs, for a test that adds to it or runs it its own way.
    pub fn sh_command(&self, net: &str, script: &str) -> Command {
        let mut c = self.corral();
        c.args(["run", "--network", net, "--", "sh", "-c", script]);
        c
    }

    /// `corral run --policy POLICY -- sh -c SCRIPT` with stdin closed; the script must reach
    /// its last line, `echo END`.
    pub fn sh_policy(&self, policy: &Path, script: &str) -> Out {
        let mut c = self.corral();
        c.arg("run")
            .arg("--policy")
            .arg(policy)
            .args(["--", "sh", "-c", script]);
        let out = run(c);
        ran(&out, "END");
        out
    }
}

/// A loopback HTTP origin answering every request with `ORIGIN-OK PATH`.
pub fn origin() -> u16 {
    use std::io::Write;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut tmp) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&tmp[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&buf);
                let path = line.split(' ').nth(1).unwrap_or("?").to_string();
                let body = format!("ORIGIN-OK {path}");
                let _ = s.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            });
        }
    });
    port
}

impl Drop for World {
    fn drop(&mut self) {
        if std::fs::remove_dir_all(&self.root).is_err() {
            // An overlay's `work/work` in corral's harness state layer is mode 000.
            fn open_up(dir: &Path) {
                use std::os::unix::fs::PermissionsExt;
                if dir.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
                    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                        open_up(&e.path());
                    }
                }
            }
            open_up(&self.root);
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

pub fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// What a corral run produced.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn both(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// How long one corral run may take before the test kills it and fails.
const RUN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// Assert a command succeeded, showing its output if not.
#[track_caller]
pub fn ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Run corral to its end, its output captured. A run still going after `RUN_DEADLINE` is
/// killed (the jail dies with corral) and the test panics with the output so far.
pub fn run(mut c: Command) -> Out {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run corral");
    // Each pipe is read on a thread into a shared buffer, so a killed run still shows what it
    // printed even if something in the jail keeps the pipe open.
    type Buf = std::sync::Arc<std::sync::Mutex<Vec<u8>>>;
    fn drain(mut r: impl Read + Send + 'static) -> (Buf, std::thread::JoinHandle<()>) {
        let buf = Buf::default();
        let b = buf.clone();
        let t = std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = r.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                b.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        });
        (buf, t)
    }
    let text = |b: &Buf| String::from_utf8_lossy(&b.lock().unwrap()).into_owned();
    let (stdout, out_thread) = drain(child.stdout.take().unwrap());
    let (stderr, err_thread) = drain(child.stderr.take().unwrap());
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for corral") {
            break status;
        }
        if start.elapsed() > RUN_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            std::thread::sleep(std::time::Duration::from_millis(200));
            panic!(
                "corral still running after {RUN_DEADLINE:?}: killed it\nstdout so far:\n{}\nstderr so far:\n{}",
                text(&stdout),
                text(&stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    // corral exited: the pipes close once the jail (which dies with it) is gone; something
    // that outlives it and keeps them open fails the test at the same deadline.
    while !(out_thread.is_finished() && err_thread.is_finished()) {
        assert!(
            start.elapsed() <= RUN_DEADLINE,
            "corral exited ({status}) but its stdout/stderr were still open after \
             {RUN_DEADLINE:?}\nstdout so far:\n{}\nstderr so far:\n{}",
            text(&stdout),
            text(&stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    Out {
        code,
        stdout: text(&stdout),
        stderr: text(&stderr),
    }
}

/// Assert the jail ran (the script's own marker is in stdout) and return its output.
#[track_caller]
pub fn ran(out: &Out, marker: &str) {
    assert!(
        out.stdout.contains(marker),
        "the jail did not run to its end marker {marker:?}: code {}\nstdout:\n{}\nstderr:\n{}",
        out.code,
        out.stdout,
        out.stderr
    );
}

/// Run corral with a pty of the test's as its controlling terminal. Returns the master, the
/// slave (kept open by the test) and the child.
/// A pty of `rows` x `cols` whose two ends no other child of this test binary inherits:
/// openpty(3) leaves them inheritable, and a master leaked into another test's corral keeps this
/// test's terminal from ever hanging up (its corral and jail would outlive the test).
pub fn open_pty(rows: u16, cols: u16) -> nix::pty::OpenptyResult {
    use std::os::fd::AsFd;
    let ws = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&ws), None).unwrap();
    for fd in [pty.master.as_fd(), pty.slave.as_fd()] {
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .unwrap();
    }
    pty
}

pub fn under_pty(
    mut c: Command,
    rows: u16,
    cols: u16,
) -> (std::fs::File, std::fs::File, std::process::Child) {
    let pty = open_pty(rows, cols);
    let slave = std::fs::File::from(pty.slave);
    c.stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid, TIOCSCTTY on fd 0 and signal(2) are async-signal-safe syscalls.
    unsafe {
        c.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // A terminal's session starts with the terminal's signals at their defaults; a test
            // run from a shell's background job inherits SIGINT and SIGQUIT ignored.
            terminal_signals_default();
            Ok(())
        });
    }
    let child = c.spawn().unwrap();
    (std::fs::File::from(pty.master), slave, child)
}

/// SIGINT and SIGQUIT back to their defaults (in a child, before exec): what a command started
/// from a terminal has, whatever the test's own caller left ignored. Async-signal-safe.
pub fn terminal_signals_default() {
    // SAFETY: signal(2) with SIG_DFL changes only this process's dispositions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGQUIT, libc::SIG_DFL);
    }
}

/// What the terminal shows until `needle` appears in it, the child exits, or 30 s pass.
pub fn read_until(
    master: &mut std::fs::File,
    needle: &str,
    child: &mut std::process::Child,
) -> String {
    read_within(master, needle, child, std::time::Duration::from_secs(30))
}

/// [`read_until`], giving up after `within`.
pub fn read_within(
    master: &mut std::fs::File,
    needle: &str,
    child: &mut std::process::Child,
    within: std::time::Duration,
) -> String {
    use std::os::fd::AsFd;
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        let mut fds = [nix::poll::PollFd::new(
            master.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let n = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(200u16)).unwrap_or(0);
        if n > 0 {
            let mut buf = [0u8; 4096];
            match master.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(k) => seen.extend_from_slice(&buf[..k]),
            }
            if String::from_utf8_lossy(&seen).contains(needle) {
                break;
            }
        } else if child.try_wait().unwrap().is_some() {
            break;
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// The children of `pid` (from the host's /proc).
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// Every entry below `dir`: path -> (type and mode, content or link target).
pub fn tree(dir: &Path) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            let content = if m.file_type().is_symlink() {
                std::fs::read_link(&p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else if m.is_file() {
                std::fs::read(&p).unwrap_or_else(|_| b"<unreadable>".to_vec())
            } else {
                stack.push(p);
                Vec::new()
            };
            out.insert(rel, (m.mode(), content));
        }
    }
    out
}

/// The empty read-only placeholders corral itself holds on the host during a run (every run
/// makes them for absent protected paths, placeholder.rs), not the jail's writes.
pub const PLACEHOLDERS: [&str; 2] = ["corral.toml", ".git/config.worktree"];

/// `now` is `before`, but for corral's own placeholders during a run; the differing paths
/// named when not.
#[track_caller]
pub fn same_tree(
    before: &BTreeMap<PathBuf, (u32, Vec<u8>)>,
    now: &BTreeMap<PathBuf, (u32, Vec<u8>)>,
    when: &str,
) {
    let mut now = now.clone();
    for p in PLACEHOLDERS {
        if !before.contains_key(Path::new(p))
            && now.get(Path::new(p)).is_some_and(|(_, c)| c.is_empty())
        {
            now.remove(Path::new(p));
        }
    }
    let differ: Vec<&PathBuf> = before
        .keys()
        .chain(now.keys())
        .filter(|k| before.get(*k) != now.get(*k))
        .collect();
    assert!(
        differ.is_empty(),
        "the host's project changed {when}: {differ:?}"
    );
}
