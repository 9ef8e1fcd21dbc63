//! Review mode's place in a run (corral-session `review/`, docs/review.md).

/// Review mode runs natively only: the container engines' project is a bind of the host's
/// directory (docs/backends.md).
pub fn native_only(plan: &corral_policy::Plan) -> anyhow::Result<()> {
    use corral_policy::plan::Engine;
    if plan.project.review.is_none() {
        return Ok(());
    }
    let native = match plan.engine {
        Engine::Native => true,
        Engine::Auto => corral_sandbox::probe::run().native_backend,
        Engine::Podman | Engine::Docker | Engine::Kube => false,
    };
    if !native {
        anyhow::bail!(
            "--review (filesystem.review) runs in the native jail only: with podman, docker or \
             Kubernetes the project is the host's directory itself; run with --engine native, \
             or without --review"
        );
    }
    Ok(())
}
