//! `corral doctor` probes the host for real: its JSON lists every check, the exit code follows
//! what it found, and an unprivileged user without cgroup access is told limits cannot be
//! enforced (exit 1) with the fix.

use std::process::Command;

use serde_json::Value;

mod etxtbsy;
use etxtbsy::OutputRetrying;

fn doctor(cmd: &mut Command) -> (i32, Value) {
    let out = cmd.args(["doctor", "--json"]).output_retrying();
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (out.status.code().expect("exit code"), json)
}

fn status<'a>(json: &'a Value, id: &str) -> &'a str {
    json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no check {id} in {json}"))["status"]
        .as_str()
        .unwrap()
}

#[test]
fn doctor_reports_every_probe_and_exits_by_what_it_found() {
    let (code, json) = doctor(&mut Command::new(env!("CARGO_BIN_EXE_corral")));
    let ids: Vec<&str> = json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "user_namespaces",
            "landlock",
            "seccomp",
            "name_gate",
            "cgroups",
            "pty",
            "tiocsti",
            "podman",
            "docker",
            "git_bare_repository",
            "change_record"
        ]
    );
    let expected = if json["native_backend"] == false {
        2
    } else if json["strict_limits"] == false || ids.iter().any(|id| status(&json, id) == "warn") {
        1
    } else {
        0
    };
    assert_eq!(code, expected, "{json:#}");
    // The filter's rules are listed with their reasons.
    let rules = json["seccomp_filter"].as_array().unwrap();
    for name in [
        "clone3",
        "ioctl",
        "socket",
        "mount",
        "ptrace",
        "bpf",
        "io_uring_setup",
    ] {
        let r = rules
            .iter()
            .find(|r| r["syscall"] == name)
            .unwrap_or_else(|| panic!("no rule for {name}"));
        assert!(!r["rule"].as_str().unwrap().is_empty());
    }
    // The Landlock ABI reported is the kernel's own answer.
    let abi = corral_sandbox::landlock::kernel_abi();
    assert_eq!(json["landlock_abi"].as_u64(), abi.map(u64::from));
    // Human output ends with the summary and the exit code.
    let out = Command::new(env!("CARGO_BIN_EXE_corral"))
        .arg("doctor")
        .output_retrying();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("(exit {code})")), "{text}");
}

#[test]
fn doctor_as_an_unprivileged_user_without_cgroups_exits_1() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipping: needs root to run doctor as another user");
        return;
    }
    // A copy of the binary the unprivileged user can execute.
    let dir = tempfile::Builder::new()
        .prefix("corral-doctor")
        .tempdir_in("/tmp")
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("corral");
    std::fs::copy(env!("CARGO_BIN_EXE_corral"), &bin).unwrap();
    let mut cmd = Command::new(&bin);
    use std::os::unix::process::CommandExt;
    cmd.uid(65534)
        .gid(65534)
        .current_dir(dir.path())
        .env("HOME", dir.path());
    let (code, json) = doctor(&mut cmd);
    assert_eq!(json["uid"], 65534);
    if json["strict_limits"] == true {
        eprintln!("skipping: nobody has a delegated cgroup on this host");
        return;
    }
    assert_eq!(status(&json, "cgroups"), "warn", "{json:#}");
    let check = json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "cgroups")
        .unwrap();
    assert!(
        check["fix"]
            .as_str()
            .unwrap()
            .contains("systemd-run --user --scope -p Delegate=yes")
    );
    assert!(check["disables"].as_str().unwrap().contains("best-effort"));
    assert_eq!(
        code,
        if json["native_backend"] == true { 1 } else { 2 },
        "{json:#}"
    );
}
