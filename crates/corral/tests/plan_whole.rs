//! `corral plan --json` is the library's plan for the same caller, whole: the command line adds,
//! drops and creates nothing.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use corral_policy::Plan;
use corral_policy::resolve::{Flags, Request, default_user_config, preview};
use corral_session::runplan::{RunInputs, planned_with};
use similar_asserts::assert_eq;

/// A fresh git project with a `.env`, a home, a config directory and an empty TMPDIR.
struct Fx {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    home: PathBuf,
    tmpdir: PathBuf,
    env: BTreeMap<String, String>,
}

fn fx() -> Fx {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    let (root, home, tmpdir) = (base.join("proj"), base.join("home"), base.join("tmp"));
    for d in [
        root.join(".git"),
        home.clone(),
        base.join("xdg"),
        tmpdir.clone(),
    ] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(root.join(".env"), "TOKEN=1").unwrap();
    let env = [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", home.to_str().unwrap()),
        ("XDG_CONFIG_HOME", base.join("xdg").to_str().unwrap()),
        ("TMPDIR", tmpdir.to_str().unwrap()),
        ("TERM", "xterm"),
        ("CORRAL_TEST_CANARY", "must-not-enter"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    Fx {
        _tmp: tmp,
        root,
        home,
        tmpdir,
        env,
    }
}

impl Fx {
    fn plan_json(&self, args: &[&str]) -> Plan {
        let out = Command::new(env!("CARGO_BIN_EXE_corral"))
            .arg("plan")
            .args(args)
            .arg("--json")
            .current_dir(&self.root)
            .env_clear()
            .envs(&self.env)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "corral plan {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The request `corral plan PROFILE` makes for this caller.
    fn request(&self, profile: &str, flags: Flags) -> Request {
        let ids = std::fs::metadata("/proc/self").unwrap();
        Request {
            cwd: self.root.clone(),
            profile: Some(profile.into()),
            command: Vec::new(),
            flags,
            env: self.env.clone(),
            home: self.home.clone(),
            uid: ids.uid(),
            gid: ids.gid(),
            corral_exe: Path::new(env!("CARGO_BIN_EXE_corral"))
                .canonicalize()
                .unwrap(),
            user_config: Some(default_user_config(&self.env, &self.home)),
        }
    }
}

#[test]
fn corral_plan_prints_the_librarys_whole_plan() {
    let f = fx();
    std::fs::write(
        f.root.join("corral.toml"),
        "[network]\nallow = [\"example.com\"]\n[limits]\npids = 99\n",
    )
    .unwrap();
    let shown = f.plan_json(&["pi", "--ro", "/usr/share"]);
    let flags = Flags {
        ro: vec![PathBuf::from("/usr/share")],
        ..Flags::default()
    };
    // What the run attaches (the executor's socket and skill, here) is in the plan shown too
    // (corral-session runplan.rs), with the caller's runtime directory for its private
    // directories (no XDG_RUNTIME_DIR here: /dev/shm where it is a tmpfs, else its TMPDIR).
    let mut inputs = RunInputs::for_plan(&preview(&f.request("pi", flags.clone())).unwrap());
    inputs.runtime_dir = corral_session::runplan::runtime_dir(None, f.tmpdir.clone());
    inputs.temp_dir = f.tmpdir.clone();
    let library = preview(&f.request("pi", flags)).unwrap();
    assert_eq!(shown, planned_with(&library, &inputs).plan);
}

#[test]
fn corral_plan_of_a_scratch_run_creates_nothing() {
    let f = fx();
    // A directory's mtime moves when an entry is made in it, even one removed again: set it
    // far in the past, so a scratch directory made and removed by `plan` would show.
    let past = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    let dir = std::fs::File::open(&f.tmpdir).unwrap();
    dir.set_modified(past).unwrap();
    let shown = f.plan_json(&["shell", "--scratch"]);
    assert!(shown.project.scratch);
    assert_eq!(shown.project.root.parent(), Some(f.tmpdir.as_path()));
    assert!(!shown.project.root.exists());
    let left: Vec<_> = std::fs::read_dir(&f.tmpdir).unwrap().collect();
    assert!(left.is_empty(), "corral plan left {left:?}");
    assert_eq!(
        std::fs::metadata(&f.tmpdir).unwrap().modified().unwrap(),
        past,
        "corral plan made an entry in TMPDIR"
    );
    // The control: a run's resolve does create it.
    let ran = corral_policy::resolve(&f.request(
        "shell",
        Flags {
            scratch: true,
            ..Flags::default()
        },
    ))
    .unwrap();
    assert!(ran.project.root.is_dir());
    assert_ne!(
        std::fs::metadata(&f.tmpdir).unwrap().modified().unwrap(),
        past
    );
    std::fs::remove_dir(&ran.project.root).unwrap();
}
