//! The seccomp filter, installed for real in a process of its own, then attacked.
//!
//! Each test installs corral's filter (`corral_sandbox::seccomp::install`) in a re-executed
//! copy of this test binary and tries what the filter must stop; where the attack would work
//! without the filter, it first shows that (the control), so the EPERM is the filter's doing.

mod harden_support;

use std::process::Command;

use corral_sandbox::seccomp;
use harden_support::{errno, have, is_root, isolated, scratch_dir};

fn install() {
    seccomp::install().expect("installing corral's seccomp filter");
}

#[test]
fn nested_user_namespaces_are_denied() {
    isolated("nested_user_namespaces_are_denied", || {
        // Control: without the filter, `unshare -U` works on this host (skip the control if the
        // host forbids user namespaces altogether; the filter must deny them anyway).
        let control = Command::new("unshare").args(["-U", "true"]).status();
        let control_ok = control.is_ok_and(|s| s.success());
        eprintln!("control: unshare -U true without the filter succeeded: {control_ok}");

        install();
        // SAFETY: unshare with a flag constant.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWUSER) };
        assert_eq!((rc, errno()), (-1, libc::EPERM), "unshare(CLONE_NEWUSER)");
        // clone with CLONE_NEWUSER, the raw syscall (flags in a register).
        // SAFETY: a clone that the filter refuses; if it were allowed, the child exits at once.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_clone,
                (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            )
        };
        if rc == 0 {
            // SAFETY: we are the child of an unexpectedly allowed clone.
            unsafe { libc::_exit(0) };
        }
        assert_eq!((rc, errno()), (-1, libc::EPERM), "clone(CLONE_NEWUSER)");
        // clone3 is ENOSYS, so libc falls back to clone.
        // SAFETY: clone3 with a null argument; the filter answers before the kernel reads it.
        let rc = unsafe { libc::syscall(libc::SYS_clone3, 0usize, 0usize) };
        assert_eq!((rc, errno()), (-1, libc::ENOSYS), "clone3");
        // Other namespaces too.
        // SAFETY: unshare with flag constants.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWNET) };
        assert_eq!(
            (rc, errno()),
            (-1, libc::EPERM),
            "unshare(CLONE_NEWNS|CLONE_NEWNET)"
        );
        // The unshare(1) program fails as well, through the same filter inherited across exec.
        let out = Command::new("unshare")
            .args(["-U", "true"])
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "unshare -U inside the filter succeeded"
        );
    });
}

#[test]
fn mounts_are_denied_after_set_up() {
    isolated("mounts_are_denied_after_set_up", || {
        // Get mount rights the way the jail has them (a user and mount namespace of our own),
        // show that a mount works, then install the filter and try again.
        // SAFETY: unshare with flag constants, in this single-purpose process.
        if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) } != 0 {
            if is_root() {
                // SAFETY: as above.
                assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNS) }, 0);
            } else {
                eprintln!("skipping: no user namespaces for an unprivileged user on this host");
                return;
            }
        }
        let dir = scratch_dir("mnt");
        let target = dir.path().to_path_buf();
        use nix::mount::{MntFlags, MsFlags, mount, umount2};
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .expect("making / private");
        mount(
            Some("tmpfs"),
            &target,
            Some("tmpfs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .expect("control: mounting a tmpfs before the filter");
        umount2(&target, MntFlags::empty()).expect("control: unmounting");

        install();
        let e = mount(
            Some("tmpfs"),
            &target,
            Some("tmpfs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .unwrap_err();
        assert_eq!(e, nix::errno::Errno::EPERM, "mount tmpfs");
        let e = mount(
            Some("/"),
            &target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .unwrap_err();
        assert_eq!(e, nix::errno::Errno::EPERM, "bind mount");
        let e = umount2("/proc", MntFlags::MNT_DETACH).unwrap_err();
        assert_eq!(e, nix::errno::Errno::EPERM, "umount2");
        // SAFETY: pivot_root and open_tree with valid strings; both are denied before use.
        let rc = unsafe { libc::syscall(libc::SYS_pivot_root, c"/".as_ptr(), c"/".as_ptr()) };
        assert_eq!((rc, errno()), (-1, libc::EPERM), "pivot_root");
        // SAFETY: as above.
        let rc = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c"/".as_ptr(), 1u32) };
        assert_eq!((rc, errno()), (-1, libc::EPERM), "open_tree");
        // SAFETY: as above.
        let rc = unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), 0u32) };
        assert_eq!((rc, errno()), (-1, libc::EPERM), "fsopen");
    });
}

#[test]
fn tiocsti_is_denied_on_a_pty() {
    isolated("tiocsti_is_denied_on_a_pty", || {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        use std::os::fd::AsRawFd;
        let slave = pty.slave.as_raw_fd();
        // Closing the pty at the end hangs up its session: that is us, so ignore SIGHUP.
        // SAFETY: setting a signal disposition to SIG_IGN.
        unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
        // Make the pty our controlling terminal, so TIOCSTI works without privilege too.
        nix::unistd::setsid().expect("setsid");
        // SAFETY: ioctl on a pty fd we own.
        assert_eq!(
            unsafe { libc::ioctl(slave, libc::TIOCSCTTY, 0) },
            0,
            "TIOCSCTTY"
        );
        let byte = b'x';
        let legacy = std::fs::read_to_string("/proc/sys/dev/tty/legacy_tiocsti").ok();
        if legacy.as_deref().map(str::trim) != Some("0") {
            // Control: the injection works without the filter.
            // SAFETY: TIOCSTI reads one byte from the pointer we pass.
            let rc = unsafe { libc::ioctl(slave, libc::TIOCSTI, &byte as *const u8) };
            assert_eq!(
                rc,
                0,
                "control: TIOCSTI without the filter failed: {}",
                errno()
            );
        } else {
            eprintln!("control skipped: dev.tty.legacy_tiocsti = 0 on this host");
        }

        install();
        // SAFETY: as above.
        let rc = unsafe { libc::ioctl(slave, libc::TIOCSTI, &byte as *const u8) };
        assert_eq!((rc, errno()), (-1, libc::EPERM), "TIOCSTI");
        // Junk in the high half of the request: the kernel ignores it, so must the filter.
        // SAFETY: as above, through the raw syscall so the full 64-bit request reaches the kernel.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_ioctl,
                slave,
                0xdead_0000_0000_5412u64,
                &byte as *const u8,
            )
        };
        assert_eq!(
            (rc, errno()),
            (-1, libc::EPERM),
            "TIOCSTI with high bits set"
        );
        // SAFETY: TIOCLINUX with a one-byte subcode buffer.
        let sub = [12u8; 1];
        let rc = unsafe { libc::ioctl(slave, libc::TIOCLINUX, sub.as_ptr()) };
        assert_eq!((rc, errno()), (-1, libc::EPERM), "TIOCLINUX");
        // Switching the line discipline (N_HDLC = 13).
        let ldisc: libc::c_int = 13;
        // SAFETY: TIOCSETD reads one int.
        let rc = unsafe { libc::ioctl(slave, libc::TIOCSETD, &ldisc) };
        assert_eq!((rc, errno()), (-1, libc::EPERM), "TIOCSETD");
        // Ordinary terminal ioctls still work.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: TIOCGWINSZ writes one winsize.
        assert_eq!(
            unsafe { libc::ioctl(slave, libc::TIOCGWINSZ, &mut ws) },
            0,
            "TIOCGWINSZ"
        );
    });
}

#[test]
fn kernel_attack_surface_is_denied() {
    isolated("kernel_attack_surface_is_denied", || {
        // Controls where the call works unprivileged or as root here (each fd closed at once).
        let try_uffd = || unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) };
        let mut params = [0u8; 120]; // struct io_uring_params
        let mut try_uring =
            || unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
        let try_keyctl = || unsafe {
            // KEYCTL_GET_KEYRING_ID (0) of the session keyring (-3), no create.
            libc::syscall(libc::SYS_keyctl, 0, -3i32, 0)
        };
        for (name, rc) in [
            ("userfaultfd", try_uffd()),
            ("io_uring_setup", try_uring()),
            ("keyctl", try_keyctl()),
        ] {
            eprintln!(
                "control: {name} without the filter returned {rc} (errno {})",
                errno()
            );
            if rc > 2 && name != "keyctl" {
                // SAFETY: closing an fd we just got.
                unsafe { libc::close(rc as i32) };
            }
        }

        install();
        for (name, rc) in [
            ("userfaultfd", try_uffd()),
            ("io_uring_setup", try_uring()),
            ("keyctl", try_keyctl()),
            // SAFETY (all below): raw syscalls the filter refuses before the kernel reads any
            // argument; the arguments are still valid or null.
            ("bpf", unsafe {
                libc::syscall(libc::SYS_bpf, 0, std::ptr::null::<u8>(), 0)
            }),
            ("perf_event_open", unsafe {
                libc::syscall(
                    libc::SYS_perf_event_open,
                    std::ptr::null::<u8>(),
                    0,
                    -1,
                    -1,
                    0,
                )
            }),
            ("add_key", unsafe {
                libc::syscall(
                    libc::SYS_add_key,
                    c"user".as_ptr(),
                    c"k".as_ptr(),
                    c"v".as_ptr(),
                    1,
                    -3,
                )
            }),
            ("kexec_load", unsafe {
                libc::syscall(libc::SYS_kexec_load, 0, 0, 0, 0)
            }),
            ("init_module", unsafe {
                libc::syscall(libc::SYS_init_module, 0, 0, c"".as_ptr())
            }),
            ("setns", unsafe { libc::syscall(libc::SYS_setns, 0, 0) }),
            ("open_by_handle_at", unsafe {
                libc::syscall(libc::SYS_open_by_handle_at, 0, 0, 0)
            }),
            ("acct", unsafe { libc::syscall(libc::SYS_acct, 0) }),
            ("swapoff", unsafe {
                libc::syscall(libc::SYS_swapoff, c"/x".as_ptr())
            }),
            ("clock_settime", unsafe {
                libc::syscall(libc::SYS_clock_settime, 0, 0)
            }),
            ("reboot", unsafe {
                libc::syscall(libc::SYS_reboot, 0, 0, 0, 0)
            }),
        ] {
            assert_eq!(
                (rc, errno()),
                (-1, libc::EPERM),
                "{name} was not denied with EPERM"
            );
        }
        // personality: querying works, disabling ASLR does not.
        // SAFETY: personality with constants.
        assert_ne!(unsafe { libc::personality(0xffff_ffff) }, -1);
        // SAFETY: as above.
        let rc = unsafe { libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong) };
        assert_eq!(
            (rc, errno()),
            (-1, libc::EPERM),
            "personality(ADDR_NO_RANDOMIZE)"
        );
    });
}

#[test]
fn ptrace_of_the_parent_is_denied() {
    isolated("ptrace_of_the_parent_is_denied", || {
        let parent = nix::unistd::getppid();
        // Control on a bystander (not the parent, which we must not stop): a process we did
        // not start... as root, or where Yama allows it, PTRACE_SEIZE works without the filter.
        let mut bystander = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = bystander.id() as libc::pid_t;
        // SAFETY: PTRACE_SEIZE/DETACH on our own child, no stop is requested.
        let seized = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) } == 0;
        eprintln!("control: PTRACE_SEIZE of a process without the filter worked: {seized}");
        if seized {
            // SAFETY: as above.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) };
        }

        install();
        for target in [parent.as_raw(), pid] {
            // SAFETY: ptrace requests the filter refuses.
            let rc = unsafe { libc::ptrace(libc::PTRACE_SEIZE, target, 0, 0) };
            assert_eq!((rc, errno()), (-1, libc::EPERM), "PTRACE_SEIZE {target}");
            // SAFETY: as above.
            let rc = unsafe { libc::ptrace(libc::PTRACE_ATTACH, target, 0, 0) };
            assert_eq!((rc, errno()), (-1, libc::EPERM), "PTRACE_ATTACH {target}");
        }
        // Reading the parent's memory directly.
        let mut buf = [0u8; 8];
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: 0x400000 as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: process_vm_readv with one valid local iovec; the filter refuses it.
        let rc = unsafe { libc::process_vm_readv(parent.as_raw(), &local, 1, &remote, 1, 0) };
        assert_eq!(
            (rc, errno()),
            (-1, libc::EPERM),
            "process_vm_readv of the parent"
        );
        bystander.kill().unwrap();
        bystander.wait().unwrap();
    });
}

#[test]
fn socket_families_outside_the_design_are_denied() {
    isolated("socket_families_outside_the_design_are_denied", || {
        install();
        use std::os::fd::{FromRawFd, OwnedFd};
        let sock = |fam: i32, ty: i32, proto: i32| {
            // SAFETY: socket() with constants; a returned fd is owned and closed at once.
            let fd = unsafe { libc::socket(fam, ty | libc::SOCK_CLOEXEC, proto) };
            if fd >= 0 {
                // SAFETY: fd was just returned to us.
                drop(unsafe { OwnedFd::from_raw_fd(fd) });
                Ok(())
            } else {
                Err(errno())
            }
        };
        assert_eq!(sock(libc::AF_UNIX, libc::SOCK_STREAM, 0), Ok(()));
        assert_eq!(sock(libc::AF_INET, libc::SOCK_STREAM, 0), Ok(()));
        assert_eq!(sock(libc::AF_INET6, libc::SOCK_DGRAM, 0), Ok(()));
        assert_eq!(
            sock(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE),
            Ok(())
        );
        let eaf = Err(libc::EAFNOSUPPORT);
        assert_eq!(
            sock(
                libc::AF_NETLINK,
                libc::SOCK_RAW,
                libc::NETLINK_KOBJECT_UEVENT
            ),
            eaf
        );
        assert_eq!(sock(libc::AF_PACKET, libc::SOCK_RAW, 0), eaf);
        assert_eq!(sock(libc::AF_VSOCK, libc::SOCK_STREAM, 0), eaf);
        assert_eq!(sock(libc::AF_ALG, libc::SOCK_SEQPACKET, 0), eaf);
        // Loopback TCP still works end to end.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        std::net::TcpStream::connect(a).expect("loopback connect under the filter");
    });
}

#[test]
fn ordinary_programs_still_work() {
    isolated("ordinary_programs_still_work", || {
        install();
        let run = |prog: &str, args: &[&str], dir: &std::path::Path| {
            let out = Command::new(prog)
                .args(args)
                .current_dir(dir)
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
                .output()
                .unwrap_or_else(|e| panic!("spawning {prog} under the filter: {e}"));
            assert!(
                out.status.success(),
                "{prog} {args:?} failed under the filter: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let dir = scratch_dir("progs");
        let d = dir.path();
        assert_eq!(
            run(
                "sh",
                &["-c", "echo a | tr a b; (sleep 0 &); wait; echo $((6*7))"],
                d
            ),
            "b\n42\n"
        );
        run("git", &["init", "-q", "."], d);
        std::fs::write(d.join("f.txt"), "hello\n").unwrap();
        run("git", &["add", "f.txt"], d);
        run("git", &["commit", "-q", "-m", "first"], d);
        assert_eq!(run("git", &["log", "--format=%s"], d), "first\n");
        assert_eq!(
            run(
                "python3",
                &[
                    "-c",
                    "import subprocess, threading, socket; t = threading.Thread(target=print, args=('t',)); t.start(); t.join(); print(subprocess.run(['true']).returncode)"
                ],
                d
            ),
            "t\n0\n"
        );
        if have("node") {
            assert_eq!(
                run(
                    "node",
                    &[
                        "-e",
                        "require('child_process').execSync('true'); console.log(1+1)"
                    ],
                    d
                ),
                "2\n"
            );
        } else {
            eprintln!("node not installed: skipped the node check");
        }
    });
}

/// A syscall through the 32-bit entry point (`int 0x80`) is numbered from another table, so a
/// filter that only knows x86_64 numbers would be bypassed: corral's kills the process.
#[cfg(target_arch = "x86_64")]
#[test]
fn foreign_architecture_syscalls_kill_the_process() {
    isolated("foreign_architecture_syscalls_kill_the_process", || {
        let prog = seccomp::build_filter().unwrap();
        // Fork a child that (optionally) installs the filter, then calls i386 getpid (20)
        // through int 0x80 and exits 0; return how it ended.
        let run = |filtered: bool| -> i32 {
            // SAFETY: the child only makes raw syscalls and exits.
            match unsafe { libc::fork() } {
                0 => {
                    if filtered && seccomp::install_program(&prog).is_err() {
                        // SAFETY: leaving the forked child.
                        unsafe { libc::_exit(3) };
                    }
                    let mut ret: i64 = 20;
                    // SAFETY: the i386 getpid syscall takes no arguments and changes nothing.
                    unsafe { std::arch::asm!("int 0x80", inout("rax") ret) };
                    // SAFETY: leaving the forked child.
                    unsafe { libc::_exit(if ret > 0 { 0 } else { 4 }) };
                }
                pid => {
                    let mut status = 0;
                    // SAFETY: waiting for our own child.
                    unsafe { libc::waitpid(pid, &mut status, 0) };
                    status
                }
            }
        };
        let control = run(false);
        if !(libc::WIFEXITED(control) && libc::WEXITSTATUS(control) == 0) {
            eprintln!(
                "control: int 0x80 does not work here (no IA32 emulation); checking the filter anyway"
            );
        }
        let status = run(true);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS,
            "an i386 syscall under the filter was not killed by SIGSYS (status {status:#x})"
        );
        // x32 syscall numbers (bit 30) get ENOSYS.
        install();
        // SAFETY: getpid through the x32 numbering; denied before the kernel looks.
        let rc = unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) };
        assert_eq!((rc, errno()), (-1, libc::ENOSYS), "x32 getpid");
    });
}

#[test]
fn set_id_bits_are_denied_on_every_path_that_sets_a_mode() {
    isolated(
        "set_id_bits_are_denied_on_every_path_that_sets_a_mode",
        || {
            use std::ffi::CString;
            use std::os::unix::fs::PermissionsExt;
            let dir = scratch_dir("seccomp-setid");
            let mode_of = |p: &std::path::Path| {
                std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
            };
            let c = |p: &std::path::Path| CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            let file = dir.path().join("prog");
            std::fs::write(&file, "#!/bin/sh\n").unwrap();
            // Control: without the filter, the owner of a file can make it set-user-ID.
            // SAFETY: chmod with a NUL-terminated path.
            let rc = unsafe { libc::chmod(c(&file).as_ptr(), 0o4755) };
            assert_eq!(rc, 0, "control: chmod 4755 without the filter");
            assert_eq!(mode_of(&file), 0o4755);
            // SAFETY: as above.
            assert_eq!(unsafe { libc::chmod(c(&file).as_ptr(), 0o755) }, 0);

            install();
            for mode in [0o4755, 0o2755, 0o6755] {
                // SAFETY: chmod with a NUL-terminated path.
                let rc = unsafe { libc::chmod(c(&file).as_ptr(), mode) };
                assert_eq!((rc, errno()), (-1, libc::EPERM), "chmod {mode:o}");
                // SAFETY: fchmodat with AT_FDCWD and a NUL-terminated path.
                let rc = unsafe { libc::fchmodat(libc::AT_FDCWD, c(&file).as_ptr(), mode, 0) };
                assert_eq!((rc, errno()), (-1, libc::EPERM), "fchmodat {mode:o}");
                let f = std::fs::File::open(&file).unwrap();
                // SAFETY: fchmod on an open descriptor.
                let rc = unsafe { libc::fchmod(std::os::fd::AsRawFd::as_raw_fd(&f), mode) };
                assert_eq!((rc, errno()), (-1, libc::EPERM), "fchmod {mode:o}");
                // fchmodat2 (Linux 6.6): denied by the filter before the kernel looks.
                // SAFETY: raw fchmodat2 with a NUL-terminated path.
                let rc = unsafe { libc::syscall(452, libc::AT_FDCWD, c(&file).as_ptr(), mode, 0) };
                assert_eq!((rc, errno()), (-1, libc::EPERM), "fchmodat2 {mode:o}");
                // Creating a file with the bits in its mode.
                let new = dir.path().join(format!("new-{mode:o}"));
                // SAFETY: open with a NUL-terminated path, flags and a mode.
                let rc =
                    unsafe { libc::open(c(&new).as_ptr(), libc::O_CREAT | libc::O_WRONLY, mode) };
                assert_eq!((rc, errno()), (-1, libc::EPERM), "open(O_CREAT, {mode:o})");
                // SAFETY: as above.
                let rc = unsafe { libc::creat(c(&new).as_ptr(), mode) };
                assert_eq!((rc, errno()), (-1, libc::EPERM), "creat {mode:o}");
                // SAFETY: mknod of a regular file with a NUL-terminated path.
                let rc = unsafe { libc::mknod(c(&new).as_ptr(), libc::S_IFREG | mode, 0) };
                assert_eq!((rc, errno()), (-1, libc::EPERM), "mknod {mode:o}");
                assert!(!new.exists(), "{} was created", new.display());
            }
            // openat2 is ENOSYS (libc falls back to openat).
            // SAFETY: openat2 with null pointers; the filter answers before the kernel reads them.
            let rc =
                unsafe { libc::syscall(libc::SYS_openat2, libc::AT_FDCWD, 0usize, 0usize, 0usize) };
            assert_eq!((rc, errno()), (-1, libc::ENOSYS), "openat2");
            assert_eq!(mode_of(&file), 0o755);
            // Ordinary modes still work, and so do programs: chmod(1), install(1).
            // SAFETY: chmod with a NUL-terminated path.
            assert_eq!(unsafe { libc::chmod(c(&file).as_ptr(), 0o700) }, 0);
            let st = Command::new("chmod")
                .arg("u+s")
                .arg(&file)
                .output()
                .unwrap();
            assert!(!st.status.success(), "chmod u+s succeeded under the filter");
            let copy = dir.path().join("copy");
            let st = Command::new("install")
                .args(["-m", "0755"])
                .arg(&file)
                .arg(&copy)
                .status()
                .unwrap();
            assert!(st.success(), "install -m 0755 failed under the filter");
            assert_eq!(mode_of(&copy), 0o755);
            assert_eq!(mode_of(&file), 0o700);
        },
    );
}
