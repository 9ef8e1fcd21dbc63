//! `corral shim install|list|remove`: the shim finds the real binary further down PATH (never
//! itself or another shim), `list` shows what is installed, `remove` restores the directory to
//! exactly what it was.
//!
//! The shim calls the corral binary that installed it, by absolute path. These tests install
//! with a copy of corral, then replace that copy with a script that prints its arguments, so
//! what the shim would run is observed without needing a jail. (The jailed end-to-end run is in
//! shim_jailed.rs.)

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use similar_asserts::assert_eq;

mod etxtbsy;
use etxtbsy::OutputRetrying;

struct Setup {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    corral: PathBuf,
    shims: PathBuf,
    decoy: PathBuf,
    real: PathBuf,
    /// Only the programs the shim itself uses, so that no harness installed on the machine
    /// (a real `pi` in /usr/bin) is found by accident.
    tools: PathBuf,
}

fn write_exec(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().canonicalize().unwrap();
    let (bin, shims, decoy, real) = (
        root.join("bin"),
        root.join("shims"),
        root.join("decoy"),
        root.join("real"),
    );
    for d in [&bin, &shims, &decoy, &real] {
        std::fs::create_dir(d).unwrap();
    }
    let tools = root.join("tools");
    std::fs::create_dir(&tools).unwrap();
    for tool in ["dirname", "head", "grep"] {
        let found = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} is not installed"));
        std::os::unix::fs::symlink(found, tools.join(tool)).unwrap();
    }
    let corral = bin.join("corral");
    std::fs::copy(env!("CARGO_BIN_EXE_corral"), &corral).unwrap();
    for name in ["pi", "claude"] {
        write_exec(
            &real.join(name),
            &format!("#!/bin/sh\necho \"real {name} $*\"\n"),
        );
    }
    Setup {
        _tmp: tmp,
        root,
        corral,
        shims,
        decoy,
        real,
        tools,
    }
}

impl Setup {
    fn path(&self) -> String {
        format!(
            "{}:{}:{}:{tools}",
            self.shims.display(),
            self.decoy.display(),
            self.real.display(),
            tools = self.tools.display()
        )
    }

    fn corral(&self, args: &[&str]) -> Output {
        Command::new(&self.corral)
            .args(args)
            .env("PATH", self.path())
            .env("HOME", &self.root)
            .current_dir(&self.root)
            .output_retrying()
    }

    /// From now on "corral" prints its arguments, one per line.
    fn fake_corral(&self) {
        write_exec(&self.corral, "#!/bin/sh\nprintf '%s\\n' \"$@\"\n");
    }

    /// Run `cmdline` with sh, PATH set as a user's would be with the shims in front.
    fn sh(&self, cmdline: &str) -> Output {
        Command::new("/bin/sh")
            .args(["-c", cmdline])
            .env("PATH", self.path())
            .current_dir(&self.root)
            .output_retrying()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status,
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stdout)
}

#[test]
fn the_shim_runs_the_real_binary_never_itself() {
    let s = setup();
    let out = ok(&s.corral(&["shim", "install", "pi", "--dir", s.shims.to_str().unwrap()]));
    assert_eq!(
        out,
        format!(
            "{}: corral run pi -- {}\n",
            s.shims.join("pi").display(),
            s.real.join("pi").display()
        )
    );

    // Another shim earlier on PATH than the real binary (a second install elsewhere): skipped.
    std::fs::copy(s.shims.join("pi"), s.decoy.join("pi")).unwrap();
    s.fake_corral();
    let o = s.sh("pi first 'two words' \"\"");
    assert_eq!(
        ok(&o),
        format!(
            "run\npi\n--\n{}\nfirst\ntwo words\n\n",
            s.real.join("pi").display()
        )
    );

    // The real binary moves on PATH: found again at run time.
    let elsewhere = s.root.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::rename(s.real.join("pi"), elsewhere.join("pi")).unwrap();
    let o = Command::new(s.shims.join("pi"))
        .env(
            "PATH",
            format!(
                "{}:{}:{}:{tools}",
                s.shims.display(),
                s.decoy.display(),
                elsewhere.display(),
                tools = s.tools.display()
            ),
        )
        .output_retrying();
    assert_eq!(
        ok(&o),
        format!("run\npi\n--\n{}\n", elsewhere.join("pi").display())
    );

    // No real binary anywhere: 127 and a message, not a loop through the shims.
    std::fs::remove_file(elsewhere.join("pi")).unwrap();
    let o = s.sh("pi");
    assert_eq!(o.status.code(), Some(127));
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    assert!(
        text(&o.stderr).contains("cannot find the real pi on PATH"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn relative_path_entries_are_never_used() {
    let s = setup();
    ok(&s.corral(&["shim", "install", "pi", "--dir", s.shims.to_str().unwrap()]));
    s.fake_corral();
    // A `pi` planted in the current directory, with `.` on PATH before the real one.
    let planted = s.root.join("work");
    std::fs::create_dir(&planted).unwrap();
    write_exec(&planted.join("pi"), "#!/bin/sh\necho planted\n");
    let o = Command::new(s.shims.join("pi"))
        .env(
            "PATH",
            format!(
                "{}:.::{}:{tools}",
                s.shims.display(),
                s.real.display(),
                tools = s.tools.display()
            ),
        )
        .current_dir(&planted)
        .output_retrying();
    assert_eq!(
        ok(&o),
        format!("run\npi\n--\n{}\n", s.real.join("pi").display())
    );
}

#[test]
fn scratch_shims_and_list() {
    let s = setup();
    let dir = s.shims.to_str().unwrap();
    let out = ok(&s.corral(&["shim", "install", "pi", "claude", "--scratch", "--dir", dir]));
    let (sh, re) = (&s.shims, &s.real);
    assert_eq!(
        out,
        format!(
            "{0}/pi: corral run pi -- {1}/pi\n{0}/pi-ns: corral run pi --scratch -- {1}/pi\n\
             {0}/claude: corral run claude -- {1}/claude\n{0}/claude-ns: corral run claude --scratch -- {1}/claude\n",
            sh.display(),
            re.display()
        )
    );
    let list = ok(&s.corral(&["shim", "list", "--dir", dir]));
    assert_eq!(
        list,
        format!(
            "{0}/claude\tcorral run claude -- claude\n{0}/claude-ns\tcorral run claude --scratch -- claude\n\
             {0}/pi\tcorral run pi -- pi\n{0}/pi-ns\tcorral run pi --scratch -- pi\n",
            sh.display()
        )
    );
    s.fake_corral();
    assert_eq!(
        ok(&s.sh("pi-ns x")),
        format!("run\npi\n--scratch\n--\n{}/pi\nx\n", re.display())
    );
}

#[test]
fn the_only_real_binary_in_the_shim_dir_is_kept_and_run() {
    // `npm install -g` with prefix ~/.local puts the harness into ~/.local/bin itself.
    let s = setup();
    let dir = s.shims.to_str().unwrap();
    std::fs::rename(s.real.join("pi"), s.shims.join("pi")).unwrap();
    let out = ok(&s.corral(&["shim", "install", "pi", "--scratch", "--dir", dir]));
    let kept = s.shims.join(".corral-shim-displaced/pi");
    assert_eq!(
        out,
        format!(
            "moved the existing {dir}/pi to {0} (restored by `corral shim remove pi`)\n\
             {dir}/pi: corral run pi -- {0}\n{dir}/pi-ns: corral run pi --scratch -- {0}\n",
            kept.display()
        )
    );
    s.fake_corral();
    assert_eq!(
        ok(&s.sh("pi x")),
        format!("run\npi\n--\n{}\nx\n", kept.display())
    );
    assert_eq!(
        ok(&s.sh("pi-ns")),
        format!("run\npi\n--scratch\n--\n{}\n", kept.display())
    );
    // And the kept copy really is the harness.
    assert_eq!(ok(&s.sh(&format!("{} y", kept.display()))), "real pi y\n");
}

#[test]
fn remove_restores_the_previous_state() {
    let s = setup();
    let dir = s.shims.to_str().unwrap();
    // What the user had: their own `pi` script, a relative symlink `claude`, an unrelated file.
    std::fs::write(s.shims.join("pi"), "#!/bin/sh\necho mine\n").unwrap();
    std::fs::set_permissions(s.shims.join("pi"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::symlink("../real/claude", s.shims.join("claude")).unwrap();
    std::fs::write(s.shims.join("notes.txt"), "keep me").unwrap();
    let before = snapshot(&s.shims);

    let out = ok(&s.corral(&["shim", "install", "pi", "claude", "--scratch", "--dir", dir]));
    let kept = s.shims.join(".corral-shim-displaced");
    assert!(
        out.contains(&format!(
            "moved the existing {}/pi to {}/pi",
            dir,
            kept.display()
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "moved the existing {}/claude to {}/claude",
            dir,
            kept.display()
        )),
        "{out}"
    );
    // The displaced symlink pointed at the real claude: that is what the shim runs.
    assert!(
        out.contains(&format!(
            "{dir}/claude: corral run claude -- {}/claude",
            s.real.display()
        )),
        "{out}"
    );
    assert_ne!(snapshot(&s.shims), before);

    // Removing one profile restores only its files.
    let out = ok(&s.corral(&["shim", "remove", "pi", "--dir", dir]));
    assert_eq!(
        out,
        format!("removed {dir}/pi\nrestored {dir}/pi\nremoved {dir}/pi-ns\n")
    );
    assert_eq!(
        std::fs::read_to_string(s.shims.join("pi")).unwrap(),
        "#!/bin/sh\necho mine\n"
    );

    let out = ok(&s.corral(&["shim", "remove", "--dir", dir]));
    assert_eq!(
        out,
        format!("removed {dir}/claude\nrestored {dir}/claude\nremoved {dir}/claude-ns\n")
    );
    assert_eq!(snapshot(&s.shims), before);

    // Nothing left to remove; a file without the marker is never removed.
    let out = ok(&s.corral(&["shim", "remove", "pi", "--dir", dir]));
    assert_eq!(out, format!("no shims for pi in {dir}\n"));
    assert_eq!(snapshot(&s.shims), before);
}

#[test]
fn install_refuses_what_it_cannot_do() {
    let s = setup();
    let dir = s.shims.to_str().unwrap();
    let o = s.corral(&["shim", "install", "codex", "--dir", dir]);
    assert_eq!(o.status.code(), Some(125));
    assert_eq!(
        text(&o.stderr),
        format!(
            "corral: not found on PATH (outside {dir}): codex; install the harness first, then run `corral shim install` again\n"
        )
    );
    let o = s.corral(&["shim", "install", "nosuch", "--dir", dir]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        text(&o.stderr).contains("unknown profile \"nosuch\""),
        "{}",
        text(&o.stderr)
    );
    let o = s.corral(&["shim", "install", "shell", "--dir", dir]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        text(&o.stderr).contains("corral shell"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(std::fs::read_dir(&s.shims).unwrap().count(), 0);

    // No profile named: every harness found on PATH (here pi and claude), the rest skipped.
    let out = ok(&s.corral(&["shim", "install", "--dir", dir]));
    assert!(
        out.contains(&format!("{dir}/pi: corral run pi -- ")),
        "{out}"
    );
    assert!(
        out.contains(&format!("{dir}/claude: corral run claude -- ")),
        "{out}"
    );
    assert!(
        out.ends_with(&format!(
            "skipped, not found on PATH (outside {dir}): codex, gemini, opencode, aider\n"
        )),
        "{out}"
    );
}

#[test]
fn warns_when_the_shim_dir_is_not_first_on_path() {
    let s = setup();
    let o = Command::new(&s.corral)
        .args(["shim", "install", "pi", "--dir", s.shims.to_str().unwrap()])
        .env(
            "PATH",
            format!(
                "{}:{}:{tools}",
                s.real.display(),
                s.shims.display(),
                tools = s.tools.display()
            ),
        )
        .output_retrying();
    ok(&o);
    assert_eq!(
        text(&o.stderr),
        format!(
            "corral: {0} comes before {1} on PATH: `pi` still runs {0}/pi unjailed; put {1} first\n",
            s.real.display(),
            s.shims.display()
        )
    );
    let o = Command::new(&s.corral)
        .args(["shim", "install", "pi", "--dir", s.shims.to_str().unwrap()])
        .env(
            "PATH",
            format!("{}:{tools}", s.real.display(), tools = s.tools.display()),
        )
        .output_retrying();
    ok(&o);
    assert!(
        text(&o.stderr).contains("is not on PATH; add it in front"),
        "{}",
        text(&o.stderr)
    );
}

/// Every entry of a directory (recursively): name -> (mode, content or link target).
fn snapshot(dir: &Path) -> BTreeMap<String, (u32, String)> {
    let mut out = BTreeMap::new();
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, (u32, String)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.file_type().is_symlink() {
                out.insert(
                    rel,
                    (
                        0,
                        format!("-> {}", std::fs::read_link(&p).unwrap().display()),
                    ),
                );
            } else if m.is_dir() {
                out.insert(rel.clone(), (m.permissions().mode(), "dir".into()));
                walk(base, &p, out);
            } else {
                out.insert(
                    rel,
                    (m.permissions().mode(), std::fs::read_to_string(&p).unwrap()),
                );
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

#[test]
fn a_profile_s_own_arguments_come_after_the_real_binary() {
    // The codex profile runs `codex -c sandbox_mode="danger-full-access"` (Codex's bubblewrap
    // sandbox cannot start inside the jail); the shim keeps that, then the user's arguments.
    let s = setup();
    write_exec(&s.real.join("codex"), "#!/bin/sh\necho real codex\n");
    ok(&s.corral(&[
        "shim",
        "install",
        "codex",
        "--dir",
        s.shims.to_str().unwrap(),
    ]));
    s.fake_corral();
    assert_eq!(
        ok(&s.sh("codex exec 'a task'")),
        format!(
            "run\ncodex\n--\n{}\n-c\nsandbox_mode=\"danger-full-access\"\nexec\na task\n",
            s.real.join("codex").display()
        )
    );
}
