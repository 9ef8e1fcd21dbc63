//! What a jail leaves on the host, and what a root-run jail's uid 0 can reach (set-id
//! files, device nodes, root-only files of the curated /etc, tmpfs memory, the terminal).
//!
//! Each test is an attack from inside the jail, checked on the host afterwards. They run as
//! root and as an unprivileged user (scripts/test-rootless); where the attack only means
//! something as root, the unprivileged pass still checks what it can.

mod jail_support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use jail_support::{World, is_root, ran, write};

/// Every regular file below `dir` whose mode has a set-user-ID or set-group-ID bit.
fn set_id_files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let meta = e.path().symlink_metadata().unwrap();
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() && meta.mode() & 0o6000 != 0 {
                found.push(format!("{} {:o}", e.path().display(), meta.mode() & 0o7777));
            }
        }
    }
    found
}

#[test]
fn a_jail_cannot_leave_a_set_id_file_in_the_project() {
    let w = World::new();
    // A set-user-ID program of the host, when there is one, copied with its mode kept.
    let setuid_host = [
        "/usr/bin/passwd",
        "/usr/bin/su",
        "/bin/su",
        "/usr/bin/mount",
    ]
    .into_iter()
    .find(|p| std::fs::metadata(p).is_ok_and(|m| m.mode() & 0o4000 != 0))
    .unwrap_or("/bin/true");
    let script = format!(
        r#"
cp /bin/true prog
chmod 4755 prog && echo CHMOD-SUID-WORKED
chmod u+s prog && echo CHMOD-US-WORKED
chmod g+s prog && echo CHMOD-GS-WORKED
install -m 4755 /bin/true installed && echo INSTALL-WORKED
cp -p {setuid_host} copied 2>/dev/null; echo COPIED
python3 -c 'import os; os.close(os.open("created", os.O_CREAT | os.O_WRONLY, 0o4755)); print("OPEN-WORKED")'
python3 -c 'import os; os.mknod("node", 0o104755); print("MKNOD-WORKED")'
mkdir -m 2755 dir && echo MKDIR-RAN
chmod 755 prog && echo CHMOD-755-OK
echo END
"#
    );
    let out = w.sh("none", &script);
    ran(&out, "END");
    for worked in [
        "CHMOD-SUID-WORKED",
        "CHMOD-US-WORKED",
        "CHMOD-GS-WORKED",
        "INSTALL-WORKED",
        "OPEN-WORKED",
        "MKNOD-WORKED",
    ] {
        assert!(
            !out.stdout.contains(worked),
            "{worked}: the jail set a set-id bit\n{}",
            out.both()
        );
    }
    assert!(out.stdout.contains("CHMOD-755-OK"), "{}", out.both());
    assert_eq!(
        set_id_files(&w.project),
        Vec::<String>::new(),
        "{}",
        out.both()
    );
    let mode = std::fs::metadata(w.project.join("prog")).unwrap().mode();
    assert_eq!(mode & 0o7777, 0o755);
}

/// The executor on the host (an explicit opt-in) runs outside the jail's seccomp filter: a
/// set-id file it makes in the project is stripped and reported when the run ends, with the fix
/// in the message and an audit record. Set-id files from before the run are left alone.
#[test]
fn a_set_id_file_the_host_executor_made_is_reported_and_stripped() {
    let w = World::new();
    let before = w.project.join("old-setuid");
    write(&before, "#!/bin/sh\n");
    std::fs::set_permissions(&before, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // ctime is the kernel's coarse clock: let it move well past the pre-existing file's change.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    write(
        &w.project.join("corral.toml"),
        "[executor]\ntarget = \"host\"\n",
    );
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
        "corral exec -- sh -c 'mkdir -p sub && cp /bin/true sub/made && chmod 6755 sub/made \
         && echo MADE'; echo END",
    ]);
    let out = jail_support::run(c);
    ran(&out, "END");
    assert!(
        out.stdout.contains("MADE"),
        "control: the host executor did not make it\n{}",
        out.both()
    );
    let made = w.project.join("sub/made");
    let mode = std::fs::metadata(&made).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o755, "not stripped\n{}", out.both());
    assert!(
        out.stderr.contains("sub/made (mode 6755)"),
        "not reported\n{}",
        out.stderr
    );
    assert!(out.stderr.contains("set-user-ID"), "{}", out.stderr);
    assert_eq!(std::fs::metadata(&before).unwrap().mode() & 0o7777, 0o4755);
    assert!(!out.stderr.contains("old-setuid"), "{}", out.stderr);
    let records = w.audit_records();
    assert!(
        records
            .iter()
            .any(|r| r.to_string().contains("setid") && r.to_string().contains("sub/made")),
        "no audit record: {records:?}"
    );
}

/// (mode, uid, gid, mtime, ctime) of a host path.
fn node_state(path: &str) -> (u32, u32, u32, (i64, i64), (i64, i64)) {
    let m = std::fs::metadata(path).unwrap();
    (
        m.mode(),
        m.uid(),
        m.gid(),
        (m.mtime(), m.mtime_nsec()),
        (m.ctime(), m.ctime_nsec()),
    )
}

/// The attempts keep each node's mode and owner as they are on a usual host (root, 0666), so a
/// regression shows as a changed time rather than as a host whose /dev/null broke.
#[test]
fn the_jails_device_nodes_are_the_hosts_and_stay_unchanged() {
    let w = World::new();
    let nodes = ["/dev/null", "/dev/full", "/dev/zero", "/dev/urandom"];
    let before: Vec<_> = nodes.iter().map(|n| node_state(n)).collect();
    let out = w.sh(
        "none",
        r#"
chmod 666 /dev/full && echo CHMOD-FULL-WORKED
chmod 666 /dev/null && echo CHMOD-NULL-WORKED
touch /dev/null && echo TOUCH-NULL-WORKED
touch /dev/zero && echo TOUCH-ZERO-WORKED
chown 0:0 /dev/urandom && echo CHOWN-WORKED
echo x > /dev/null && echo WRITE-NULL-OK
head -c 4 /dev/urandom | wc -c
echo x > /dev/full || echo FULL-IS-FULL
echo END
"#,
    );
    ran(&out, "END");
    for worked in [
        "CHMOD-FULL-WORKED",
        "CHMOD-NULL-WORKED",
        "TOUCH-NULL-WORKED",
        "TOUCH-ZERO-WORKED",
        "CHOWN-WORKED",
    ] {
        assert!(!out.stdout.contains(worked), "{worked}\n{}", out.both());
    }
    // The devices still work as devices.
    assert!(out.stdout.contains("WRITE-NULL-OK"), "{}", out.both());
    assert!(out.stdout.contains("\n4\n"), "{}", out.both());
    assert!(out.stdout.contains("FULL-IS-FULL"), "{}", out.both());
    let after: Vec<_> = nodes.iter().map(|n| node_state(n)).collect();
    assert_eq!(before, after, "a host device node changed");
}

/// Removes a file planted in the host's /etc when the test ends, pass or fail.
struct Planted(std::path::PathBuf);

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn the_hosts_private_keys_are_not_in_the_jails_etc() {
    let w = World::new();
    let secret = format!(
        "PRIVATE-KEY-{}-{:?}",
        std::process::id(),
        std::time::SystemTime::now()
    );
    let name = format!("corral-test-{}.key", std::process::id());
    let _planted = if is_root() && Path::new("/etc/ssl/private").is_dir() {
        let path = Path::new("/etc/ssl/private").join(&name);
        std::fs::write(&path, &secret).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        Some(Planted(path))
    } else {
        eprintln!("not root or no /etc/ssl/private: checking visibility only");
        None
    };
    let out = w.sh(
        "none",
        &format!(
            r#"
cat /etc/ssl/private/{name} 2>/dev/null
ls -a /etc/ssl/private 2>/dev/null && echo PRIVATE-LISTED
ls -a /etc/pki/tls/private 2>/dev/null && echo PKI-PRIVATE-LISTED
grep -rl "{secret}" /etc 2>/dev/null
[ -r /etc/ssl/certs/ca-certificates.crt ] || [ -r /etc/pki/tls/certs/ca-bundle.crt ] || [ -r /etc/ssl/cert.pem ] && echo CA-BUNDLE-OK
[ -r /etc/ssl/openssl.cnf ] || [ -r /etc/pki/tls/openssl.cnf ] && echo OPENSSL-CNF-OK
echo END
"#
        ),
    );
    ran(&out, "END");
    assert!(!out.stdout.contains(&secret), "{}", out.both());
    assert!(!out.stdout.contains("PRIVATE-LISTED"), "{}", out.both());
    assert!(!out.stdout.contains("PKI-PRIVATE-LISTED"), "{}", out.both());
    assert!(out.stdout.contains("CA-BUNDLE-OK"), "{}", out.both());
    if Path::new("/etc/ssl/openssl.cnf").exists() || Path::new("/etc/pki/tls/openssl.cnf").exists()
    {
        assert!(out.stdout.contains("OPENSSL-CNF-OK"), "{}", out.both());
    }
}

/// `--memory 256m` in best-effort mode (as root a cgroup enforces it too; unprivileged, nothing
/// else bounds tmpfs): the jail's tmpfs mounts together hold at most the limit, and a 400 MB
/// write to /tmp, /dev/shm or the home runs out of space instead of taking host memory.
#[test]
fn the_jails_tmpfs_mounts_are_bounded_by_the_memory_limit() {
    let w = World::new();
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--memory",
        "256m",
        "--enforce",
        "best-effort",
        "--",
        "sh",
        "-c",
        r#"
fill() { err=$(head -c 400000000 /dev/zero 2>&1 > "$1/fill") || echo "$2 $err"; rm -f "$1/fill"; }
fill /tmp TMP-FULL
fill /dev/shm SHM-FULL
fill "$HOME" HOME-FULL
echo "TOTAL $(df -B1 --output=size /tmp /dev/shm "$HOME" | awk 'NR>1 {s+=$1} END {print s}')"
echo END
"#,
    ]);
    let out = jail_support::run(c);
    ran(&out, "END");
    assert!(
        out.stdout.contains("TMP-FULL") && out.stdout.contains("No space left on device"),
        "{}",
        out.both()
    );
    assert!(out.stdout.contains("SHM-FULL"), "{}", out.both());
    assert!(out.stdout.contains("HOME-FULL"), "{}", out.both());
    let total: u64 = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("TOTAL "))
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("no total\n{}", out.both()));
    assert!(
        total <= 256 << 20,
        "the tmpfs mounts held {total} bytes\n{}",
        out.both()
    );
}

/// What the jail prints, as the bytes that reach the user's terminal: corral runs with a pty of
/// the test's as its stdout and stderr, and as its stdin too when `stdin_tty` (the jail then
/// gets a pty of its own, relayed; otherwise stdin is closed and corral copies the jail's output
/// pipes to the terminal).
fn terminal_bytes(w: &World, extra: &[&str], script: &str, stdin_tty: bool) -> String {
    let mut c = w.corral();
    c.args(["run", "--network", "none"])
        .args(extra)
        .args(["--", "sh", "-c", script]);
    let (mut master, slave, mut child) = if stdin_tty {
        jail_support::under_pty(c, 24, 80)
    } else {
        let pty = jail_support::open_pty(24, 80);
        let slave = std::fs::File::from(pty.slave);
        c.stdin(std::process::Stdio::null())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave.try_clone().unwrap());
        let child = c.spawn().unwrap();
        (std::fs::File::from(pty.master), slave, child)
    };
    let mut seen = jail_support::read_until(&mut master, "END-OF-OUTPUT", &mut child);
    // Then corral's end-of-run report, until it exits.
    seen += &jail_support::read_until(&mut master, "\0never printed\0", &mut child);
    let _ = child.wait();
    drop(slave);
    seen
}

/// Escape sequences that act outside the screen: the clipboard (OSC 52, 7-bit and 8-bit, split
/// across writes), a font change, an iTerm2 file, a kitty graphics file read, user-defined keys,
/// a window move. A title and colours are screen-only and pass.
const HOSTILE_OUTPUT: &str = r#"
printf 'A\033]52;c;Q0xJUEJPQVJELUFUVEFDSw==\007B'
printf 'C\033]5'; sleep 0.2; printf '2;c;Q0xJUEJPQVJELVNQTElU\033\\D'
printf 'E\302\23552;c;Q0xJUEJPQVJELUMx\302\234F'
printf 'G\033]50;FONT-ATTACK\007H\033]1337;File=name=eA==:RklMRS1BVFRBQ0s=\007I'
printf 'J\033_Ga=T,t=f;R1JBUEhJQ1MtQVRUQUNL\033\\K\033P0;1|17/4b4559\033\\L\033[3;1;1tM'
printf '\033]0;TITLE-PASSES\007\033[31mRED\033[0m\n'
echo END-OF-OUTPUT
"#;

#[test]
fn the_jails_output_cannot_reach_the_clipboard_or_other_host_facilities() {
    let w = World::new();
    for stdin_tty in [true, false] {
        let seen = terminal_bytes(&w, &[], HOSTILE_OUTPUT, stdin_tty);
        assert!(seen.contains("END-OF-OUTPUT"), "{seen:?}");
        // The 8-bit OSC's introducer and terminator are dropped; what was between them is
        // plain text then.
        assert!(seen.contains("E52;c;Q0xJUEJPQVJELUMxF"), "{seen:?}");
        for gone in [
            "\x1b]52",
            "Q0xJUEJPQVJELUFUVEFDSw",
            "Q0xJUEJPQVJELVNQTElU",
            "\u{9d}",
            "\u{9c}",
            "FONT-ATTACK",
            "RklMRS1BVFRBQ0s",
            "R1JBUEhJQ1M",
            "\x1bP",
            "4b4559",
            "\x1b[3;1;1t",
        ] {
            assert!(
                !seen.contains(gone),
                "{gone:?} reached the terminal (stdin a terminal: {stdin_tty}): {seen:?}"
            );
        }
        assert!(seen.contains("ABCD"), "{seen:?}");
        // The report says what was kept back, and how to let clipboard writes through.
        assert!(
            seen.contains("clipboard sequence(s) (OSC 52)")
                && seen.contains("[terminal] clipboard = true"),
            "{seen:?}"
        );
        assert!(seen.contains("\x1b]0;TITLE-PASSES\x07"), "{seen:?}");
        assert!(seen.contains("\x1b[31mRED\x1b[0m"), "{seen:?}");
    }
}

#[test]
fn terminal_clipboard_in_the_policy_lets_clipboard_writes_through_but_not_reads() {
    let w = World::new();
    let policy = w.root.join("clipboard.toml");
    write(&policy, "[terminal]\nclipboard = true\n");
    let script = r#"
printf 'A\033]52;c;Q0xJUC1XUklURQ==\007B\033]52;c;?\007C'
echo END-OF-OUTPUT
"#;
    let policy_arg = policy.to_str().unwrap();
    let seen = terminal_bytes(&w, &["--policy", policy_arg], script, true);
    assert!(
        seen.contains("A\x1b]52;c;Q0xJUC1XUklURQ==\x07B"),
        "the clipboard write did not pass: {seen:?}"
    );
    assert!(seen.contains("BC"), "the clipboard read passed: {seen:?}");
    // Without the key, the write is dropped too.
    let seen = terminal_bytes(&w, &[], script, true);
    assert!(seen.contains("ABC"), "{seen:?}");
    assert!(!seen.contains("]52"), "{seen:?}");
}

/// Take inotify instances until the kernel refuses, write how many into `held`, then hold them
/// until `go` appears (at most a minute). Run in the jail, and outside it as the control.
const TAKE_INOTIFY: &str = r#"
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 100000:
    fd = libc.inotify_init()
    if fd < 0:
        break
    fds.append(fd)
held = sys.argv[1] if len(sys.argv) > 1 else None
if held is None:
    print("TOOK", len(fds))
    sys.exit(0)
with open(held + ".tmp", "w") as f:
    f.write(str(len(fds)))
os.rename(held + ".tmp", held)
for _ in range(600):
    if os.path.exists("go"):
        break
    time.sleep(0.1)
print("END")
"#;

/// The jail takes every inotify instance it can: it gets a bounded share of the user's, and
/// while it holds them a host program of the same user (an editor, a file watcher) still makes
/// one. Control: the same program in a user namespace of its own, without corral's bound,
/// takes more than the jail's share.
#[test]
fn the_jail_cannot_take_all_of_the_users_inotify_instances() {
    let w = World::new();
    let host_max: u64 = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    if !Path::new("/proc/sys/user/max_inotify_instances").exists() {
        eprintln!("skipped: this kernel keeps no inotify count per user namespace");
        return;
    }
    write(&w.project.join("take.py"), TAKE_INOTIFY);
    let jail = w.sh_command("none", "python3 take.py held");
    let run = std::thread::spawn(move || jail_support::run(jail));
    let held = w.project.join("held");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !held.exists() && std::time::Instant::now() < deadline && !run.is_finished() {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let Ok(taken) = std::fs::read_to_string(&held) else {
        panic!("the jail wrote no count: {}", run.join().unwrap().both());
    };
    let taken: u64 = taken.trim().parse().unwrap();
    let host = std::process::Command::new("python3")
        .args([
            "-c",
            "import ctypes; print('HOST-FD', ctypes.CDLL(None).inotify_init())",
        ])
        .output()
        .unwrap();
    write(&w.project.join("go"), "");
    let out = run.join().unwrap();
    ran(&out, "END");
    let share = (host_max / 4).max(8).min(host_max);
    assert!(
        taken <= share,
        "the jail took {taken} of the user's {host_max} inotify instances (its share: {share})"
    );
    let host = String::from_utf8_lossy(&host.stdout).to_string();
    let fd: i64 = host
        .trim()
        .strip_prefix("HOST-FD ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{host}"));
    assert!(
        fd >= 0,
        "a host program could not make an inotify instance while the jail held its {taken}"
    );
    // Control: without corral's bound a process of its own user namespace takes more.
    let control = std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "python3", "-c", TAKE_INOTIFY])
        .output()
        .unwrap();
    let control = String::from_utf8_lossy(&control.stdout).to_string();
    let unbounded: u64 = control
        .trim()
        .strip_prefix("TOOK ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("control: {control}"));
    assert!(
        unbounded > taken,
        "control: unbounded, a user namespace took {unbounded}, the jail {taken}"
    );
}
