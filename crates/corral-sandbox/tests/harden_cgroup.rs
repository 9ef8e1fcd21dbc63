//! cgroup limits for real: a process that exceeds pids.max cannot fork, one that allocates
//! beyond the memory limit is OOM-killed, both are reported, and the cgroup is gone afterwards.
//! These need a cgroup this user can create (root with cgroup v1 here, or a delegated v2
//! subtree); without one they skip, except the refusal test, which needs exactly that.

mod harden_support;

use std::io::Write;
use std::process::{Child, Command, Stdio};

use corral_policy::plan::{Enforce, Limits};
use corral_sandbox::cgroup::{self, JailCgroup};
use harden_support::{is_root, isolated_with, unique};

fn limits(memory: Option<u64>, pids: Option<u64>, cpus: Option<f64>, enforce: Enforce) -> Limits {
    Limits {
        memory,
        cpus,
        pids,
        enforce,
        built_in: Default::default(),
    }
}

/// Create a cgroup, or explain why this host cannot (and the test skips).
fn cgroup_or_skip(l: &Limits) -> Option<JailCgroup> {
    match cgroup::setup(&unique("test"), l) {
        Ok(s) if s.cgroup.is_some() && s.fallback.memory.is_none() && s.fallback.pids.is_none() => {
            s.cgroup
        }
        Ok(_) => {
            eprintln!("skipping: no cgroup can enforce these limits for this user");
            None
        }
        Err(e) => {
            eprintln!(
                "skipping: this user cannot create a limited cgroup here: {}",
                e.to_string().lines().next().unwrap_or("")
            );
            None
        }
    }
}

/// Start `sh -c SCRIPT` held at `read go`, move it into the cgroup, then let it go.
fn run_in(cg: &JailCgroup, script: &str) -> Child {
    let mut child = Command::new("sh")
        .args(["-c", &format!("read go; {script}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    cg.add_process(child.id()).expect("add_process");
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    child
}

#[test]
fn pids_limit_stops_forks_and_is_reported() {
    let Some(cg) = cgroup_or_skip(&limits(None, Some(8), None, Enforce::Strict)) else {
        return;
    };
    let paths: Vec<_> = cg.paths().iter().map(|p| p.to_path_buf()).collect();
    // 20 background sleeps: the 8th process in the cgroup (sh itself counts) cannot fork.
    let child = run_in(
        &cg,
        "i=0; while [ $i -lt 20 ]; do sleep 30 & i=$((i+1)); done; echo spawned; wait",
    );
    // Wait until the shell gave up forking (it prints an error and exits or stops).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while cg.events().pids_limit_hits == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let ev = cg.events();
    assert!(
        ev.pids_limit_hits > 0,
        "no pids.events max recorded: {ev:?}"
    );
    assert!(
        cg.processes().len() <= 8,
        "more than pids.max processes: {:?}",
        cg.processes()
    );
    assert!(
        ev.summary().iter().any(|l| l.contains("process limit")),
        "{:?}",
        ev.summary()
    );
    // Removing the cgroup kills the remaining sleeps and the shell.
    cg.remove().expect("removing the cgroup");
    let out = child.wait_with_output().unwrap();
    assert!(
        !out.status.success() || String::from_utf8_lossy(&out.stderr).contains("fork"),
        "{out:?}"
    );
    for p in &paths {
        assert!(!p.exists(), "{} still exists", p.display());
    }
}

#[test]
fn memory_limit_oom_kills_and_is_reported() {
    let Some(cg) = cgroup_or_skip(&limits(Some(64 << 20), None, None, Enforce::Strict)) else {
        return;
    };
    let paths: Vec<_> = cg.paths().iter().map(|p| p.to_path_buf()).collect();
    // 512 MiB of touched memory, far beyond the 64 MiB limit.
    let child = run_in(
        &cg,
        "exec python3 -c \"b = bytearray(b'x') * (512 << 20); print(len(b))\"",
    );
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "the allocation was not OOM-killed: {out:?}"
    );
    let ev = cg.events();
    assert!(ev.oom_kills >= 1, "no OOM kill recorded: {ev:?}");
    assert!(
        ev.summary().iter().any(|l| l.contains("out of memory")),
        "{:?}",
        ev.summary()
    );
    drop(cg);
    for p in &paths {
        assert!(!p.exists(), "{} still exists after drop", p.display());
    }
}

#[test]
fn memory_and_cpu_limits_are_written() {
    let l = limits(Some(100 << 20), Some(50), Some(0.5), Enforce::Strict);
    let Some(cg) = cgroup_or_skip(&l) else {
        return;
    };
    assert_eq!(
        cg.enforced(),
        cgroup::Enforced {
            memory: true,
            cpus: true,
            pids: true
        }
    );
    let read = |name: &str| {
        cg.paths()
            .iter()
            .find_map(|p| std::fs::read_to_string(p.join(name)).ok())
            .map(|s| s.trim().to_string())
    };
    match cg.version() {
        cgroup::Version::V1 => {
            assert_eq!(read("memory.limit_in_bytes").as_deref(), Some("104857600"));
            assert_eq!(read("pids.max").as_deref(), Some("50"));
            assert_eq!(read("cpu.cfs_quota_us").as_deref(), Some("50000"));
            assert_eq!(read("cpu.cfs_period_us").as_deref(), Some("100000"));
        }
        cgroup::Version::V2 => {
            assert_eq!(read("memory.max").as_deref(), Some("104857600"));
            assert_eq!(read("pids.max").as_deref(), Some("50"));
            assert_eq!(read("cpu.max").as_deref(), Some("50000 100000"));
        }
    }
}

#[test]
fn parallel_cgroups_do_not_collide() {
    let l = limits(Some(256 << 20), Some(64), None, Enforce::Strict);
    let Some(a) = cgroup_or_skip(&l) else {
        return;
    };
    let b = cgroup_or_skip(&l).expect("a second cgroup");
    let (pa, pb): (Vec<_>, Vec<_>) = (
        a.paths().iter().map(|p| p.to_path_buf()).collect(),
        b.paths().iter().map(|p| p.to_path_buf()).collect(),
    );
    assert!(pa.iter().all(|p| !pb.contains(p)), "{pa:?} vs {pb:?}");
    let ca = run_in(&a, "exec sleep 30");
    let cb = run_in(&b, "exec sleep 30");
    assert_eq!(a.processes().len(), 1, "{:?}", a.processes());
    assert_eq!(b.processes().len(), 1, "{:?}", b.processes());
    drop(a);
    // b is untouched by a's removal.
    assert!(pb.iter().all(|p| p.exists()));
    assert_eq!(b.processes().len(), 1);
    drop(b);
    for p in pa.iter().chain(&pb) {
        assert!(!p.exists(), "{} still exists", p.display());
    }
    ca.wait_with_output().unwrap();
    cb.wait_with_output().unwrap();
}

/// Run the body as an unprivileged user: as root, re-execute a copy of this test binary
/// (somewhere that user can read) as `nobody`.
fn as_unprivileged(name: &str, body: impl FnOnce()) {
    if !is_root() {
        body();
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix(&unique("unpriv"))
        .tempdir_in("/tmp")
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.path().join("harden_cgroup");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    isolated_with(
        name,
        |cmd| {
            use std::os::unix::process::CommandExt;
            *cmd = {
                let mut c = Command::new(&exe);
                c.args([name, "--exact", "--nocapture", "--test-threads=1"])
                    .env("CORRAL_HARDEN_CHILD", name)
                    .current_dir(dir.path())
                    .uid(65534)
                    .gid(65534);
                c
            };
        },
        body,
    );
}

#[test]
fn strict_refuses_without_cgroup_access_and_says_how_to_fix() {
    as_unprivileged(
        "strict_refuses_without_cgroup_access_and_says_how_to_fix",
        || {
            let l = limits(Some(1 << 30), Some(100), None, Enforce::Strict);
            match cgroup::setup(&unique("unpriv"), &l) {
                Ok(s) if s.cgroup.is_some() => {
                    eprintln!(
                        "skipping: this unprivileged user has a delegated cgroup; strict works here"
                    );
                }
                Ok(s) => panic!("strict setup succeeded without a cgroup: {s:?}"),
                Err(e) => {
                    let msg = e.to_string();
                    for needle in [
                        "cannot enforce limits.memory, limits.pids",
                        "systemd-run --user --scope -p Delegate=yes",
                        "limits.enforce = \"best-effort\"",
                        "corral doctor",
                    ] {
                        assert!(msg.contains(needle), "message lacks {needle:?}:\n{msg}");
                    }
                }
            }
        },
    );
}

#[test]
fn best_effort_falls_back_to_rlimits_and_says_so() {
    as_unprivileged("best_effort_falls_back_to_rlimits_and_says_so", || {
        let l = limits(Some(512 << 20), Some(100), Some(1.0), Enforce::BestEffort);
        let s = cgroup::setup(&unique("unpriv"), &l).expect("best-effort never refuses");
        if s.cgroup.is_some() {
            eprintln!(
                "skipping: this unprivileged user has a delegated cgroup; no fallback needed"
            );
            return;
        }
        assert_eq!(s.fallback, l);
        let notes = s.notes.join("\n");
        for needle in [
            "best-effort",
            "RLIMIT_DATA",
            "RLIMIT_NPROC",
            "cpus limit 1 NOT enforced",
        ] {
            assert!(notes.contains(needle), "notes lack {needle:?}:\n{notes}");
        }
        // The child really gets the rlimits.
        let fallback = s.fallback.clone();
        let out = {
            use std::os::unix::process::CommandExt;
            let mut c = Command::new("bash");
            c.args(["-c", "ulimit -d; ulimit -u"]);
            // SAFETY: rlimit::apply only calls getrlimit/setrlimit (async-signal-safe).
            unsafe {
                c.pre_exec(move || {
                    corral_sandbox::rlimit::apply(&fallback).map_err(std::io::Error::other)
                });
            }
            c.output().unwrap()
        };
        assert_eq!(String::from_utf8_lossy(&out.stdout), "524288\n100\n");
        // And an allocation beyond the memory figure fails in that process.
        let fallback = s.fallback.clone();
        let out = {
            use std::os::unix::process::CommandExt;
            let mut c = Command::new("python3");
            c.args(["-c", "b = bytearray(1 << 30)"]);
            // SAFETY: as above.
            unsafe {
                c.pre_exec(move || {
                    corral_sandbox::rlimit::apply(&fallback).map_err(std::io::Error::other)
                });
            }
            c.output().unwrap()
        };
        assert!(
            !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("MemoryError"),
            "a 1 GiB allocation under a 512 MiB RLIMIT_DATA: {out:?}"
        );
    });
}
