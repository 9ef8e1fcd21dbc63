//! The trust gate every run passes before a jail starts, and the [`Trusted`] plan it gives.
//!
//! A project's `corral.toml` comes with the repository. What it grants beyond the user's own
//! layers (`Plan::project_trust`, computed by the policy crate with each grant's place in the
//! file) is used only when the user trusted exactly that content: the store
//! (`corral_policy::trust`) holds the file's path and the SHA-256 of the bytes the plan was
//! resolved from, so an edited file is refused again. On a terminal the gate asks (default no);
//! elsewhere it refuses with the list and the command that accepts it.
//!
//! A [`Trusted<Plan>`] is built only here, by [`Resolved::gate`] or
//! [`Resolved::gate_in_worktree`] on a plan [`resolve`] made: what runs a jail takes a
//! `Trusted<Plan>`, so no entry point can forget the gate.

use std::collections::BTreeMap;
use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use corral_policy::plan::ProjectTrust;
use corral_policy::trust::{self, TrustStore};
use corral_policy::{Plan, Request};

/// A value that passed the trust gate. Its field is private: outside this crate a `Trusted` is
/// read, never built, so a backend handed one is handed a plan the gate passed.
///
/// The way in, which compiles: resolve, gate, run.
///
/// ```no_run
/// fn run(req: &corral_policy::Request) -> anyhow::Result<i32> {
///     let plan = corral_run::trust::resolve_trusted(req)?;
///     corral_run::native::run_plan(&plan, corral_session::Scope::Run, None)
/// }
/// ```
///
/// Each way around the gate does not compile (stable rustdoc does not compare the error codes;
/// each snippet was checked to fail with exactly its code, and the one above to compile). A
/// `Trusted` built by hand:
///
/// ```compile_fail,E0423
/// let plan = corral_policy::Plan::minimal(
///     std::path::Path::new("/p"),
///     std::path::Path::new("/h"),
///     Vec::new(),
/// );
/// let _forged = corral_run::Trusted(plan);
/// ```
///
/// or by the crate's own constructors for what it derives from a trusted plan:
///
/// ```compile_fail,E0624
/// let plan = corral_policy::Plan::minimal(
///     std::path::Path::new("/p"),
///     std::path::Path::new("/h"),
///     Vec::new(),
/// );
/// let _forged = corral_run::Trusted::handed_down(plan);
/// ```
///
/// ```compile_fail,E0624
/// use corral_policy::Plan;
/// use corral_run::Trusted;
///
/// fn widen(plan: Trusted<Plan>) -> Trusted<Plan> {
///     plan.map(|mut p| {
///         p.network.mode = corral_policy::plan::NetworkMode::Host;
///         p
///     })
/// }
/// ```
///
/// A plain `Plan` handed to the native or the container backend:
///
/// ```compile_fail,E0308
/// fn run(req: &corral_policy::Request) -> anyhow::Result<i32> {
///     let plan = corral_policy::resolve(req)?;
///     corral_run::native::run_plan(&plan, corral_session::Scope::Run, None)
/// }
/// ```
///
/// ```compile_fail,E0308
/// fn run(req: &corral_policy::Request) -> anyhow::Result<i32> {
///     let plan = corral_policy::resolve(req)?;
///     corral_run::engine::run_plan(&plan, Some(req), corral_session::Scope::Run)
/// }
/// ```
///
/// A [`Resolved`] made from any plan, to be gated as if `resolve` made it:
///
/// ```compile_fail,E0451
/// let plan = corral_policy::Plan::minimal(
///     std::path::Path::new("/p"),
///     std::path::Path::new("/h"),
///     Vec::new(),
/// );
/// let _made = corral_run::Resolved { plan };
/// ```
#[derive(Debug, Clone)]
pub struct Trusted<T>(T);

impl<T> Trusted<T> {
    /// The value, no longer vouched for.
    pub fn into_inner(self) -> T {
        self.0
    }

    /// A value corral itself handed to another of its processes after the gate passed it (an
    /// executor command's Plan, passed to `corral serve --jail-helper`; executor.rs): trusted as
    /// the one it was made from.
    pub(crate) fn handed_down(value: T) -> Trusted<T> {
        Trusted(value)
    }

    /// A value derived from a trusted one by corral itself (a run's confinement to its
    /// worktree, an executor command's plan from its run's): trusted as the one it came from.
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Trusted<U> {
        Trusted(f(self.0))
    }
}

impl<T> std::ops::Deref for Trusted<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// A plan resolved from a request, not yet through the gate: read it (a caller may refuse it
/// before the gate asks), then [`gate`](Resolved::gate) it.
#[derive(Debug)]
pub struct Resolved {
    plan: Plan,
}

/// Resolve `req` into a plan for the gate.
pub fn resolve(req: &Request) -> anyhow::Result<Resolved> {
    Ok(Resolved {
        plan: corral_policy::resolve(req)?,
    })
}

/// Resolve `req` and pass the trust gate: the plan a run starts from.
pub fn resolve_trusted(req: &Request) -> anyhow::Result<Trusted<Plan>> {
    resolve(req)?.gate()
}

impl Resolved {
    /// The resolved plan, for checks before the gate.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Before a jail starts from the plan: corral's own directories that it protects exist (so
    /// the jail cannot create them), and what the project's `corral.toml` grants is trusted.
    pub fn gate(self) -> anyhow::Result<Trusted<Plan>> {
        self.gate_with(None, &Caller::of_process()?)
    }

    /// The gate of a run in a worktree corral made (`corral run --worktree`): the worktree's
    /// `corral.toml` is trusted as [`gate`](Resolved::gate) trusts it, or when its bytes are
    /// exactly those the user trusted for `main_file`, the policy file of the repository's main
    /// worktree. The caller finds `main_file` from the repository's common git directory and
    /// checked that the worktree belongs to it (worktrees.rs); a jail that changed the
    /// worktree's file changed its bytes.
    pub fn gate_in_worktree(
        self,
        worktree: &Path,
        main_file: &Path,
    ) -> anyhow::Result<Trusted<Plan>> {
        self.gate_in_worktree_with(worktree, main_file, &Caller::of_process()?)
    }

    fn gate_in_worktree_with(
        self,
        worktree: &Path,
        main_file: &Path,
        caller: &Caller,
    ) -> anyhow::Result<Trusted<Plan>> {
        let worktree = worktree
            .canonicalize()
            .with_context(|| format!("cannot resolve the worktree {}", worktree.display()))?;
        let inherited = match &self.plan.project_trust {
            // Only the worktree's own policy file stands in for the main worktree's.
            Some(t) if t.file.parent() == Some(worktree.as_path()) => Some(main_file),
            _ => None,
        };
        self.gate_with(inherited, caller)
    }

    fn gate_with(
        self,
        inherited_from: Option<&Path>,
        caller: &Caller,
    ) -> anyhow::Result<Trusted<Plan>> {
        check(&self.plan, inherited_from, caller)?;
        Ok(Trusted(self.plan))
    }
}

/// Who runs the gate: the environment and home corral's directories and trust store are found
/// from, and whether a person can be asked.
struct Caller {
    env: BTreeMap<String, String>,
    home: PathBuf,
    terminal: bool,
}

impl Caller {
    fn of_process() -> anyhow::Result<Caller> {
        let (env, home) = env_home()?;
        Ok(Caller {
            env,
            home,
            terminal: std::io::stdin().is_terminal() && std::io::stderr().is_terminal(),
        })
    }
}

/// The caller's environment and home, as the policy crate sees them (HOME must be absolute).
pub fn env_home() -> anyhow::Result<(BTreeMap<String, String>, PathBuf)> {
    Ok(corral_policy::resolve::caller_env_and_home()?)
}

fn check(plan: &Plan, inherited_from: Option<&Path>, caller: &Caller) -> anyhow::Result<()> {
    let (env, home) = (&caller.env, &caller.home);
    trust::ensure_protected_dirs(plan, env, home)?;
    let Some(t) = plan.project_trust.as_ref().filter(|t| !t.grants.is_empty()) else {
        return Ok(());
    };
    let store_path = trust::store_path(env, home);
    let mut store = TrustStore::load(&store_path)?;
    if store.is_trusted(&t.file, &t.sha256) {
        return Ok(());
    }
    if let Some(main_file) = inherited_from
        && store.is_trusted(main_file, &t.sha256)
    {
        eprintln!(
            "corral: {} has exactly the content you trusted for {}",
            t.file.display(),
            main_file.display()
        );
        return Ok(());
    }
    let changed = store.get(&t.file).is_some();
    let listing = listing(t, changed);
    if caller.terminal {
        eprint!("corral: {listing}\ncorral: trust exactly this content and run? [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut answer)
            .context("cannot read the answer from the terminal")?;
        if matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            store.trust(&t.file, &t.sha256);
            store.save(&store_path)?;
            eprintln!(
                "corral: trusted {} (sha256 {}); recorded in {}",
                t.file.display(),
                t.sha256,
                store_path.display()
            );
            return Ok(());
        }
        bail!(
            "not trusted: nothing was run; review {} and run `corral trust` when you accept it",
            t.file.display()
        );
    }
    let root = t.file.parent().unwrap_or(Path::new("/"));
    bail!(
        "{listing}\n\
         Review the file, then trust exactly this content with:  corral trust {}\n\
         (or run with your own settings only:  --policy /dev/null)",
        corral_engine::shell_quote(&root.display().to_string())
    )
}

/// `plan`, resolved again from a running jail's request (live.rs), trusted when what its
/// project's `corral.toml` grants is trusted with exactly the content it was resolved from (a
/// file that grants nothing needs no trust), without asking; else the plan back.
pub(crate) fn trusted_without_asking(plan: Plan) -> anyhow::Result<Result<Trusted<Plan>, Plan>> {
    let (env, home) = env_home()?;
    trusted_without_asking_in(plan, &env, &home)
}

/// [`trusted_without_asking`] with the trust store of the caller whose environment and home
/// are `env` and `home`.
fn trusted_without_asking_in(
    plan: Plan,
    env: &BTreeMap<String, String>,
    home: &Path,
) -> anyhow::Result<Result<Trusted<Plan>, Plan>> {
    Ok(match is_trusted(&plan, env, home)? {
        true => Ok(Trusted(plan)),
        false => Err(plan),
    })
}

/// Whether what the project's `corral.toml` of `plan` grants is trusted with exactly the content
/// the plan was resolved from (a file that grants nothing needs no trust), without asking.
fn is_trusted(plan: &Plan, env: &BTreeMap<String, String>, home: &Path) -> anyhow::Result<bool> {
    let Some(t) = plan.project_trust.as_ref().filter(|t| !t.grants.is_empty()) else {
        return Ok(true);
    };
    let store = TrustStore::load(&trust::store_path(env, home))?;
    Ok(store.is_trusted(&t.file, &t.sha256))
}

/// What the file grants, one line each, and why it is asked.
fn listing(t: &ProjectTrust, changed: bool) -> String {
    let mut s = format!(
        "the project's policy file {} grants what only you may grant (a repository may be \
         hostile), and {}:",
        t.file.display(),
        if changed {
            "it changed since you trusted it"
        } else {
            "it is not trusted"
        }
    );
    for g in &t.grants {
        s.push_str("\n  ");
        s.push_str(g);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A home with no trust store, a project directory, and a caller who cannot be asked.
    struct Fixture {
        _dir: tempfile::TempDir,
        home: PathBuf,
        project: PathBuf,
    }

    impl Fixture {
        fn new() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().canonicalize().unwrap();
            let (home, project) = (root.join("home"), root.join("project"));
            std::fs::create_dir_all(&home).unwrap();
            std::fs::create_dir_all(&project).unwrap();
            Fixture {
                _dir: dir,
                home,
                project,
            }
        }

        fn caller(&self) -> Caller {
            Caller {
                env: BTreeMap::new(),
                home: self.home.clone(),
                terminal: false,
            }
        }

        /// A plan whose project file `file` (content `bytes`) grants a writable bind.
        fn granting(&self, file: &Path, bytes: &[u8]) -> Resolved {
            std::fs::write(file, bytes).unwrap();
            let mut plan = Plan::minimal(&self.project, &self.home, vec!["true".into()]);
            plan.project_trust = Some(ProjectTrust {
                file: file.to_path_buf(),
                sha256: trust::sha256_hex(bytes),
                grants: vec![format!("{}:2:1: filesystem.rw = [\"/\"]", file.display())],
            });
            Resolved { plan }
        }

        fn trust(&self, file: &Path, bytes: &[u8]) {
            let path = trust::store_path(&BTreeMap::new(), &self.home);
            let mut store = TrustStore::load(&path).unwrap();
            store.trust(file, &trust::sha256_hex(bytes));
            store.save(&path).unwrap();
        }
    }

    const GRANT: &[u8] = b"[filesystem]\nrw = [\"/\"]\n";

    #[test]
    fn an_untrusted_grant_is_refused_with_what_it_grants() {
        let f = Fixture::new();
        let file = f.project.join("corral.toml");
        let err = f
            .granting(&file, GRANT)
            .gate_with(None, &f.caller())
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("it is not trusted"), "{msg}");
        assert!(msg.contains("filesystem.rw"), "{msg}");
        assert!(msg.contains("corral trust"), "{msg}");
    }

    #[test]
    fn a_trusted_grant_passes_and_an_edit_is_refused_again() {
        let f = Fixture::new();
        let file = f.project.join("corral.toml");
        f.trust(&file, GRANT);
        let trusted = f
            .granting(&file, GRANT)
            .gate_with(None, &f.caller())
            .unwrap();
        assert_eq!(trusted.project.root, f.project);
        // The same file with other bytes: the trust was for the content, not the path.
        let edited = b"[filesystem]\nrw = [\"/\", \"/etc\"]\n";
        let err = f
            .granting(&file, edited)
            .gate_with(None, &f.caller())
            .unwrap_err();
        assert!(format!("{err:#}").contains("it changed since you trusted it"));
    }

    #[test]
    fn a_plan_that_grants_nothing_needs_no_trust() {
        let f = Fixture::new();
        let plan = Plan::minimal(&f.project, &f.home, vec!["true".into()]);
        Resolved { plan }.gate_with(None, &f.caller()).unwrap();
    }

    #[test]
    fn the_gate_makes_corrals_protected_directories_before_the_jail_can() {
        let f = Fixture::new();
        let mut plan = Plan::minimal(&f.project, &f.home, vec!["true".into()]);
        let config = trust::config_dir(&BTreeMap::new(), &f.home);
        plan.protected.push(config.clone());
        assert!(!config.exists());
        Resolved { plan }.gate_with(None, &f.caller()).unwrap();
        assert!(config.is_dir());
    }

    #[test]
    fn a_worktree_file_with_the_main_files_trusted_bytes_passes() {
        let f = Fixture::new();
        let main_file = f.project.join("corral.toml");
        f.trust(&main_file, GRANT);
        let worktree = f.home.join("wt");
        std::fs::create_dir(&worktree).unwrap();
        let wt_file = worktree.join("corral.toml");
        f.granting(&wt_file, GRANT)
            .gate_in_worktree_with(&worktree, &main_file, &f.caller())
            .unwrap();
        // Other bytes than the main worktree's trusted ones: refused.
        let err = f
            .granting(&wt_file, b"[filesystem]\nrw = [\"/srv\"]\n")
            .gate_in_worktree_with(&worktree, &main_file, &f.caller())
            .unwrap_err();
        assert!(format!("{err:#}").contains("it is not trusted"));
        // Without the worktree variant the same bytes are not trusted: the main file's trust
        // does not carry to another path.
        let err = f
            .granting(&wt_file, GRANT)
            .gate_with(None, &f.caller())
            .unwrap_err();
        assert!(format!("{err:#}").contains("it is not trusted"));
    }

    /// A running jail's policy resolved again (live.rs): applied only when the gate would pass it
    /// without asking; an untrusted or edited grant comes back as a plain plan.
    #[test]
    fn a_reload_is_trusted_only_with_the_trusted_content() {
        let f = Fixture::new();
        let file = f.project.join("corral.toml");
        let env = BTreeMap::new();
        let reload = |bytes: &[u8]| {
            let plan = f.granting(&file, bytes).plan;
            trusted_without_asking_in(plan, &env, &f.home)
                .unwrap()
                .map_err(Box::new)
        };
        assert!(reload(GRANT).is_err(), "an untrusted grant was applied");
        f.trust(&file, GRANT);
        let trusted = reload(GRANT).expect("the trusted content was refused");
        assert_eq!(trusted.project.root, f.project);
        let edited = b"[filesystem]\nrw = [\"/\", \"/etc\"]\n";
        let refused = reload(edited).expect_err("an edited grant was applied");
        assert!(refused.project_trust.is_some());
        // A plan that grants nothing needs no trust.
        let plain = Plan::minimal(&f.project, &f.home, vec!["true".into()]);
        assert!(
            trusted_without_asking_in(plain, &env, &f.home)
                .unwrap()
                .is_ok()
        );
    }

    #[test]
    fn a_policy_file_outside_the_worktree_does_not_inherit_the_main_files_trust() {
        let f = Fixture::new();
        let main_file = f.project.join("corral.toml");
        f.trust(&main_file, GRANT);
        let worktree = f.home.join("wt");
        std::fs::create_dir(&worktree).unwrap();
        // The plan's project file is elsewhere (not the worktree's own corral.toml).
        let other = f.home.join("elsewhere.toml");
        let err = f
            .granting(&other, GRANT)
            .gate_in_worktree_with(&worktree, &main_file, &f.caller())
            .unwrap_err();
        assert!(format!("{err:#}").contains("it is not trusted"));
    }
}
