//! The agent cannot trust a policy for itself: a process in the jail really tries to plant a
//! trust store entry (and to rewrite the project's policy), and a hostile corral.toml that
//! arrives afterwards is still refused. On a terminal the gate asks, and no is the default.

mod jail_support;

use std::io::Write as _;
use std::path::Path;

use jail_support::*;

/// What a hostile repository would like to be trusted.
const HOSTILE: &str = "[network]\nhost_ports = [5432]\n";

/// A shell script, run in the jail, that plants a trust store at `store` trusting `policy` with
/// the hostile content (hashed inside the jail, as an agent would) and tries every other way in:
/// rewriting the store, replacing its directory, rewriting the policy itself. It prints the
/// store it wrote between PLANT-BEGIN and PLANT-END.
fn plant_script(store: &Path, policy: &Path) -> String {
    let dir = store.parent().unwrap();
    format!(
        "printf '{hostile}' > /tmp/h.toml; \
         H=$(sha256sum /tmp/h.toml | cut -d' ' -f1); \
         J='{{\"files\":[{{\"path\":\"{policy}\",\"sha256\":\"'$H'\",\"trusted_at\":\"2026-01-01T00:00:00Z\"}}]}}'; \
         echo PLANT-BEGIN; echo \"$J\"; echo PLANT-END; \
         mkdir -p {dir} 2>/dev/null; \
         echo \"$J\" > {store} 2>/dev/null && echo WROTE:store; \
         echo \"$J\" > {dir}/new.json 2>/dev/null && mv -f {dir}/new.json {store} 2>/dev/null && echo MOVED:store; \
         test -e {store} && rm -f {store} 2>/dev/null && test ! -e {store} && echo REMOVED:store; \
         mv {dir} {dir}.old 2>/dev/null && mkdir {dir} && echo \"$J\" > {store} && echo REPLACED:dir; \
         cp /tmp/h.toml {policy} 2>/dev/null && echo WROTE:policy; \
         echo END",
        hostile = HOSTILE.replace('\n', "\\n"),
        policy = policy.display(),
        store = store.display(),
        dir = dir.display(),
    )
}

fn planted(out: &Out) -> String {
    let s = out.stdout.split("PLANT-BEGIN\n").nth(1).unwrap_or_default();
    s.split("PLANT-END").next().unwrap_or_default().to_string()
}

/// The attack of `plant_script` under `c` fails: nothing written, the hostile file that arrives
/// afterwards is refused. Control: the very store the jail tried to write, written on the host,
/// makes corral run it (so the attempt was a real one).
fn attack_fails(w: &World, mut c: std::process::Command, store: &Path, envs: &[(&str, &Path)]) {
    let policy = w.project.join("corral.toml");
    let before = std::fs::read(store).ok();
    let policy_before = std::fs::read_to_string(&policy).unwrap();
    c.arg("--")
        .arg("sh")
        .arg("-c")
        .arg(plant_script(store, &policy));
    let out = run(c);
    ran(&out, "END");
    for bad in ["WROTE", "MOVED", "REMOVED", "REPLACED"] {
        assert!(!out.stdout.contains(bad), "{bad}:\n{}", out.both());
    }
    assert_eq!(std::fs::read(store).ok(), before, "the trust store changed");
    assert_eq!(
        std::fs::read_to_string(&policy).unwrap(),
        policy_before,
        "the policy changed"
    );
    let plant = planted(&out);
    assert!(plant.contains("\"sha256\""), "{}", out.both());

    // The repository's next commit brings the hostile file: still refused.
    write(&policy, HOSTILE);
    let attempt = |marker: &str| {
        let mut c = w.corral();
        for (k, v) in envs {
            c.env(k, v);
        }
        // Limits best-effort from the command line: the project's own config directory
        // variant has no user config, and a rootless run has no cgroup. The project named: a
        // directory holding corral's config is a project only then.
        c.args(["run", "--network", "none", "--enforce", "best-effort"])
            .arg("--project")
            .arg(&w.project)
            .arg("--")
            .args(["sh", "-c"])
            .arg(format!("echo {marker}"));
        run(c)
    };
    let out = attempt("HOSTILE-RAN");
    assert_eq!(out.code, 125, "{}", out.both());
    assert!(!out.stdout.contains("HOSTILE-RAN"), "{}", out.both());
    assert!(out.stderr.contains("host_ports"), "{}", out.both());

    // Control: the store the jail meant to write does open the gate when it is really there.
    write(store, plant.trim());
    let out = attempt("CONTROL-RAN");
    assert_eq!(
        out.code,
        0,
        "the planted store was not a valid one:\n{}",
        out.both()
    );
    assert!(out.stdout.contains("CONTROL-RAN"), "{}", out.both());
}

#[test]
fn a_jailed_process_cannot_trust_a_policy_under_a_read_write_home() {
    let w = World::new();
    write(&w.project.join("corral.toml"), "# benign\n");
    // A store with an entry, as after the user trusted another project.
    let store = w.home.join(".config/corral/trusted.json");
    write(
        &store,
        "{\"files\":[{\"path\":\"/elsewhere/corral.toml\",\"sha256\":\"00\",\"trusted_at\":\"2026-01-01T00:00:00Z\"}]}\n",
    );
    // The user binds the whole home read-write: corral's own directories stay read-only.
    let mut c = w.corral();
    c.args(["run", "--network", "none", "--rw"]).arg(&w.home);
    attack_fails(&w, c, &store, &[]);

    // The audit log is out of reach too.
    let mut c = w.corral();
    c.args(["run", "--network", "none", "--rw"])
        .arg(&w.home)
        .args(["--", "sh", "-c"])
        .arg(format!(
            "echo forged > {0}/forged.jsonl 2>/dev/null && echo WROTE:state; \
             mv {0} {0}.old 2>/dev/null && echo MOVED:state; echo END",
            w.home.join(".local/state/corral").display()
        ));
    let out = run(c);
    ran(&out, "END");
    assert!(!out.stdout.contains("WROTE"), "{}", out.both());
    assert!(!out.stdout.contains("MOVED"), "{}", out.both());
    assert!(!w.home.join(".local/state/corral/forged.jsonl").exists());
}

#[test]
fn a_jailed_process_cannot_plant_a_trust_store_inside_the_project() {
    let w = World::new();
    write(&w.project.join("corral.toml"), "# benign\n");
    // corral's config directory inside the (read-write) project, not there yet.
    let xdg = w.project.join(".xdg");
    let store = xdg.join("corral/trusted.json");
    let envs: [(&str, &Path); 1] = [("XDG_CONFIG_HOME", &xdg)];
    // Not a project unless named (first wall); named, the store stays out of the jail's reach.
    let mut c = w.corral();
    c.env("XDG_CONFIG_HOME", &xdg).args([
        "run",
        "--network",
        "none",
        "--enforce",
        "best-effort",
        "--",
        "true",
    ]);
    assert_eq!(run(c).code, 125);
    let mut c = w.corral();
    c.env("XDG_CONFIG_HOME", &xdg)
        .args(["run", "--network", "none", "--enforce", "best-effort"])
        .arg("--project")
        .arg(&w.project);
    attack_fails(&w, c, &store, &envs);
}

#[test]
fn on_a_terminal_the_gate_asks_and_no_is_the_default() {
    let w = World::new();
    write(&w.project.join("corral.toml"), HOSTILE);
    let store = w.home.join(".config/corral/trusted.json");
    let ask = |answer: &[u8]| {
        let mut c = w.sh_command("none", "echo JAIL-RAN");
        c.env("TERM", "dumb");
        let (mut master, _slave, mut child) = under_pty(c, 24, 80);
        let seen = read_until(&mut master, "[y/N]", &mut child);
        assert!(seen.contains("[y/N]"), "no question asked:\n{seen}");
        assert!(seen.contains("host_ports"), "{seen}");
        master.write_all(answer).unwrap();
        let rest = read_until(&mut master, "JAIL-RAN", &mut child);
        let status = child.wait().unwrap();
        (status.code(), rest)
    };
    // Enter alone: no.
    let (code, rest) = ask(b"\n");
    assert_eq!(code, Some(125), "{rest}");
    assert!(!rest.contains("JAIL-RAN"), "{rest}");
    assert!(!store.exists(), "trusted without a yes");
    // y: trusted and run; the next run does not ask.
    let (code, rest) = ask(b"y\n");
    assert_eq!(code, Some(0), "{rest}");
    assert!(rest.contains("JAIL-RAN"), "{rest}");
    let out = w.sh("none", "echo AGAIN-RAN");
    ran(&out, "AGAIN-RAN");
}

#[test]
fn a_jailed_process_cannot_write_a_trust_store_a_symlink_puts_in_the_project() {
    let w = World::new();
    write(&w.project.join("corral.toml"), "# benign\n");
    // ~/.config/corral is a symlink into the project (a dotfiles repository the user works
    // in): the jail sees the real store through the read-write project.
    let real = w.project.join("dotfiles/corral");
    let link = w.home.join(".config/corral");
    std::fs::create_dir_all(real.parent().unwrap()).unwrap();
    std::fs::rename(&link, &real).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let store = real.join("trusted.json");
    write(
        &store,
        "{\"files\":[{\"path\":\"/elsewhere/corral.toml\",\"sha256\":\"00\",\"trusted_at\":\"2026-01-01T00:00:00Z\"}]}\n",
    );
    let mut c = w.corral();
    c.args(["run", "--network", "none", "--enforce", "best-effort"])
        .arg("--project")
        .arg(&w.project);
    attack_fails(&w, c, &store, &[]);
}
