//! Dropping capabilities for real: after `caps::drop_all`, the process and what it execs hold
//! none, have no_new_privs, and an operation that needs a capability fails.

mod harden_support;

use std::process::Command;

use corral_sandbox::caps;
use harden_support::{is_root, isolated, scratch_dir};

fn status_field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("no {name} in /proc/self/status"))
}

#[test]
fn drop_all_leaves_no_capability() {
    isolated("drop_all_leaves_no_capability", || {
        // Hold capabilities the way the jail's child does: in a user namespace of our own (or
        // as root on the host).
        // SAFETY: unshare with a flag constant, in this single-purpose process.
        let in_userns = unsafe { libc::unshare(libc::CLONE_NEWUSER) } == 0;
        if !in_userns && !is_root() {
            eprintln!("skipping: no user namespaces and not root, so no capabilities to drop");
            return;
        }
        let before = caps::current().unwrap();
        assert_ne!(
            before.effective, 0,
            "control: no capabilities held before the drop"
        );
        let dir = scratch_dir("caps");
        let f = dir.path().join("f");
        std::fs::write(&f, "x").unwrap();

        // Control: CAP_SYS_ADMIN lets us make a mount namespace.
        // SAFETY: unshare with a flag constant.
        assert_eq!(
            unsafe { libc::unshare(libc::CLONE_NEWNS) },
            0,
            "control: unshare(CLONE_NEWNS)"
        );

        caps::drop_all().expect("drop_all");
        let after = caps::current().unwrap();
        assert_eq!(
            (after.effective, after.permitted, after.inheritable),
            (0, 0, 0)
        );
        // (/proc/thread-self: capabilities are per thread, and libtest runs us on a thread.)
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        for field in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
            assert_eq!(status_field(&status, field), "0000000000000000", "{field}");
        }
        assert_eq!(status_field(&status, "NoNewPrivs:"), "1");
        // An exec'd program (even uid 0 inside) gets nothing back.
        let out = Command::new("grep")
            .args(["-E", "^Cap(Prm|Eff|Bnd|Amb)", "/proc/self/status"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text.lines().count(), 4, "{text}");
        assert!(
            text.lines().all(|l| l.ends_with("0000000000000000")),
            "{text}"
        );
        // The attack: something that needs CAP_CHOWN / CAP_FOWNER / CAP_SYS_ADMIN.
        if is_root() && !in_userns {
            let e =
                nix::unistd::chown(&f, Some(nix::unistd::Uid::from_raw(12345)), None).unwrap_err();
            assert_eq!(e, nix::errno::Errno::EPERM, "chown to another uid");
        }
        // SAFETY: unshare with a flag constant; refused without CAP_SYS_ADMIN.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNS) };
        assert_eq!(
            (rc, harden_support::errno()),
            (-1, libc::EPERM),
            "unshare(CLONE_NEWNS) without capabilities"
        );
    });
}
