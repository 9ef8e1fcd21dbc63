//! The conventions of the command line (how errors, exit codes and arguments read), tried with the
//! real binary as a user runs it: usage errors exit 125, a command without `--` gets the line
//! that runs it, sizes and durations as docker and humantime write them, named paths must
//! exist, `corral allow` of several hosts, URLs and addresses, a closed pipe ends quietly, `corral
//! log` with dates, `--since`, `-n`, and `--json` for the lists. Each test has its own project,
//! HOME and XDG directories; nothing here starts a jail (jail_cliconv.rs does).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use similar_asserts::assert_eq;

/// A git project with its own home, config and state directories.
struct World {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    home: PathBuf,
}

impl World {
    fn new() -> World {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().canonicalize().unwrap();
        let root = base.join("proj");
        let home = base.join("home");
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        World {
            _tmp: tmp,
            root,
            home,
        }
    }

    /// corral in the project, with a clean environment.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_corral"));
        c.args(args)
            .current_dir(&self.root)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &self.home)
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> Run {
        Run::from(self.cmd(args).output().expect("run corral"))
    }

    fn policy(&self, text: &str) {
        std::fs::write(self.root.join("corral.toml"), text).unwrap();
    }

    fn plan_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = vec!["plan", "--json"];
        all.extend_from_slice(args);
        let r = self.run(&all);
        assert_eq!(r.code, 0, "{all:?}: {}", r.stderr);
        serde_json::from_str(&r.stdout).unwrap()
    }

    /// The project's audit log, as `corral log` names it when there is none yet.
    fn audit_log(&self) -> PathBuf {
        let r = self.run(&["log"]);
        let at = r
            .stderr
            .split("(expected at ")
            .nth(1)
            .and_then(|s| s.strip_suffix(")\n"))
            .unwrap_or_else(|| panic!("no log path in {:?}", r.stderr));
        PathBuf::from(at)
    }
}

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        use std::os::unix::process::ExitStatusExt;
        Run {
            code: o
                .status
                .code()
                .unwrap_or_else(|| 128 + o.status.signal().unwrap_or(0)),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// A refusal: exit 125, nothing on stdout, exactly `want` on stderr.
#[track_caller]
fn refused(r: &Run, want: &str) {
    assert_eq!(
        (r.code, r.stdout.as_str(), r.stderr.as_str()),
        (125, "", want)
    );
}

// ---- exit codes -------------------------------------------------------------------------------

#[test]
fn usage_errors_exit_125_and_help_and_version_exit_0_on_stdout() {
    let w = World::new();
    for args in [
        &["--bogus"][..],
        &[],
        &["run", "--memory"],
        &["run", "--engine", "vm", "--", "true"],
        &["log", "-n", "many"],
        &["allow"],
        &["frobnicate"],
    ] {
        let r = w.run(args);
        assert_eq!(r.code, 125, "{args:?}: {r:?}");
        assert!(r.stdout.is_empty(), "{args:?}: {r:?}");
        assert!(!r.stderr.is_empty(), "{args:?}: {r:?}");
    }
    let r = w.run(&["--bogus"]);
    assert!(
        r.stderr
            .starts_with("error: unexpected argument '--bogus' found"),
        "{r:?}"
    );
    for args in [
        &["--help"][..],
        &["-h"],
        &["run", "--help"],
        &["help", "log"],
        &["--version"],
    ] {
        let r = w.run(args);
        assert_eq!((r.code, r.stderr.as_str()), (0, ""), "{args:?}");
        assert!(!r.stdout.is_empty(), "{args:?}");
    }
    assert_eq!(
        w.run(&["--version"]).stdout,
        format!("corral {}\n", env!("CARGO_PKG_VERSION"))
    );

    // The lean proxy executable follows the same rule.
    let proxy = Command::new(env!("CARGO_BIN_EXE_corral-proxy"))
        .arg("--bogus")
        .output()
        .unwrap();
    assert_eq!(proxy.status.code(), Some(125));
    let proxy = Command::new(env!("CARGO_BIN_EXE_corral-proxy"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(proxy.status.code(), Some(0));
    assert!(proxy.stderr.is_empty() && !proxy.stdout.is_empty());
}

#[test]
fn a_command_without_dashes_gets_the_line_that_runs_it() {
    let w = World::new();
    let profiles = "pi, claude, codex, gemini, opencode, aider, shell";
    refused(
        &w.run(&["run", "make", "test"]),
        &format!(
            "corral: unknown profile \"make\": expected one of {profiles} (use `shell` with \
             `-- CMD` for any other command)\n\
             to run `make test` jailed, put the command after `--`:  corral run -- make test\n"
        ),
    );
    refused(
        &w.run(&["plan", "make", "it so"]),
        &format!(
            "corral: unknown profile \"make\": expected one of {profiles} (use `shell` with \
             `-- CMD` for any other command)\n\
             to run `make 'it so'` jailed, put the command after `--`:  corral plan -- make 'it so'\n"
        ),
    );
    // `shell` runs a shell: the command goes to `run`.
    let r = w.run(&["shell", "make"]);
    assert_eq!(r.code, 125);
    assert!(
        r.stderr
            .ends_with("to run `make` jailed, put the command after `--`:  corral run -- make\n"),
        "{r:?}"
    );
    // A known profile followed by words: they are not the profile's arguments.
    refused(
        &w.run(&["run", "pi", "--memory", "1g", "hello", "world"]),
        "corral: unexpected arguments hello world after the profile \"pi\": a command goes after \
         `--`, and replaces the profile's; to run \"pi\" with them:  corral run pi -- pi hello \
         world\n",
    );
    // With `--` it is a command (plan shows it without running anything).
    let plan = w.plan_json(&["--", "make", "test"]);
    let command = plan["command"].as_array().unwrap();
    assert!(
        command[0].as_str().unwrap().ends_with("make"),
        "{command:?}"
    );
    assert_eq!(command[1..], [serde_json::json!("test")]);
}

#[test]
fn a_profile_with_a_typo_gets_did_you_mean() {
    let w = World::new();
    let r = w.run(&["run", "claud"]);
    assert_eq!(r.code, 125);
    assert!(
        r.stderr.starts_with(
            "corral: unknown profile \"claud\": did you mean \"claude\"? expected one of"
        ),
        "{r:?}"
    );
    // In a policy file: at its place.
    w.policy("profile = \"opencod\"\n");
    let r = w.run(&["plan"]);
    assert_eq!(r.code, 125);
    let file = w.root.join("corral.toml");
    assert!(
        r.stderr.starts_with(&format!(
            "corral: {}:1:11: unknown profile \"opencod\": did you mean \"opencode\"?",
            file.display()
        )),
        "{r:?}"
    );
    std::fs::remove_file(&file).unwrap();
    // The other commands that take a profile.
    let r = w.run(&["skill", "codx"]);
    assert_eq!(r.code, 125);
    assert!(r.stderr.contains("(did you mean \"codex\"?)"), "{r:?}");
    let dir = w.home.join("bin");
    let r = w.run(&["shim", "install", "--dir", dir.to_str().unwrap(), "gemni"]);
    assert_eq!(r.code, 125);
    assert!(r.stderr.contains("(did you mean \"gemini\"?)"), "{r:?}");
    // Nothing close: no guess.
    let r = w.run(&["run", "ls"]);
    assert!(!r.stderr.contains("did you mean"), "{r:?}");
}

#[test]
fn run_has_no_json_flag() {
    let w = World::new();
    let r = w.run(&["run", "--json", "--", "true"]);
    assert_eq!(r.code, 125);
    assert!(
        r.stderr
            .starts_with("error: unexpected argument '--json' found"),
        "{r:?}"
    );
}

// ---- sizes, cpus, durations -------------------------------------------------------------------

#[test]
fn sizes_as_docker_writes_them() {
    let w = World::new();
    for (size, bytes) in [
        ("4g", 4u64 << 30),
        ("4gb", 4 << 30),
        ("4GiB", 4 << 30),
        ("4G", 4 << 30),
        ("512m", 512 << 20),
        ("512MB", 512 << 20),
        ("1.5g", 3 << 29),
    ] {
        let plan = w.plan_json(&["--memory", size]);
        assert_eq!(plan["limits"]["memory"], bytes, "--memory {size}");
    }
    w.policy("[limits]\nmemory = \"2GiB\"\n[executor]\nmax_output = \"1mb\"\n");
    let plan = w.plan_json(&[]);
    assert_eq!(plan["limits"]["memory"], 2u64 << 30);
    assert_eq!(plan["executor"]["max_output"], 1u64 << 20);
}

#[test]
fn a_bare_number_zero_or_a_size_too_small_to_start_a_jail_is_refused_before_anything_runs() {
    let w = World::new();
    let marker = w.root.join("ran");
    let touch = format!("touch {}", marker.display());
    for (size, why) in [
        (
            "4",
            "invalid size \"4\": a number alone is ambiguous; write its unit (e.g. 4g or 4m, \
             or 4b for bytes)",
        ),
        ("0", "invalid size \"0\": must be more than zero"),
        ("0g", "invalid size \"0g\": must be more than zero"),
        (
            "1m",
            "memory limit \"1m\" is too small to start a jail: the least is 6m (what docker \
             allows; a command's own process needs about that much to start)",
        ),
        (
            "64k",
            "memory limit \"64k\" is too small to start a jail: the least is 6m (what docker \
             allows; a command's own process needs about that much to start)",
        ),
        (
            "4x",
            "invalid size \"4x\": expected a number with one of the units b, k, m, g, t (e.g. \
             512m, 4g, 4gb, 4GiB, 1.5g)",
        ),
    ] {
        let r = w.run(&[
            "run",
            "--network",
            "none",
            "--memory",
            size,
            "--",
            "sh",
            "-c",
            &touch,
        ]);
        refused(&r, &format!("corral: --memory: {why}\n"));
        assert!(!marker.exists(), "--memory {size}: the command ran");
    }
    // The same in a policy file, at the value's place.
    let file = w.root.join("corral.toml");
    for (text, why) in [
        (
            "[limits]\nmemory = 4\n",
            "2:10: invalid size 4: a number alone is ambiguous; write it as a string with its \
             unit (e.g. \"4g\" or \"4m\", or \"4b\" for bytes)",
        ),
        (
            "[limits]\nmemory = 0\n",
            "2:10: invalid size 0: must be more than zero",
        ),
        (
            "[limits]\nmemory = \"2m\"\n",
            "2:10: memory limit \"2m\" is too small to start a jail: the least is 6m (what \
             docker allows; a command's own process needs about that much to start)",
        ),
    ] {
        w.policy(text);
        let r = w.run(&["run", "--network", "none", "--", "sh", "-c", &touch]);
        refused(&r, &format!("corral: {}:{why}\n", file.display()));
        assert!(!marker.exists(), "{text:?}: the command ran");
    }
}

#[test]
fn cpus_above_this_machine_are_refused() {
    let w = World::new();
    let n = std::thread::available_parallelism().unwrap().get();
    let plan = w.plan_json(&["--cpus", &n.to_string()]);
    assert_eq!(plan["limits"]["cpus"], n as f64);
    let over = (n + 1).to_string();
    let s = if n == 1 { "" } else { "s" };
    refused(
        &w.run(&["run", "--cpus", &over, "--", "true"]),
        &format!(
            "corral: --cpus {over}: this machine has {n} CPU{s}: the limit can be at most {n}\n"
        ),
    );
}

#[test]
fn durations_take_what_humantime_takes() {
    let w = World::new();
    for (d, ms) in [
        ("1h 30m", 5_400_000u64),
        ("1h30m", 5_400_000),
        ("90s", 90_000),
        ("2min", 120_000),
        ("1day", 86_400_000),
        ("250ms", 250),
        ("1.5h", 5_400_000),
    ] {
        w.policy(&format!("[executor]\ntimeout = \"{d}\"\n"));
        assert_eq!(w.plan_json(&[])["executor"]["timeout_ms"], ms, "{d:?}");
    }
    w.policy("[executor]\ntimeout = \"10\"\n");
    let r = w.run(&["plan"]);
    assert_eq!(r.code, 125);
    assert!(
        r.stderr.ends_with(
            ":2:11: invalid duration \"10\": expected a number with a unit (e.g. 30s, 10m, \
             1h 30m, 250ms, 1.5h)\n"
        ),
        "{r:?}"
    );
    // The command-line durations parse the same way (checked before anything is reached).
    std::fs::remove_file(w.root.join("corral.toml")).unwrap();
    let r = w.run(&["exec", "--timeout", "10 parsecs", "--", "true"]);
    refused(
        &r,
        "corral: --timeout: invalid duration \"10 parsecs\": expected a number with a unit (e.g. \
         30s, 10m, 1h 30m, 250ms, 1.5h)\n",
    );
}

// ---- named paths ------------------------------------------------------------------------------

#[test]
fn rw_and_ro_of_a_path_that_does_not_exist_are_errors() {
    let w = World::new();
    let missing = w.home.join("no-such-dir");
    refused(
        &w.run(&["run", "--rw", missing.to_str().unwrap(), "--", "true"]),
        &format!(
            "corral: --rw {0}: cannot bind {0}: No such file or directory (os error 2)\n",
            missing.display()
        ),
    );
    // Relative to the current directory, as the user wrote it, and where that is.
    refused(
        &w.run(&["plan", "--ro", "vendr"]),
        &format!(
            "corral: --ro vendr: cannot bind {}: No such file or directory (os error 2)\n",
            w.root.join("vendr").display()
        ),
    );
    // A dangling symlink binds nothing either.
    std::os::unix::fs::symlink(&missing, w.root.join("link")).unwrap();
    assert_eq!(w.run(&["plan", "--ro", "link"]).code, 125);
    // What exists binds; a policy file's path that does not exist on this machine stays
    // optional (`~/.gitconfig` is not everywhere).
    std::fs::create_dir(w.root.join("vendor")).unwrap();
    w.policy("[filesystem]\nread_only = [\"~/.gitconfig-not-here\"]\n");
    let plan = w.plan_json(&["--ro", "vendor"]);
    let mounts = plan["mounts"].as_array().unwrap();
    let bind = |p: &Path| {
        mounts
            .iter()
            .find(|m| m["target"] == p.to_str().unwrap())
            .cloned()
    };
    let vendor = bind(&w.root.join("vendor")).expect("--ro vendor is bound");
    assert_eq!(vendor["optional"], true, "{vendor}");
    let gitconfig = bind(&w.home.join(".gitconfig-not-here")).expect("the policy's bind");
    assert_eq!(gitconfig["optional"], true, "{gitconfig}");
}

// ---- corral allow / deny ----------------------------------------------------------------------

#[test]
fn allow_takes_several_hosts_and_refuses_a_url_naming_its_host() {
    let w = World::new();
    let file = w.root.join("corral.toml");
    let r = w.run(&["allow", "a.example.org", "*.b.example.org:8443"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        r.stdout,
        format!(
            "created {0}: network.allow += \"a.example.org\"\n\
             updated {0}: network.allow += \"*.b.example.org:8443\"\n",
            file.display()
        )
    );
    let before = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        before,
        "[network]\nallow = [\"a.example.org\", \"*.b.example.org:8443\"]\n"
    );
    for (url, host) in [
        ("http://x.example.org", "x.example.org"),
        (
            "https://api.example.com:8443/v1/chat?x=1",
            "api.example.com:8443",
        ),
        ("https://user:pw@example.net/", "example.net"),
    ] {
        refused(
            &w.run(&["allow", url]),
            &format!("corral: {url:?}: a scheme is not a host: write {host}\n"),
        );
    }
    // One bad host among good ones: nothing is written.
    let r = w.run(&["allow", "c.example.org", "http://d.example.org/"]);
    assert_eq!(r.code, 125);
    let r = w.run(&["deny", "c.example.org", "exa mple.org"]);
    assert_eq!(r.code, 125);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
}

#[test]
fn an_address_gets_one_answer_private_or_public() {
    let w = World::new();
    let file = w.root.join("corral.toml");
    w.policy("# mine\n[network]\nallow = [\"a.example.org\"]  # the API\n");
    w.run(&["trust"]);
    let r = w.run(&[
        "allow",
        "10.1.2.3",
        "203.0.113.7:8080",
        "[fd00::1]",
        "10.9.0.0/16",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.stderr, "");
    let f = file.display();
    assert_eq!(
        r.stdout,
        format!(
            "updated {f}: network.allow += \"10.1.2.3\"\n\
             updated {f}: network.allow_cidrs += \"10.1.2.3/32\"\n\
             updated {f}: network.allow += \"203.0.113.7:8080\"\n\
             updated {f}: network.allow_cidrs += \"203.0.113.7/32\"\n\
             updated {f}: network.allow += \"fd00::1\"\n\
             updated {f}: network.allow_cidrs += \"fd00::1/128\"\n\
             updated {f}: network.allow_cidrs += \"10.9.0.0/16\"\n"
        )
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "# mine\n[network]\nallow = [\"a.example.org\", \"10.1.2.3\", \"203.0.113.7:8080\", \
         \"fd00::1\"]  # the API\nallow_cidrs = [\"10.1.2.3/32\", \"203.0.113.7/32\", \
         \"fd00::1/128\", \"10.9.0.0/16\"]\n"
    );
    // The policy loader reads it back as written.
    let plan = w.plan_json(&[]);
    assert_eq!(
        plan["network"]["allow_cidrs"],
        serde_json::json!([
            "10.1.2.3/32",
            "203.0.113.7/32",
            "fd00::1/128",
            "10.9.0.0/16"
        ])
    );
    // deny takes the address out of both.
    let r = w.run(&["deny", "10.1.2.3"]);
    assert_eq!(
        r.stdout,
        format!(
            "removed \"10.1.2.3\" from network.allow in {f}\n\
             updated {f}: network.deny += \"10.1.2.3\"\n\
             removed \"10.1.2.3/32\" from network.allow_cidrs in {f}\n"
        )
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "# mine\n[network]\nallow = [\"a.example.org\", \"203.0.113.7:8080\", \"fd00::1\"]  # \
         the API\nallow_cidrs = [\"203.0.113.7/32\", \"fd00::1/128\", \"10.9.0.0/16\"]\n\
         deny = [\"10.1.2.3\"]\n"
    );
    // A range that is not there: said, and nothing changes.
    let before = std::fs::read_to_string(&file).unwrap();
    let r = w.run(&["deny", "10.77.0.0/16"]);
    assert_eq!(
        (r.code, r.stdout),
        (
            0,
            format!(
                "network.allow_cidrs in {f} does not have \"10.77.0.0/16\": nothing to take out \
                 (loopback, private and link-local addresses are refused unless listed there; \
                 deny a public host by name)\n"
            )
        )
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
}

#[test]
fn allow_on_an_untrusted_file_says_it_stays_untrusted() {
    let w = World::new();
    let file = w.root.join("corral.toml");
    w.policy("[network]\nallow = [\"a.example.org\"]\n");
    let r = w.run(&["allow", "b.example.org"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        r.stderr,
        format!(
            "corral: {} stays untrusted: you have not trusted the rest of it; review it, then \
             run `corral trust` (corral run refuses what it grants until then)\n",
            file.display()
        )
    );
    // And it does: the run is refused.
    let r = w.run(&["run", "--network", "none", "--", "true"]);
    assert_eq!(r.code, 125);
    assert!(r.stderr.contains("it is not trusted"), "{r:?}");
    // A file the user trusted stays trusted, and nothing is said.
    assert_eq!(w.run(&["trust"]).code, 0);
    let r = w.run(&["allow", "c.example.org"]);
    assert_eq!((r.code, r.stderr.as_str()), (0, ""));
    // A file corral creates is the user's own.
    let other = World::new();
    let r = other.run(&["allow", "c.example.org"]);
    assert_eq!((r.code, r.stderr.as_str()), (0, ""));
}

// ---- a closed pipe ----------------------------------------------------------------------------

/// Run corral with its standard output a pipe whose reading end is already closed (what
/// `corral ... | head -1` becomes once head has its line): every write fails with EPIPE.
fn into_closed_pipe(mut c: Command) -> Run {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = c
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run corral");
    Run::from(out)
}

#[test]
fn a_closed_pipe_is_neither_a_panic_nor_an_error() {
    let w = World::new();
    // A log long enough that `corral log` writes after the reader left.
    let log = w.audit_log();
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    let mut text = String::new();
    for i in 0..2000 {
        text += &format!(
            "{{\"time\":\"2026-01-01T10:00:00.{:03}Z\",\"jail\":\"j{i}\",\"kind\":\"jail\",\
             \"event\":\"start\"}}\n",
            i % 1000
        );
    }
    std::fs::write(&log, text).unwrap();
    let shims = w.home.join("shims");
    let r = w.run(&["shim", "install", "--dir", shims.to_str().unwrap(), "pi"]);
    assert_eq!(r.code, 0, "{r:?}");
    w.policy("[network]\nallow = [\"a.example.org\"]\n");
    assert_eq!(w.run(&["trust"]).code, 0);
    for args in [
        &["generate", "completions", "bash"][..],
        &["generate", "man"],
        &["log"],
        &["log", "--json"],
        &["doctor", "--json"],
        &["doctor"],
        &["plan"],
        &["plan", "--json"],
        &["skill"],
        &["trust", "--list"],
        &["trust", "--list", "--json"],
        &["shim", "list", "--dir", shims.to_str().unwrap()],
        &["--help"],
        &["run", "--help"],
    ] {
        let r = into_closed_pipe(w.cmd(args));
        assert_eq!(
            (r.code, r.stderr.as_str()),
            (0, ""),
            "corral {args:?} | head"
        );
    }
}

#[test]
fn a_reader_that_leaves_early_ends_corral_quietly() {
    // The same as a user sees it: `corral generate completions bash | head -1`.
    let w = World::new();
    let mut child = w
        .cmd(&["generate", "completions", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 9];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The reader is gone (dropped above); what corral still writes fails.
    let out = child.wait_with_output().unwrap();
    assert_eq!(&first, b"_corral()");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

// ---- corral log -------------------------------------------------------------------------------

#[test]
fn log_shows_dates_and_takes_since_and_n() {
    let w = World::new();
    let log = w.audit_log();
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    let now = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%S.000Z"])
        .output()
        .unwrap();
    let now = String::from_utf8(now.stdout).unwrap().trim().to_string();
    // Events that carry no field of their own (an `exit` record has its `exit_code`).
    let record = |time: &str, jail: &str, event: &str| {
        format!(
            "{{\"time\":\"{time}\",\"jail\":\"{jail}\",\"kind\":\"jail\",\"event\":\"{event}\"}}\n"
        )
    };
    std::fs::write(
        &log,
        [
            record("2025-12-30T23:59:59.000Z", "old-1", "start"),
            record("2026-01-02T08:00:00.250Z", "mid-1", "start"),
            record("2026-01-02T08:00:05.000Z", "mid-1", "changes"),
            record(&now, "new-1", "start"),
        ]
        .concat(),
    )
    .unwrap();
    let header = format!(
        "{:<23} {:<16} {:<5} {:<8} {:<40} RULE\n",
        "TIME (UTC)", "JAIL", "KIND", "DECISION", "TARGET"
    );
    let row = |time: &str, jail: &str, event: &str| {
        format!("{time:<23} {jail:<16} jail  -        {event:<40} \n")
    };
    let now_shown = now[..23].replacen('T', " ", 1);
    let r = w.run(&["log", "-n", "2"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        r.stdout,
        format!(
            "{header}{}{}",
            row("2026-01-02 08:00:05.000", "mid-1", "changes"),
            row(&now_shown, "new-1", "start")
        )
    );
    let r = w.run(&["log", "--since", "2026-01-01"]);
    assert_eq!(
        r.stdout,
        format!(
            "{header}{}{}{}",
            row("2026-01-02 08:00:00.250", "mid-1", "start"),
            row("2026-01-02 08:00:05.000", "mid-1", "changes"),
            row(&now_shown, "new-1", "start")
        )
    );
    let r = w.run(&["log", "--since", "2026-01-02 08:00:01"]);
    assert_eq!(
        r.stdout,
        format!(
            "{header}{}{}",
            row("2026-01-02 08:00:05.000", "mid-1", "changes"),
            row(&now_shown, "new-1", "start")
        )
    );
    // A duration ago: only the entry written now.
    let r = w.run(&["log", "--since", "1h", "--json"]);
    assert_eq!(r.stdout, record(&now, "new-1", "start"));
    let r = w.run(&[
        "log",
        "--since",
        "2026-01-01T00:00:00Z",
        "-n",
        "1",
        "--json",
    ]);
    assert_eq!(r.stdout, record(&now, "new-1", "start"));
    refused(
        &w.run(&["log", "--since", "last tuesday"]),
        "corral: --since \"last tuesday\": expected a duration ago (10m, 2h, 1day) or a UTC \
         time (2026-11-29, \"2026-11-29 21:40\", 2026-11-29T21:40:01Z)\n",
    );
}

// ---- --json of the lists ----------------------------------------------------------------------

#[test]
fn trust_list_and_shim_list_have_json() {
    let w = World::new();
    let r = w.run(&["trust", "--list", "--json"]);
    assert_eq!((r.code, r.stdout.as_str()), (0, "[]\n"), "{r:?}");
    w.policy("[network]\nallow = [\"a.example.org\"]\n");
    assert_eq!(w.run(&["trust"]).code, 0);
    let r = w.run(&["trust", "--list", "--json"]);
    let got: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let file = w.root.join("corral.toml");
    let want_sha = {
        let out = Command::new("sha256sum").arg(&file).output().unwrap();
        String::from_utf8(out.stdout).unwrap()[..64].to_string()
    };
    let trusted_at = got[0]["trusted_at"].clone();
    assert!(trusted_at.is_string(), "{got}");
    assert_eq!(
        got,
        serde_json::json!([{
            "path": file,
            "sha256": want_sha,
            "trusted_at": trusted_at,
            "state": "current",
        }])
    );
    std::fs::write(&file, "# edited\n").unwrap();
    let r = w.run(&["trust", "--list", "--json"]);
    let got: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(got[0]["state"], "changed");
    // --json belongs to --list.
    assert_eq!(w.run(&["trust", "--json"]).code, 125);

    let dir = w.home.join("bin");
    let d = dir.to_str().unwrap();
    let r = w.run(&["shim", "list", "--json", "--dir", d]);
    assert_eq!((r.code, r.stdout.as_str()), (0, "[]\n"), "{r:?}");
    let r = w.run(&["shim", "install", "--scratch", "--dir", d, "pi", "codex"]);
    assert_eq!(r.code, 0, "{r:?}");
    let r = w.run(&["shim", "list", "--json", "--dir", d]);
    let got: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let shim = |name: &str, profile: &str, command: &str, scratch: bool| {
        serde_json::json!({
            "path": dir.join(name),
            "profile": profile,
            "command": command,
            "scratch": scratch,
        })
    };
    assert_eq!(
        got,
        serde_json::json!([
            shim("codex", "codex", "codex", false),
            shim("codex-ns", "codex", "codex", true),
            shim("pi", "pi", "pi", false),
            shim("pi-ns", "pi", "pi", true),
        ])
    );
}

// ---- container engine -------------------------------------------------------------------------

#[test]
fn podman_without_the_image_says_how_to_build_it() {
    if !Path::new("/usr/bin/podman").exists()
        && !std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .any(|d| d.join("podman").is_file())
    {
        eprintln!("skipping: podman is not installed");
        return;
    }
    let w = World::new();
    let image = format!(
        "localhost/corral-cliconv-missing-{}:latest",
        std::process::id()
    );
    w.policy(&format!("[run]\nimage = \"{image}\"\n"));
    // best-effort: rootless podman on cgroup v1 cannot apply limits, which is not the point.
    let r = w.run(&[
        "run",
        "--engine",
        "podman",
        "--network",
        "none",
        "--enforce",
        "best-effort",
        "--",
        "true",
    ]);
    assert_eq!(r.code, 125, "{r:?}");
    assert!(
        r.stderr.ends_with(&format!(
            "corral: cannot run the jail with podman: the harness image {image} is not in \
             podman's image store: build it with:  corral image build shell --engine podman\n"
        )),
        "{r:?}"
    );
}

#[test]
fn worktree_is_one_noun_and_the_old_spelling_is_hidden() {
    let w = World::new();
    let help = w.run(&["--help"]);
    assert_eq!(help.code, 0, "{}", help.stderr);
    assert!(help.stdout.contains("\n  worktree "), "{}", help.stdout);
    assert!(!help.stdout.contains("\n  worktrees "), "{}", help.stdout);
    let help = w.run(&["worktree", "--help"]);
    assert_eq!(help.code, 0, "{}", help.stderr);
    for verb in ["ls", "rm"] {
        assert!(
            help.stdout.contains(&format!("\n  {verb} ")),
            "{verb}:\n{}",
            help.stdout
        );
    }
}
