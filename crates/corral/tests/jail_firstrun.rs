//! First contact, as a user meets corral: run from the home directory, on a host without a
//! delegated cgroup, at a terminal, through a shim, with toolchains under $HOME. Each runs the
//! real binary (as root and, through scripts/test-rootless, as an unprivileged user).

mod jail_support;

use std::io::Write;
use std::path::Path;

use jail_support::*;

/// The world's user config without its `limits.enforce = "best-effort"`: corral's defaults as a
/// new user has them.
fn fresh_user_config(w: &World) {
    write(
        &w.home.join(".config/corral/config.toml"),
        "[filesystem]\nhide = [\".env\", \".env.*\"]\n",
    );
}

#[test]
fn from_the_home_directory_the_jail_does_not_get_the_home() {
    let w = World::new();
    let key = w.home.join(".ssh/id_ed25519");
    let attack = |cwd: &Path, extra: &[&str]| {
        let mut c = w.corral();
        c.current_dir(cwd).arg("run").args(extra).args([
            "--network",
            "none",
            "--",
            "sh",
            "-c",
            &format!(
                "cat {}; echo pwned >> {}/.bashrc; echo END",
                key.display(),
                w.home.display()
            ),
        ]);
        run(c)
    };
    for cwd in [w.home.clone(), w.root.clone(), "/".into()] {
        let out = attack(&cwd, &[]);
        assert_eq!(out.code, 125, "from {cwd:?}: {}", out.both());
        assert!(!out.both().contains(SSH_SECRET), "{}", out.both());
        assert!(
            out.stderr.contains("refusing to make")
                && out.stderr.contains("--project DIR")
                && out.stderr.contains("--scratch"),
            "{}",
            out.stderr
        );
    }
    assert!(!w.home.join(".bashrc").exists());
    // A dotfiles repository at the home: the enclosing git top level is the home, refused
    // from any directory below it that is not a repository of its own.
    let git = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(&w.home)
        .env("HOME", &w.home)
        .status()
        .unwrap();
    assert!(git.success());
    std::fs::create_dir_all(w.home.join("notes")).unwrap();
    let out = attack(&w.home.join("notes"), &[]);
    assert_eq!(out.code, 125, "{}", out.both());
    assert!(
        out.stderr
            .contains("the top level of the enclosing git repository"),
        "{}",
        out.stderr
    );
    assert!(!w.home.join(".bashrc").exists());
    // Control: named explicitly, the home is the project and the same command reaches the key.
    let home = w.home.display().to_string();
    let out = attack(&w.home, &["--project", &home]);
    ran(&out, "END");
    assert!(out.stdout.contains(SSH_SECRET), "{}", out.both());
    // From inside the project, the project is chosen, and the key is not there.
    let out = attack(&w.project.join("sub/dir"), &[]);
    ran(&out, "END");
    assert!(!out.both().contains(SSH_SECRET), "{}", out.both());
}

#[test]
fn plan_says_which_rule_chose_the_project() {
    let w = World::new();
    let plan = |cwd: &Path, extra: &[&str]| {
        let mut c = w.corral();
        c.current_dir(cwd).arg("plan").args(extra).arg("--json");
        let out = run(c);
        assert_eq!(out.code, 0, "{}", out.both());
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        (
            v["project"]["root"].as_str().unwrap().to_string(),
            v["project"]["source"].as_str().unwrap().to_string(),
        )
    };
    let project = w.project.display().to_string();
    assert_eq!(
        plan(&w.project.join("sub"), &[]),
        (project.clone(), "git-top-level".into())
    );
    assert_eq!(
        plan(&w.outside, &[]),
        (w.outside.display().to_string(), "current-directory".into())
    );
    let sub = w.project.join("sub").display().to_string();
    assert_eq!(
        plan(&w.home, &["--project", &sub]),
        (sub.clone(), "project-flag".into())
    );
    assert_eq!(plan(&w.home, &["--scratch"]).1, "scratch");
    let mut c = w.corral();
    c.current_dir(w.project.join("sub")).arg("plan");
    let out = run(c);
    assert!(
        out.stdout.contains(&format!(
            "project       {project} (rw; the top level of the enclosing git repository)"
        )),
        "{}",
        out.stdout
    );
}

#[test]
fn default_limits_never_refuse_a_run() {
    let w = World::new();
    fresh_user_config(&w);
    // `ulimit -d` is the data limit in KiB: the memory default applied as RLIMIT_DATA when no
    // cgroup takes it.
    let out = w.sh("none", "echo DATA=$(ulimit -d); echo END");
    ran(&out, "END");
    assert_eq!(out.code, 0, "{}", out.both());
    let notes: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("limits"))
        .collect();
    // `corral doctor` names the same path for this user.
    let mut c = w.corral();
    c.args(["doctor", "--json"]);
    let doctor: serde_json::Value = serde_json::from_str(&run(c).stdout).unwrap();
    let path = doctor["limits_path"].as_str().unwrap();
    assert_eq!(
        path == "rlimit-fallback",
        !notes.is_empty(),
        "doctor says {path}; the run said {notes:?}"
    );
    if notes.is_empty() {
        // A cgroup enforces the defaults here (root with cgroup v1, or a delegated v2 subtree).
        eprintln!("this host enforces the default limits with a cgroup");
        assert!(out.stdout.contains("DATA=unlimited"), "{}", out.stdout);
        return;
    }
    // Without one: one line says what is missing, and what can be enforced is.
    assert_eq!(notes.len(), 1, "{}", out.stderr);
    assert!(
        notes[0].starts_with("corral: default limits without a cgroup here"),
        "{}",
        notes[0]
    );
    assert!(out.stdout.contains("DATA=4194304"), "{}", out.stdout);
    // A limit the user sets is still strict: refused, since no cgroup can enforce it here.
    let mut c = w.corral();
    c.args(["run", "--network", "none", "--memory", "1g", "--", "true"]);
    let out = run(c);
    assert_eq!(out.code, 125, "{}", out.both());
    assert!(
        out.stderr.contains("cannot enforce limits.memory"),
        "{}",
        out.stderr
    );
}

#[test]
fn tty_in_the_jail_names_its_terminal() {
    let w = World::new();
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        "tty; test -t 0 && echo STDIN-TTY; echo via-dev-tty > /dev/tty; \
         ls /dev/pts; echo DONE",
    ]);
    let (mut master, _slave, mut child) = under_pty(c, 24, 80);
    let out = read_until(&mut master, "DONE", &mut child);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(!out.contains("not a tty"), "{out}");
    assert!(out.contains("/dev/pts/0"), "{out}");
    assert!(
        out.contains("STDIN-TTY") && out.contains("via-dev-tty"),
        "{out}"
    );
    // The jail's devpts holds its own terminal only, never the user's.
    assert!(!out.contains("\n1\r"), "{out}");
}

#[test]
fn tty_in_corral_shell_prints_a_device() {
    let w = World::new();
    let mut c = w.corral();
    c.args(["shell", "--network", "none"]);
    let (mut master, _slave, mut child) = under_pty(c, 24, 80);
    master
        .write_all(b"echo TTY-IS-$(tty)-END; exit 0\n")
        .unwrap();
    let out = read_until(&mut master, "-END\r", &mut child);
    let status = child.wait().unwrap();
    assert!(out.contains("TTY-IS-/dev/pts/0-END"), "{status:?}: {out}");
}

#[test]
fn the_change_summary_never_lists_corrals_own_state() {
    let w = World::new();
    // corral's state (audit log, the summary's private git directory) inside the project: a
    // project only when named, and then what corral writes there is not the agent's change.
    let state = w.project.join("state");
    let project = w.project.display().to_string();
    let mut c = w.corral();
    c.env("XDG_STATE_HOME", &state).args([
        "run",
        "--project",
        &project,
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        "echo new > made.txt; echo END",
    ]);
    let out = run(c);
    ran(&out, "END");
    assert!(
        state.join("corral").is_dir(),
        "the state went elsewhere: {}",
        out.stderr
    );
    let summary = out
        .stderr
        .split_once("corral: changed in")
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("no change summary: {}", out.stderr));
    assert!(summary.contains("made.txt"), "{summary}");
    assert!(
        !summary.contains("state") && !summary.contains("audit"),
        "{summary}"
    );
    // Without --project, a directory holding corral's state is refused.
    let mut c = w.corral();
    c.env("XDG_STATE_HOME", &state)
        .args(["run", "--network", "none", "--", "true"]);
    let out = run(c);
    assert_eq!(out.code, 125, "{}", out.both());
    assert!(
        out.stderr.contains("contains corral's own directory"),
        "{}",
        out.stderr
    );
}

/// A fake `pi` in `dir` that prints its arguments, and a shim for it installed in `shims`.
fn fake_pi_and_shim(w: &World, dir: &Path, shims: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let pi = dir.join("pi");
    write(&pi, "#!/bin/sh\necho \"PI-ARGS: $*\"\n");
    std::fs::set_permissions(&pi, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}:/usr/local/bin:/usr/bin:/bin",
        shims.display(),
        dir.display()
    );
    let mut c = w.corral();
    c.env("PATH", &path)
        .args(["shim", "install", "pi", "--dir"])
        .arg(shims);
    let out = run(c);
    assert_eq!(out.code, 0, "{}", out.both());
    path
}

#[test]
fn a_shimmed_harness_gets_what_corral_run_profile_gives() {
    let w = World::new();
    let (real, shims) = (w.root.join("real-bin"), w.root.join("shims"));
    let path = fake_pi_and_shim(&w, &real, &shims);
    // `corral run pi` with the shim first on PATH finds the real pi, never the shim.
    let mut c = w.corral();
    c.env("PATH", &path)
        .args(["run", "pi", "--network", "none"]);
    let direct = run(c);
    assert_eq!(direct.code, 0, "{}", direct.both());
    assert!(
        direct.stdout.contains("PI-ARGS: --skill /run/corral/skill"),
        "{}",
        direct.both()
    );
    // The shim by its usual name: the same skill, the user's arguments too.
    let mut c = std::process::Command::new(shims.join("pi"));
    c.current_dir(&w.project)
        .env_clear()
        .env("HOME", &w.home)
        .env("PATH", &path)
        .env("LANG", "C.UTF-8")
        .env("TMPDIR", std::env::temp_dir())
        .args(["hello", "world"]);
    let shimmed = run(c);
    assert_eq!(shimmed.code, 0, "{}", shimmed.both());
    assert!(
        shimmed
            .stdout
            .contains("PI-ARGS: hello world --skill /run/corral/skill"),
        "{}",
        shimmed.both()
    );
    // And `corral plan pi` through the shim's PATH shows the real program and the skill.
    let mut c = w.corral();
    c.env("PATH", &path).args(["plan", "pi", "--json"]);
    let out = run(c);
    let plan: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        plan["command"][0].as_str(),
        Some(real.join("pi").to_str().unwrap())
    );
    assert!(plan["skill"].is_object(), "{}", out.stdout);
}

/// An executable script at `path`.
fn script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    write(path, text);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn toolchains_under_the_home_work_read_only_without_binds() {
    let w = World::new();
    let h = &w.home;
    // A rustup-like layout (a cargo that reads its toolchain from RUSTUP_HOME), a pyenv-like
    // one (a shim that runs the version under PYENV_ROOT), and what must stay out.
    write(
        &h.join(".rustup/toolchains/stable/marker"),
        "RUST-TOOLCHAIN\n",
    );
    script(
        &h.join(".cargo/bin/cargo"),
        "#!/bin/sh\necho \"CARGO $(cat \"$RUSTUP_HOME/toolchains/stable/marker\")\"\n",
    );
    write(
        &h.join(".cargo/credentials.toml"),
        "token = \"CARGO-SECRET\"\n",
    );
    write(&h.join(".cargo/registry/cache/x"), "REGISTRY\n");
    script(&h.join(".pyenv/bin/pyenv"), "#!/bin/sh\nexit 0\n");
    script(
        &h.join(".pyenv/versions/3.99/bin/python3"),
        "#!/bin/sh\necho PYTHON-3.99 \"$@\"\n",
    );
    script(
        &h.join(".pyenv/shims/python3"),
        "#!/bin/sh\nexec \"$PYENV_ROOT/versions/3.99/bin/python3\" \"$@\"\n",
    );
    let path = format!(
        "{}:{}:/usr/local/bin:/usr/bin:/bin",
        h.join(".cargo/bin").display(),
        h.join(".pyenv/shims").display()
    );
    let run_in = |args: &[&str]| {
        let mut c = w.corral();
        c.env("PATH", &path)
            .args(["run", "--network", "none", "--"])
            .args(args);
        run(c)
    };
    let out = run_in(&["cargo"]);
    assert_eq!(out.code, 0, "{}", out.both());
    assert!(
        out.stdout.contains("CARGO RUST-TOOLCHAIN"),
        "{}",
        out.both()
    );
    let out = run_in(&["python3", "-c", "x"]);
    assert!(out.stdout.contains("PYTHON-3.99 -c x"), "{}", out.both());
    // Through the executor, as an agent asks for a build.
    let out = run_in(&["corral", "exec", "--", "cargo"]);
    assert_eq!(out.code, 0, "{}", out.both());
    assert!(
        out.stdout.contains("CARGO RUST-TOOLCHAIN"),
        "{}",
        out.both()
    );
    // Read-only, and nothing beside the toolchain comes in.
    let cargo_bin = h.join(".cargo/bin").display().to_string();
    let pyenv = h.join(".pyenv").display().to_string();
    let out = run_in(&[
        "sh",
        "-c",
        &format!(
            "echo evil > {cargo_bin}/cargo || echo RO-CARGO; touch {pyenv}/version || echo RO-PYENV; \
             cat ~/.cargo/credentials.toml ~/.cargo/registry/cache/x; echo END"
        ),
    ]);
    ran(&out, "END");
    assert!(
        out.stdout.contains("RO-CARGO") && out.stdout.contains("RO-PYENV"),
        "{}",
        out.both()
    );
    assert!(
        !out.stdout.contains("CARGO-SECRET") && !out.stdout.contains("REGISTRY"),
        "{}",
        out.both()
    );
    assert!(!h.join(".pyenv/version").exists());
    // `corral plan` names them.
    let mut c = w.corral();
    c.env("PATH", &path).arg("plan");
    let out = run(c);
    assert!(
        out.stdout.contains(&format!(
            "toolchains    rust ({}, {}); pyenv ({pyenv}) (read-only, on PATH)",
            h.join(".rustup").display(),
            cargo_bin
        )),
        "{}",
        out.stdout
    );
}

/// The host's own rustup and pyenv, as root has them on this machine (skipped where absent).
#[test]
fn the_real_rustup_and_pyenv_of_the_home_work() {
    let home = std::path::PathBuf::from(std::env::var("HOME").unwrap_or_default());
    let (cargo, pyenv) = (home.join(".cargo/bin/cargo"), home.join(".pyenv/shims"));
    if !cargo.exists() || !pyenv.is_dir() {
        eprintln!("skipping: no rustup or pyenv under {}", home.display());
        return;
    }
    let w = World::new();
    let path = format!(
        "{}:{}:/usr/local/bin:/usr/bin:/bin",
        home.join(".cargo/bin").display(),
        pyenv.display()
    );
    let run_in = |args: &[&str]| {
        let mut c = w.corral();
        c.env("HOME", &home)
            .env("XDG_STATE_HOME", w.root.join("state"))
            .env("XDG_CONFIG_HOME", w.root.join("config"))
            .env("PATH", &path)
            .args(["run", "--network", "none", "--"])
            .args(args);
        run(c)
    };
    let out = run_in(&[
        "python3",
        "-c",
        "import sys; print('PY', sys.version_info[0])",
    ]);
    assert!(out.stdout.contains("PY 3"), "{}", out.both());
    let out = run_in(&["cargo", "--version"]);
    assert!(out.stdout.starts_with("cargo "), "{}", out.both());
    let out = run_in(&["corral", "exec", "--", "cargo", "--version"]);
    assert!(out.stdout.starts_with("cargo "), "{}", out.both());
}
