//! A shim runs the real binary jailed: a fake `pi` on PATH records where it ran, and the record
//! shows another pid namespace, the project at its own path read-write, and a file beside the
//! project out of reach.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use similar_asserts::assert_eq;

mod etxtbsy;
use etxtbsy::OutputRetrying;

#[test]
fn a_shim_runs_the_real_binary_jailed() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let (proj, real, shims, home) = (
        root.join("proj"),
        root.join("real"),
        root.join("shims"),
        root.join("home"),
    );
    for d in [
        &proj.join(".git"),
        &proj.join("src"),
        &real,
        &shims,
        &home.join(".pi/agent"),
    ] {
        std::fs::create_dir_all(d).unwrap();
    }
    let secret = root.join("secret.txt");
    std::fs::write(&secret, "top secret\n").unwrap();
    let record = proj.join("pi-ran.txt");
    let fake_pi = real.join("pi");
    std::fs::write(
        &fake_pi,
        format!(
            "#!/bin/sh\n{{ echo \"args: $*\"; echo \"pwd: $(pwd)\"; echo \"pidns: $(readlink /proc/self/ns/pid)\"; \
             if cat {secret} >/dev/null 2>&1; then echo 'secret: READABLE'; else echo 'secret: unreachable'; fi; }} > {record}\n",
            secret = secret.display(),
            record = record.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake_pi, std::fs::Permissions::from_mode(0o755)).unwrap();

    let path = format!(
        "{}:{}:/usr/local/bin:/usr/bin:/bin",
        shims.display(),
        real.display()
    );
    let o = Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(["shim", "install", "pi", "--dir", shims.to_str().unwrap()])
        .env("PATH", &path)
        .env("HOME", &home)
        .output_retrying();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // By its usual name, from a subdirectory of the project.
    let o = Command::new("/bin/sh")
        .args(["-c", "pi hello 'big world'"])
        .env_clear()
        .env("PATH", &path)
        .env("HOME", &home)
        .env("TERM", "dumb")
        .current_dir(proj.join("src"))
        .output_retrying();
    assert!(
        o.status.success(),
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let host_pidns = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let got = std::fs::read_to_string(&record).expect("the fake pi ran and wrote into the project");
    let jail_pidns = got
        .lines()
        .find_map(|l| l.strip_prefix("pidns: "))
        .unwrap_or_default()
        .to_string();
    assert_ne!(
        jail_pidns,
        host_pidns.display().to_string(),
        "ran in the host's pid namespace"
    );
    assert_eq!(
        got,
        format!(
            // The profile's skill too, as `corral run pi` gives it.
            "args: hello big world --skill /run/corral/skill\npwd: {}\npidns: {jail_pidns}\nsecret: unreachable\n",
            proj.join("src").display()
        )
    );
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "top secret\n");
}
