//! A process in the jail really tries what an agent must not do, and fails.

mod jail_support;

use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::process::Command;

use jail_support::*;

#[test]
fn cannot_read_ssh_key_outside_dir_or_sibling_project() {
    let w = World::new();
    let script = format!(
        "cat {ssh} {outside} {sibling} 2>&1; ls {home}/.ssh {outroot} {siblingdir} 2>&1; echo END",
        ssh = w.home.join(".ssh/id_ed25519").display(),
        outside = w.outside.join("secret.txt").display(),
        sibling = w.sibling.join("secret.txt").display(),
        home = w.home.display(),
        outroot = w.outside.display(),
        siblingdir = w.sibling.display(),
    );
    let out = w.sh("none", &script);
    ran(&out, "END");
    for secret in [SSH_SECRET, OUTSIDE_SECRET, SIBLING_SECRET] {
        assert!(
            !out.both().contains(secret),
            "{secret} leaked:\n{}",
            out.both()
        );
    }
    // A listing prints bare names, one per line; errors name the path they could not reach.
    for name in ["id_ed25519", "secret.txt"] {
        assert!(
            !out.stdout.lines().any(|l| l.trim() == name),
            "{name} is listable in the jail:\n{}",
            out.stdout
        );
    }
}

#[test]
fn cannot_write_outside_the_project() {
    let w = World::new();
    let targets = [
        w.outside.join("planted.txt"),
        w.sibling.join("planted.txt"),
        w.home.join("planted.txt"),
        w.root.join("planted.txt"),
    ];
    let script = targets
        .iter()
        .map(|t| format!("echo x > {} 2>/dev/null; ", t.display()))
        .collect::<String>()
        + "echo END";
    let out = w.sh("none", &script);
    ran(&out, "END");
    for t in &targets {
        assert!(!t.exists(), "the jail wrote {} on the host", t.display());
    }
}

#[test]
fn masked_env_files_are_present_empty_and_unreadable() {
    let w = World::new();
    let out = w.sh(
        "none",
        "for f in .env sub/dir/.env; do \
           test -e $f && echo PRESENT:$f; \
           cat $f >/dev/null 2>&1 && echo READABLE:$f; \
           test -s $f && echo NONEMPTY:$f; \
           chmod 644 $f 2>/dev/null && echo CHMOD:$f; \
           echo overwrite > $f 2>/dev/null && echo WRITABLE:$f; \
           cat $f 2>/dev/null; \
         done; echo END",
    );
    ran(&out, "END");
    assert!(
        !out.both().contains(ENV_SECRET),
        "a masked .env leaked:\n{}",
        out.both()
    );
    for f in [".env", "sub/dir/.env"] {
        assert!(
            out.stdout.contains(&format!("PRESENT:{f}")),
            "{f} not present:\n{}",
            out.stdout
        );
        for bad in ["READABLE", "NONEMPTY", "CHMOD", "WRITABLE"] {
            assert!(
                !out.stdout.contains(&format!("{bad}:{f}")),
                "{f}: {bad}\n{}",
                out.stdout
            );
        }
    }
    assert_eq!(
        std::fs::read_to_string(w.project.join(".env")).unwrap(),
        ENV_SECRET
    );
}

/// A `.env` in a directory corral cannot list (mode 000): the jail's user owns it, so it could
/// make it readable and read a file the masking walk never saw. As the unprivileged user the
/// walk cannot read it and masks the whole directory; as root it reads it and masks the file.
#[test]
fn a_secret_in_a_directory_corral_cannot_list_stays_unreadable() {
    use std::os::unix::fs::PermissionsExt;
    let w = World::new();
    let locked = w.project.join("locked");
    write(&locked.join(".env"), ENV_SECRET);
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    let out = w.sh(
        "none",
        "chmod 700 locked 2>/dev/null && echo CHMOD; cat locked/.env 2>/dev/null; \
         cp locked/.env /tmp/x 2>/dev/null && cat /tmp/x; echo END",
    );
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    ran(&out, "END");
    assert!(
        !out.both().contains(ENV_SECRET),
        "the .env of an unlistable directory leaked:\n{}",
        out.both()
    );
    assert_eq!(
        std::fs::read_to_string(locked.join(".env")).unwrap(),
        ENV_SECRET
    );
}

#[test]
fn cannot_write_git_hooks_git_config_or_existing_policy() {
    let w = World::new();
    write(&w.project.join("corral.toml"), "# the project's policy\n");
    let config_before = std::fs::read_to_string(w.project.join(".git/config")).unwrap();
    let out = w.sh(
        "none",
        "echo 'curl evil' > .git/hooks/pre-commit 2>/dev/null && echo WROTE:hook; \
         echo 'x' > .git/hooks/post-checkout 2>/dev/null && echo WROTE:newhook; \
         echo '[core] fsmonitor = evil' >> .git/config 2>/dev/null && echo WROTE:config; \
         echo 'profile = \"x\"' >> corral.toml 2>/dev/null && echo WROTE:policy; \
         rm -f corral.toml 2>/dev/null && echo REMOVED:policy; \
         mv corral.toml c2 2>/dev/null && echo MOVED:policy; \
         mv .git .git-old 2>/dev/null && echo MOVED:git; \
         echo END",
    );
    ran(&out, "END");
    assert!(!out.stdout.contains("WROTE"), "{}", out.stdout);
    assert!(!out.stdout.contains("REMOVED"), "{}", out.stdout);
    assert!(!out.stdout.contains("MOVED"), "{}", out.stdout);
    assert_eq!(
        std::fs::read_to_string(w.project.join(".git/hooks/pre-commit")).unwrap(),
        "#!/bin/sh\nexit 0\n"
    );
    assert!(!w.project.join(".git/hooks/post-checkout").exists());
    assert_eq!(
        std::fs::read_to_string(w.project.join(".git/config")).unwrap(),
        config_before
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join("corral.toml")).unwrap(),
        "# the project's policy\n"
    );
}

#[test]
fn cannot_create_an_absent_policy_file() {
    let w = World::new();
    assert!(!w.project.join("corral.toml").exists());
    let out = w.sh(
        "none",
        "echo 'profile = \"shell\"' > corral.toml 2>/dev/null && echo WROTE:policy; \
         test -s corral.toml && echo NONEMPTY; echo END",
    );
    ran(&out, "END");
    assert!(!out.stdout.contains("WROTE"), "{}", out.stdout);
    assert!(!out.stdout.contains("NONEMPTY"), "{}", out.stdout);
    // The empty placeholder corral made while the jail ran is gone again.
    assert!(
        !w.project.join("corral.toml").exists(),
        "corral.toml left behind on the host"
    );
}

#[test]
fn cannot_see_or_signal_a_host_process_or_read_its_environment() {
    let w = World::new();
    let mut host = Command::new("sleep")
        .arg("300")
        .env("HOST_ONLY_SECRET", "HOSTENV-7d793037a076")
        .spawn()
        .unwrap();
    let pid = host.id();
    let mut c = w.corral();
    c.env("CALLER_ONLY_SECRET", "CALLERENV-1f3870be274f");
    c.args([
        "run",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        &format!(
            "kill -9 {pid} 2>/dev/null && echo KILLED; \
             test -e /proc/{pid}/cmdline && cat /proc/{pid}/cmdline; \
             cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; \
             env; ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '; echo; echo END"
        ),
    ]);
    let out = run(c);
    ran(&out, "END");
    assert!(
        host.try_wait().unwrap().is_none(),
        "the jail killed a host process"
    );
    let _ = host.kill();
    let _ = host.wait();
    assert!(!out.stdout.contains("KILLED"), "{}", out.stdout);
    assert!(!out.stdout.contains("sleep\u{0}300"), "{}", out.stdout);
    assert!(
        !out.both().contains("HOSTENV-7d793037a076"),
        "{}",
        out.both()
    );
    assert!(
        !out.both().contains("CALLERENV-1f3870be274f"),
        "a caller variable entered:\n{}",
        out.both()
    );
    // Only the jail's own processes are in its /proc: PID 1 and a handful of children.
    let pids_line = out.stdout.lines().rev().nth(1).unwrap_or_default();
    for p in pids_line.split_whitespace() {
        let p: u32 = p.parse().unwrap();
        assert!(p < 50, "a host-looking pid {p} is visible: {pids_line}");
    }
}

#[test]
fn cannot_reach_host_loopback_tcp_or_unix_sockets() {
    let w = World::new();
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let port = tcp.local_addr().unwrap().port();
    let sock_path = w.outside.join("host.sock");
    let unix = UnixListener::bind(&sock_path).unwrap();
    unix.set_nonblocking(true).unwrap();
    let abstract_name = format!("corral-test-{}-{port}", std::process::id());
    let abs = {
        use std::os::linux::net::SocketAddrExt;
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap();
        UnixListener::bind_addr(&addr).unwrap()
    };
    abs.set_nonblocking(true).unwrap();
    let script = format!(
        r#"
import socket
def attempt(name, fam, addr):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(addr)
        print("CONNECTED:" + name)
    except OSError as e:
        print("refused:" + name + ":" + str(e))
attempt("tcp", socket.AF_INET, ("127.0.0.1", {port}))
attempt("path", socket.AF_UNIX, "{path}")
attempt("abstract", socket.AF_UNIX, "\0{abstract_name}")
print("END")
"#,
        path = sock_path.display()
    );
    for net in ["none", "proxy"] {
        let mut c = w.corral();
        c.args(["run", "--network", net, "--", "python3", "-c", &script]);
        let out = run(c);
        ran(&out, "END");
        assert!(
            !out.stdout.contains("CONNECTED"),
            "network {net}:\n{}",
            out.both()
        );
        assert!(
            tcp.accept().is_err(),
            "network {net}: the host TCP service got a connection"
        );
        assert!(
            unix.accept().is_err(),
            "network {net}: the host unix socket got a connection"
        );
        assert!(
            abs.accept().is_err(),
            "network {net}: the abstract socket got a connection"
        );
    }
}

#[test]
fn cannot_create_a_user_namespace_or_mount() {
    let w = World::new();
    let out = w.sh(
        "none",
        "unshare -U true 2>/dev/null && echo USERNS; \
         unshare -Ur true 2>/dev/null && echo USERNS_ROOT; \
         unshare -m true 2>/dev/null && echo MOUNTNS; \
         mount -t tmpfs none /tmp 2>/dev/null && echo MOUNTED; \
         mount --bind / /tmp 2>/dev/null && echo BOUND; \
         echo END",
    );
    ran(&out, "END");
    for bad in ["USERNS", "MOUNTNS", "MOUNTED", "BOUND"] {
        assert!(!out.stdout.contains(bad), "{bad}:\n{}", out.stdout);
    }
}

#[test]
fn cannot_open_raw_disks_or_kernel_devices() {
    let w = World::new();
    let out = w.sh(
        "none",
        "for d in /dev/sda /dev/vda /dev/nvme0n1 /dev/xvda /dev/kmsg /dev/mem /dev/kmem /dev/port \
                  /dev/loop0 /dev/dm-0 /dev/sg0 /dev/console; do \
           head -c1 $d >/dev/null 2>&1 && echo OPENED:$d; \
         done; ls /dev | tr '\\n' ' '; echo; echo END",
    );
    ran(&out, "END");
    assert!(!out.stdout.contains("OPENED"), "{}", out.stdout);
    let listing: Vec<&str> = out
        .stdout
        .lines()
        .rev()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .collect();
    let allowed = [
        "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty",
        "urandom", "zero",
    ];
    for entry in &listing {
        assert!(
            allowed.contains(entry),
            "unexpected /dev entry {entry}: {listing:?}"
        );
    }
}

#[test]
fn cannot_inject_into_the_terminal_corral_was_started_from() {
    let w = World::new();
    let (mut master, slave, mut child) = {
        let mut c = w.corral();
        c.args([
            "run",
            "--network",
            "none",
            "--",
            "python3",
            "-c",
            r#"
import fcntl, os, sys, termios
fds = [0, 1, 2]
try:
    fds.append(os.open("/dev/tty", os.O_RDWR))
except OSError as e:
    print("no /dev/tty:", e)
for fd in fds:
    st = os.fstat(fd)
    print("FD %d DEV %d RDEV %d" % (fd, st.st_dev, st.st_rdev))
    for ch in b"INJECTED\n":
        try:
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))
            print("TIOCSTI-OK fd", fd)
            break
        except OSError as e:
            pass
print("END")
"#,
        ]);
        under_pty(c, 24, 80)
    };
    let out = read_until(&mut master, "END", &mut child);
    let status = child.wait().unwrap();
    assert!(
        out.contains("END"),
        "the jail did not run: {status:?}\n{out}"
    );
    // No descriptor in the jail is the test's terminal (same devpts instance and tty number).
    use std::os::unix::fs::MetadataExt;
    let ours = slave.metadata().unwrap();
    for line in out.lines().filter(|l| l.starts_with("FD ")) {
        let f: Vec<u64> = line
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        assert!(
            !(f[1] == ours.dev() && f[2] == ours.rdev()),
            "the jail holds corral's own terminal: {line}"
        );
    }
    // Whatever TIOCSTI did inside, nothing is queued on the terminal corral was started from.
    let mut pending: libc::c_int = 0;
    use std::os::fd::AsRawFd;
    // SAFETY: FIONREAD writes one int, which we provide.
    unsafe { libc::ioctl(slave.as_raw_fd(), libc::FIONREAD, &mut pending) };
    assert_eq!(pending, 0, "bytes were injected into the outer terminal");
    assert!(
        !out.contains("TIOCSTI-OK"),
        "TIOCSTI is allowed in the jail:\n{out}"
    );
}

#[test]
fn pids_and_memory_limits_are_enforced_as_root() {
    if !is_root() {
        eprintln!("skipping: cgroup limits need a writable cgroup (root on this host)");
        return;
    }
    let w = World::new();
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--pids",
        "16",
        "--",
        "sh",
        "-c",
        "n=0; for i in $(seq 40); do sleep 5 2>/dev/null & done; wait; echo END",
    ]);
    let out = run(c);
    assert!(
        out.stderr.contains("process limit reached") || out.stderr.contains("fork"),
        "no pids limit hit reported: code {}\n{}",
        out.code,
        out.both()
    );
    let mut c = w.corral();
    c.args([
        "run", "--network", "none", "--memory", "64m", "--", "python3", "-c",
        "b = bytearray(400 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('ALLOCATED')",
    ]);
    let out = run(c);
    assert!(
        !out.stdout.contains("ALLOCATED"),
        "allocated past the memory limit:\n{}",
        out.both()
    );
    assert!(
        out.code == 137 || out.code == 1,
        "unexpected exit {}:\n{}",
        out.code,
        out.both()
    );
    assert!(
        out.stderr.contains("out of memory"),
        "no OOM reported:\n{}",
        out.stderr
    );
    let records = w.audit_records();
    for event in ["oom", "pids"] {
        assert!(
            records
                .iter()
                .any(|r| r["kind"] == "jail" && r["event"] == event),
            "no {event} record in the audit log: {records:?}"
        );
    }
}

#[test]
fn cannot_look_into_pid_one() {
    let w = World::new();
    let out = w.sh(
        "none",
        "readlink /proc/1/fd/0 >/dev/null 2>&1 && echo FDS; \
         cat /proc/1/fd/3 </dev/null >/dev/null 2>&1 && echo FDS; \
         cat /proc/1/environ >/dev/null 2>&1 && echo ENVIRON; \
         ls /proc/1/root/ >/dev/null 2>&1 && echo ROOT; \
         cat /proc/1/mem >/dev/null 2>&1 && echo MEM; \
         kill -STOP 1 2>/dev/null; kill -KILL 1 2>/dev/null; sleep 0.2; \
         ls -l /proc/self/fd | grep -c socket; echo END",
    );
    ran(&out, "END");
    for bad in ["FDS", "ENVIRON", "ROOT", "MEM"] {
        assert!(!out.stdout.contains(bad), "{bad}:\n{}", out.stdout);
    }
    // No socket descriptor (the control socket, corral's listeners) reached the command.
    assert!(
        out.stdout.contains("\n0\nEND") || out.stdout.starts_with("0\nEND"),
        "{}",
        out.stdout
    );
    assert_eq!(out.code, 0, "{}", out.both());
}

/// A relative symlink from `dir` (a directory in the project) to `to`, as an agent would plant
/// it: it resolves to `to` on the host.
fn relative_link(dir: &std::path::Path, to: &std::path::Path) -> std::path::PathBuf {
    let ups = dir.components().count() - 1;
    let mut p = std::path::PathBuf::new();
    for _ in 0..ups {
        p.push("..");
    }
    p.join(to.strip_prefix("/").unwrap())
}

fn plant(link: &std::path::Path, to: &std::path::Path) {
    let _ = std::fs::remove_dir_all(link);
    let _ = std::fs::remove_file(link);
    let text = relative_link(link.parent().unwrap(), to);
    std::os::unix::fs::symlink(&text, link).unwrap();
    // It really leads to the secret on the host.
    assert!(std::fs::read_dir(link).is_ok(), "{}", link.display());
}

#[test]
fn a_symlink_planted_in_the_project_never_exposes_a_host_directory() {
    // A previous run replaced `vendor` (bound read-only by the user with `--ro vendor`) by a
    // relative link that leads to the home directory on the host, and in the new root to the
    // jail's own (private) home: following it would bind the host's home, keys included.
    let w = World::new();
    plant(&w.project.join("vendor"), &w.home);
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--ro",
        "vendor",
        "--",
        "sh",
        "-c",
        &format!(
            "cat vendor/.ssh/id_ed25519 {home}/.ssh/id_ed25519 2>&1; ls vendor/.ssh {home}/.ssh 2>&1; echo END",
            home = w.home.display()
        ),
    ]);
    let out = run(c);
    assert!(
        !out.both().contains(SSH_SECRET),
        "the host's key leaked through a planted link:\n{}",
        out.both()
    );
    assert!(
        !out.stdout.lines().any(|l| l.trim() == "id_ed25519"),
        "{}",
        out.both()
    );
    // Refused, naming the link and where it points.
    assert_ne!(out.code, 0, "{}", out.both());
    assert!(
        out.stderr.contains("vendor") && out.stderr.contains("symbolic link"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_symlink_planted_at_a_protected_path_refuses_the_run() {
    // `.git/hooks` replaced by a link to a directory the jail can write (and to ~/.ssh): the
    // protection would land on the link's target while host git follows the link.
    for to in ["writable-hooks", "ssh"] {
        let w = World::new();
        let target = if to == "ssh" {
            w.home.join(".ssh")
        } else {
            std::fs::create_dir_all(w.project.join(to)).unwrap();
            w.project.join(to)
        };
        plant(&w.project.join(".git/hooks"), &target);
        let out = w.sh(
            "none",
            "echo evil > .git/hooks/post-checkout 2>/dev/null && echo WROTE; \
             cat .git/hooks/id_ed25519 2>&1; echo END",
        );
        assert!(!out.both().contains(SSH_SECRET), "{}", out.both());
        assert!(!out.stdout.contains("WROTE"), "{to}: {}", out.both());
        assert!(!target.join("post-checkout").exists(), "{to}");
        assert_ne!(out.code, 0, "{to}: {}", out.both());
        assert!(
            out.stderr.contains(".git/hooks") && out.stderr.contains("symbolic link"),
            "{to}: {}",
            out.stderr
        );
    }
}

#[test]
fn a_masked_symlink_and_what_it_points_to_are_unreadable() {
    let w = World::new();
    write(&w.project.join("config/prod.txt"), ENV_SECRET);
    std::os::unix::fs::symlink("config/prod.txt", w.project.join(".env.prod")).unwrap();
    // One that leads out of the project to the host's key: the jail does not see that file at
    // all, and the mask never lands on it on the host.
    plant(&w.project.join(".env.ssh"), &w.home.join(".ssh"));
    let out = w.sh(
        "none",
        "cat .env.prod config/prod.txt 2>&1; cat .env.ssh/id_ed25519 2>&1; \
         test -e .env.prod && echo PRESENT; echo END",
    );
    ran(&out, "END");
    assert!(!out.both().contains(ENV_SECRET), "{}", out.both());
    assert!(!out.both().contains(SSH_SECRET), "{}", out.both());
    assert!(out.stdout.contains("PRESENT"), "{}", out.both());
    // The host's files are untouched.
    assert_eq!(
        std::fs::read_to_string(w.project.join("config/prod.txt")).unwrap(),
        ENV_SECRET
    );
    assert_eq!(
        std::fs::read_to_string(w.home.join(".ssh/id_ed25519")).unwrap(),
        SSH_SECRET
    );
}

#[test]
fn a_repository_without_hooks_gets_none_from_the_jail() {
    let w = World::new();
    std::fs::remove_dir_all(w.project.join(".git/hooks")).unwrap();
    let out = w.sh(
        "none",
        "mkdir -p .git/hooks 2>/dev/null; \
         echo 'curl evil' > .git/hooks/post-checkout 2>/dev/null && echo WROTE; \
         chmod +x .git/hooks/post-checkout 2>/dev/null; \
         rmdir .git/hooks 2>/dev/null && echo REMOVED; \
         mv .git/hooks .git/h2 2>/dev/null && echo MOVED; \
         git status >/dev/null 2>&1 && echo GIT_OK; echo END",
    );
    ran(&out, "END");
    for bad in ["WROTE", "REMOVED", "MOVED"] {
        assert!(!out.stdout.contains(bad), "{bad}:\n{}", out.both());
    }
    assert!(out.stdout.contains("GIT_OK"), "git broke:\n{}", out.both());
    assert!(!w.project.join(".git/hooks/post-checkout").exists());
    // The empty placeholder corral made for the run is gone again.
    assert!(
        !w.project.join(".git/hooks").exists(),
        ".git/hooks left behind on the host"
    );
}

#[test]
fn git_init_in_the_jail_cannot_plant_hooks_or_config() {
    let w = World::new();
    std::fs::remove_dir_all(w.project.join(".git")).unwrap();
    let out = w.sh(
        "none",
        "git init -q 2>/dev/null && echo INIT; \
         mkdir -p .git/hooks 2>/dev/null; \
         echo 'curl evil' > .git/hooks/post-checkout 2>/dev/null && echo WROTE:hook; \
         printf '[core]\\n\\tfsmonitor = evil\\n' > .git/config 2>/dev/null && echo WROTE:config; \
         mv .git .git-old 2>/dev/null && echo MOVED; echo END",
    );
    ran(&out, "END");
    for bad in ["WROTE", "MOVED", "INIT"] {
        assert!(!out.stdout.contains(bad), "{bad}:\n{}", out.both());
    }
    // Nothing of the jail's is left: no hook, no config, and no `.git` at all.
    assert!(
        !w.project.join(".git").exists(),
        "the jail left a .git on the host: {:?}",
        std::fs::read_dir(w.project.join(".git"))
            .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
}

#[test]
fn a_state_directory_replaced_by_a_link_in_a_writable_bind_is_refused() {
    // With `--rw ~/.config` an earlier run could replace opencode's state directory
    // (~/.config/opencode, bound read-write into every opencode jail) by a link to ~/.ssh.
    let w = World::new();
    std::fs::create_dir_all(w.home.join(".config")).unwrap();
    plant(&w.home.join(".config/opencode"), &w.home.join(".ssh"));
    let config = w.home.join(".config");
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--rw",
        config.to_str().unwrap(),
        "opencode",
        "--",
        "sh",
        "-c",
        "cat ~/.config/opencode/id_ed25519 ~/.ssh/id_ed25519 2>&1; echo END",
    ]);
    let out = run(c);
    assert!(!out.both().contains(SSH_SECRET), "{}", out.both());
    assert_ne!(out.code, 0, "{}", out.both());
    assert!(
        out.stderr.contains(".config/opencode") && out.stderr.contains("symbolic link"),
        "{}",
        out.stderr
    );
}

/// Whether `needle` is anywhere in the readable memory of process `pid`; `None` when its
/// memory cannot be read at all (a non-dumpable process, for a caller without privileges).
fn memory_holds(pid: u32, needle: &[u8]) -> Option<bool> {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut read_any = false;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        if !perms.starts_with('r') || hi - lo > 1 << 30 {
            continue;
        }
        let mut region = vec![0u8; (hi - lo) as usize];
        // [vvar] and the like refuse reads: skip them.
        if mem.read_exact_at(&mut region, lo).is_err() {
            continue;
        }
        read_any = true;
        if region.windows(needle.len()).any(|w| w == needle) {
            return Some(true);
        }
    }
    read_any.then_some(false)
}

/// The jail's set-up process and its PID 1 are forked from corral before it reads anything,
/// and wipe what they inherited: a variable of the caller's (an API key, say) that the policy
/// does not pass is in neither's memory, and PID 1's command line, which the jail can read,
/// does not repeat corral's.
#[test]
fn the_jails_own_processes_hold_none_of_the_callers_environment() {
    let w = World::new();
    let secret = format!("caller-api-key-{}-{}", std::process::id(), line!());
    let (ready, done) = (w.project.join("ready"), w.project.join("done"));
    let mut c = w.sh_command(
        "none",
        "tr '\\0' ' ' < /proc/1/cmdline; echo; echo \"key=[$SOME_API_KEY]\"; touch ready; \
         while [ ! -e done ]; do sleep 0.05; done; echo END",
    );
    c.env("SOME_API_KEY", &secret);
    let runner = std::thread::spawn(move || run(c));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !ready.exists() {
        assert!(
            !runner.is_finished() && std::time::Instant::now() < deadline,
            "the jail never became ready"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // corral (the test's child with the key in its environment: the scan finds it there), its
    // set-up process, and that one's child, the jail's PID 1. Scanned before the jail is let
    // go; asserted after, so a failure never leaves it running.
    let corral = children_of(std::process::id())
        .into_iter()
        .find(|p| memory_holds(*p, secret.as_bytes()) == Some(true));
    let setup = corral.and_then(|p| children_of(p).first().copied());
    let pid_one = setup.and_then(|p| children_of(p).first().copied());
    let in_setup = setup.map(|p| memory_holds(p, secret.as_bytes()));
    let in_pid_one = pid_one.map(|p| memory_holds(p, secret.as_bytes()));
    std::fs::write(&done, "").unwrap();
    let out = runner.join().unwrap();
    ran(&out, "END");
    assert!(
        corral.is_some(),
        "corral's own memory holds the key: the scan works"
    );
    assert_eq!(
        in_setup,
        Some(Some(false)),
        "the set-up process's memory (None: no such process; Some(None): unreadable)"
    );
    match in_pid_one {
        Some(Some(found)) => assert!(!found, "the key is in the jail's PID 1"),
        // Unprivileged, a non-dumpable process's memory is closed to its own user as well.
        Some(None) => eprintln!("note: PID 1 is non-dumpable and this user cannot read its memory"),
        None => panic!("no PID 1 found under the set-up process"),
    }
    assert!(out.stdout.contains("key=[]"), "{}", out.both());
    assert!(!out.stdout.contains(&secret), "{}", out.both());
    let cmdline = out.stdout.lines().next().unwrap_or_default();
    assert!(
        cmdline.contains("__corral-jail-init") && !cmdline.contains(" run "),
        "PID 1's command line: {cmdline:?}"
    );
}

/// corral started with stdin and stdout closed (as a daemon or a careless wrapper may): the
/// jail's control socket must not land there and reach the jail as its stdio. (Rust's runtime
/// opens /dev/null on a closed 0, 1 or 2 before `main`; this holds corral to that.)
#[test]
fn closed_stdio_never_hands_the_jail_a_control_socket() {
    let w = World::new();
    // `sh` closes 0 and 1, then execs corral; the jail reports its 0 and 1 on stderr.
    let c = w.sh_command(
        "none",
        "echo \"fd0=$(readlink /proc/$$/fd/0) fd1=$(readlink /proc/$$/fd/1)\" >&2; \
         echo END >&2",
    );
    let argv: Vec<String> = std::iter::once(c.get_program())
        .chain(c.get_args())
        .map(|a| format!("'{}'", a.to_string_lossy().replace('\'', "'\\''")))
        .collect();
    let mut sh = Command::new("sh");
    sh.current_dir(&w.project)
        .env_clear()
        .envs(c.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .args(["-c", &format!("exec {} <&- >&-", argv.join(" "))]);
    let out = run(sh);
    assert!(out.stderr.contains("END"), "{}", out.both());
    assert!(
        out.stderr.contains("fd0=/dev/null fd1=/dev/null"),
        "the jail's stdin/stdout: {}",
        out.both()
    );
    assert_eq!(out.code, 0, "{}", out.both());
}
