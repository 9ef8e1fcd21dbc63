//! Landlock, applied for real in a process of its own from a Plan, then attacked.
//!
//! Without pivot_root the Plan's in-jail paths are host paths here: the project, a read-only
//! bind and a secret all live under the target directory (not under /tmp, which the rules
//! grant), so the test shows the rules themselves doing the work.
//!
//! Landlock restricts the calling thread (and what it starts), so the restricted part runs on
//! a thread of its own and the test's main thread removes the temporary directories after it:
//! the restricted thread may not.

mod harden_support;

use std::io::ErrorKind;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::Command;

use corral_policy::plan::{Access, Mount, MountKind, Plan};
use corral_sandbox::landlock::{self, Enforcement};
use harden_support::{isolated, scratch_dir};

/// Run `f` on a thread of its own (the one Landlock restricts) and wait for it.
fn restricted(f: impl FnOnce() + Send) {
    std::thread::scope(|s| {
        if let Err(panic) = s.spawn(f).join() {
            std::panic::resume_unwind(panic);
        }
    });
}

#[test]
fn landlock_confines_reads_and_writes_to_the_plan() {
    isolated("landlock_confines_reads_and_writes_to_the_plan", || {
        if landlock::kernel_abi().is_none() {
            eprintln!("skipping: this kernel has no Landlock");
            return;
        }
        let project = scratch_dir("proj");
        let ro = scratch_dir("ro");
        let outside = scratch_dir("secret");
        let home = scratch_dir("home");
        let secret = outside.path().join("id_ed25519");
        std::fs::write(&secret, "PRIVATE KEY").unwrap();
        std::fs::write(ro.path().join("config"), "read me").unwrap();
        std::fs::write(project.path().join("main.rs"), "fn main() {}").unwrap();
        // Control: everything is reachable before.
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "PRIVATE KEY");

        let mut plan = Plan::minimal(project.path(), home.path(), vec!["true".into()]);
        plan.mounts.push(Mount {
            source: ro.path().to_path_buf(),
            target: ro.path().to_path_buf(),
            kind: MountKind::Bind(Access::Ro),
            optional: false,
        });
        restricted(|| {
            let status = landlock::restrict(&plan).expect("landlock::restrict");
            assert_ne!(status.enforcement, Enforcement::None, "{status:?}");
            // What the parent predicts is what the child got.
            let expected = landlock::expected();
            assert_eq!(
                (expected.kernel_abi, expected.enforcement, expected.scoped),
                (status.kernel_abi, status.enforcement, status.scoped)
            );

            // Reading outside the Plan fails, directly and through a child process.
            let e = std::fs::read_to_string(&secret).unwrap_err();
            assert_eq!(
                e.kind(),
                ErrorKind::PermissionDenied,
                "reading {}",
                secret.display()
            );
            // Listing is allowed from / down (names only; in a jail the root holds nothing but
            // the Plan's mount points), so the name shows but the content stays unreadable.
            let names: Vec<_> = std::fs::read_dir(outside.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, ["id_ed25519"]);
            let e = std::fs::File::open(&secret).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied);
            let out = Command::new("cat").arg(&secret).output().unwrap();
            assert!(
                !out.status.success() && out.stdout.is_empty(),
                "cat of the secret worked"
            );
            // Writing outside fails too.
            let e = std::fs::write(outside.path().join("new"), "x").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied);
            assert!(!outside.path().join("new").exists());

            // The read-only bind reads but does not write.
            assert_eq!(
                std::fs::read_to_string(ro.path().join("config")).unwrap(),
                "read me"
            );
            let e = std::fs::write(ro.path().join("config"), "changed").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied);
            let e = std::fs::write(ro.path().join("new"), "x").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied);
            // System directories are read-only.
            assert!(std::fs::read_to_string("/etc/passwd").is_ok());
            let e = std::fs::write("/usr/corral-landlock-probe", "x").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::PermissionDenied);

            // The project, home and /tmp are read-write; programs still run.
            std::fs::write(project.path().join("new.rs"), "// new").unwrap();
            std::fs::create_dir(project.path().join("sub")).unwrap();
            std::fs::rename(
                project.path().join("new.rs"),
                project.path().join("sub/new.rs"),
            )
            .unwrap();
            std::fs::write(home.path().join(".bashrc"), "").unwrap();
            let t = tempfile::NamedTempFile::new_in("/tmp").unwrap();
            drop(t);
            let out = Command::new("sh")
                .args(["-c", "cat main.rs && ls sub"])
                .current_dir(project.path())
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), "fn main() {}new.rs\n");
            eprintln!("landlock status: {status:?}");
        });
    });
}

#[test]
fn landlock_scopes_signals_and_abstract_sockets() {
    isolated("landlock_scopes_signals_and_abstract_sockets", || {
        if landlock::kernel_abi().is_none_or(|v| v < 6) {
            eprintln!("skipping: the kernel's Landlock ABI is below 6 (no scopes)");
            return;
        }
        // A process outside the domain, and an abstract socket made outside it.
        // (It exits when its stdin closes: once we are restricted we may not signal it.)
        let mut outsider = Command::new("sh")
            .args(["-c", "read x"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let opid = nix::unistd::Pid::from_raw(outsider.id() as i32);
        let name = format!("corral-test-{}", harden_support::unique("abs"));
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixListener::bind_addr(&addr).unwrap();
        // Controls.
        nix::sys::signal::kill(opid, None).expect("control: signal 0 to the outsider");
        UnixStream::connect_addr(&addr).expect("control: connecting to the abstract socket");

        let home = scratch_dir("home");
        let plan = Plan::minimal(&PathBuf::from("/nonexistent-project"), home.path(), vec![]);
        restricted(|| {
            let status = landlock::restrict(&plan).expect("landlock::restrict");
            assert!(status.scoped, "{status:?}");

            let e = nix::sys::signal::kill(opid, nix::sys::signal::Signal::SIGTERM).unwrap_err();
            assert_eq!(
                e,
                nix::errno::Errno::EPERM,
                "signalling a process outside the jail"
            );
            let e = UnixStream::connect_addr(&addr).unwrap_err();
            assert_eq!(
                e.raw_os_error(),
                Some(libc::EPERM),
                "connecting to an outside abstract socket"
            );
            // Our own children are inside the domain: signalling them works.
            let mut inner = Command::new("sleep").arg("30").spawn().unwrap();
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(inner.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            )
            .expect("signalling a process inside the domain");
            inner.wait().unwrap();
        });
        drop(listener);
        drop(outsider.stdin.take());
        outsider.wait().unwrap();
    });
}
