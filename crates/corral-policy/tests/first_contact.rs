//! What a first `corral run` chooses without being told: the project directory (and the rule
//! that chose it), and which limits are only corral's built-in defaults.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use corral_policy::plan::{LimitKinds, ProjectSource};
use corral_policy::{Flags, Request, resolve};

/// A home holding a git repository and a plain directory, in one temporary directory.
struct Fx {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    home: PathBuf,
}

fn fx() -> Fx {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    let home = base.join("home");
    for d in ["repo/.git", "repo/src", "plain/sub", ".ssh"] {
        std::fs::create_dir_all(home.join(d)).unwrap();
    }
    std::fs::write(base.join("corral-bin"), "").unwrap();
    Fx {
        _tmp: tmp,
        base,
        home,
    }
}

impl Fx {
    fn req(&self, cwd: &Path) -> Request {
        let env: BTreeMap<String, String> = [("PATH", "/nonexistent-corral-test-bin")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Request {
            cwd: cwd.to_path_buf(),
            profile: None,
            command: Vec::new(),
            flags: Flags::default(),
            env,
            home: self.home.clone(),
            uid: 1000,
            gid: 1000,
            corral_exe: self.base.join("corral-bin"),
            user_config: None,
        }
    }
}

fn chosen(req: &Request) -> (PathBuf, ProjectSource) {
    let plan = resolve(req).unwrap();
    (plan.project.root, plan.project.source)
}

#[test]
fn the_project_is_the_git_top_level_else_the_current_directory() {
    let f = fx();
    assert_eq!(
        chosen(&f.req(&f.home.join("repo/src"))),
        (f.home.join("repo"), ProjectSource::GitTopLevel)
    );
    assert_eq!(
        chosen(&f.req(&f.home.join("plain/sub"))),
        (f.home.join("plain/sub"), ProjectSource::CurrentDirectory)
    );
}

#[test]
fn the_home_and_what_contains_it_are_refused_unless_named() {
    let f = fx();
    for (cwd, why) in [
        (f.home.clone(), "it is your home directory"),
        (f.base.clone(), "it contains your home directory"),
        (PathBuf::from("/"), "it is the root of the filesystem"),
        (
            PathBuf::from("/usr"),
            "it is or contains the system directory /usr",
        ),
        (
            PathBuf::from("/etc"),
            "it is or contains the system directory /etc",
        ),
    ] {
        let err = resolve(&f.req(&cwd)).unwrap_err().to_string();
        assert!(err.contains(why), "{cwd:?}: {err}");
        // The message says how to choose instead.
        assert!(
            err.contains("--project DIR") && err.contains("--scratch"),
            "{err}"
        );
    }
    // A git repository whose top level is the home (a dotfiles repository) is refused too,
    // from any directory below that is not in a repository of its own.
    std::fs::create_dir_all(f.home.join(".git")).unwrap();
    let err = resolve(&f.req(&f.home.join("plain/sub")))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("it is your home directory")
            && err.contains("the top level of the enclosing git repository"),
        "{err}"
    );
    // Named explicitly, it is the user's choice.
    let mut req = f.req(&f.home.join("plain"));
    req.flags.project = Some(PathBuf::from(".."));
    assert_eq!(chosen(&req), (f.home.clone(), ProjectSource::ProjectFlag));
}

#[test]
fn a_directory_holding_corrals_own_state_is_refused() {
    let f = fx();
    let mut req = f.req(&f.home.join("plain"));
    req.env.insert(
        "XDG_STATE_HOME".into(),
        f.home.join("plain/state").display().to_string(),
    );
    let err = resolve(&req).unwrap_err().to_string();
    assert!(err.contains("contains corral's own directory"), "{err}");
    let mut req = f.req(&f.home.join("plain"));
    req.env.insert(
        "XDG_RUNTIME_DIR".into(),
        f.home.join("plain/run").display().to_string(),
    );
    let err = resolve(&req).unwrap_err().to_string();
    assert!(err.contains("contains your runtime directory"), "{err}");
}

#[test]
fn project_flag_names_exactly_that_directory() {
    let f = fx();
    let mut req = f.req(&f.home.join("repo/src"));
    req.flags.project = Some(PathBuf::from("."));
    let plan = resolve(&req).unwrap();
    assert_eq!(plan.project.root, f.home.join("repo/src"));
    assert_eq!(plan.project.source, ProjectSource::ProjectFlag);
    assert_eq!(plan.cwd, f.home.join("repo/src"));
    req.flags.project = Some(PathBuf::from("missing"));
    let err = resolve(&req).unwrap_err().to_string();
    assert!(
        err.contains("--project") && err.contains("missing"),
        "{err}"
    );
    req.flags.project = Some(PathBuf::from("."));
    req.flags.scratch = true;
    assert!(resolve(&req).is_err());
}

#[test]
fn scratch_says_so() {
    let f = fx();
    let mut req = f.req(&f.home);
    req.flags.scratch = true;
    req.env
        .insert("TMPDIR".into(), f.base.display().to_string());
    let plan = resolve(&req).unwrap();
    assert_eq!(plan.project.source, ProjectSource::Scratch);
    std::fs::remove_dir(&plan.project.root).unwrap();
}

#[test]
fn limits_nobody_set_are_marked_built_in() {
    let f = fx();
    let cwd = f.home.join("repo");
    let plan = resolve(&f.req(&cwd)).unwrap();
    let all = LimitKinds {
        memory: true,
        cpus: true,
        pids: true,
    };
    assert_eq!(plan.limits.built_in, all);
    // A flag sets one: that one follows `enforce`, the others stay built-in.
    let mut req = f.req(&cwd);
    req.flags.memory = Some("1g".into());
    assert_eq!(
        resolve(&req).unwrap().limits.built_in,
        LimitKinds {
            memory: false,
            ..all
        }
    );
    // A project file sets pids.
    std::fs::write(cwd.join("corral.toml"), "[limits]\npids = 50\n").unwrap();
    assert_eq!(
        resolve(&f.req(&cwd)).unwrap().limits.built_in,
        LimitKinds { pids: false, ..all }
    );
    // An explicit `enforce` applies to every limit.
    let mut req = f.req(&cwd);
    req.flags.enforce = Some(corral_policy::plan::Enforce::Strict);
    assert_eq!(
        resolve(&req).unwrap().limits.built_in,
        LimitKinds::default()
    );
}

#[test]
fn toolchains_come_into_native_jails_only() {
    let f = fx();
    std::fs::create_dir_all(f.home.join(".pyenv/bin")).unwrap();
    let cwd = f.home.join("repo");
    let plan = resolve(&f.req(&cwd)).unwrap();
    assert_eq!(plan.toolchains.len(), 1);
    let pyenv = f.home.join(".pyenv");
    assert!(plan.mounts.iter().any(|m| m.target == pyenv));
    let exec = plan.executor.jail.as_ref().unwrap();
    assert!(exec.mounts.iter().any(|m| m.target == pyenv));
    assert!(exec.env["PATH"].contains(&format!("{}/bin", pyenv.display())));
    assert_eq!(exec.env["PYENV_ROOT"], pyenv.display().to_string());
    // A container image brings its own.
    let mut req = f.req(&cwd);
    req.flags.engine = Some(corral_policy::plan::Engine::Podman);
    let plan = resolve(&req).unwrap();
    assert!(plan.toolchains.is_empty());
    assert!(!plan.mounts.iter().any(|m| m.target == pyenv));
}
