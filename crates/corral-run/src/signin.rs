//! `[signin.NAME]` for `corral run`: each harness credential file that exists on the host is
//! read here (the real tokens stay in this process, in the gateway), and the jail gets a file
//! of the same shape with placeholder tokens, bound read-write over the real file's path. The
//! harness may rewrite it (Claude Code's rename falls back to an in-place copy on a bind
//! target; Codex and Gemini CLI write in place); the user's own file is untouched by the jail
//! and updated by the gateway only, when it refreshes.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Context;
use corral_gateway::signin::Signin;
use corral_policy::plan::Plan;

/// The sign-ins of `plan` whose credential file exists.
pub fn load(plan: &Plan) -> anyhow::Result<Vec<Signin>> {
    let mut out = Vec::new();
    for p in &plan.signin {
        if let Some(s) = Signin::load(p.clone())? {
            out.push(s);
        }
    }
    Ok(out)
}

/// Write each sign-in's placeholder file into `dir` (private to corral's user), at the path
/// the RunPlan binds over the real file in the jail (`corral_session::runplan::signin_file`).
pub fn jail_files(signins: &[Signin], dir: &Path) -> anyhow::Result<()> {
    for s in signins {
        let path = corral_session::runplan::signin_file(dir, &s.plan().name);
        let data = s.placeholder_file()?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("creating the jail's sign-in file {}", path.display()))?;
        f.write_all(&data)
            .with_context(|| format!("writing the jail's sign-in file {}", path.display()))?;
    }
    Ok(())
}
