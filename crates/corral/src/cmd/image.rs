//! `corral image build [PROFILE]`: the harness image for the container engines.

use std::process::ExitCode;

use anyhow::{Context as _, bail};
use corral_engine::{EngineKind, image, runner};

use crate::cli::{EngineArg, ImageCommand};

pub fn run(cmd: ImageCommand) -> anyhow::Result<ExitCode> {
    let ImageCommand::Build {
        profile,
        engine,
        base,
        tag,
    } = cmd;
    let kind = match engine {
        Some(EngineArg::Podman) => EngineKind::Podman,
        Some(EngineArg::Docker) => EngineKind::Docker,
        Some(EngineArg::Auto) | Some(EngineArg::Native) | None => {
            runner::detect().context("`corral image build` needs podman or docker on PATH")?
        }
        Some(EngineArg::Kube) => bail!(
            "`corral image build` builds with podman or docker (--engine podman|docker); push \
             the image where the cluster's nodes pull from and pass it to `corral run --engine \
             kube --image IMAGE`"
        ),
    };
    let mut req =
        corral_policy::Request::from_process().context("cannot describe the calling process")?;
    req.profile = profile;
    let plan = corral_policy::resolve(&req)?;
    let profile = plan.profile.clone();
    let base = base
        .or_else(|| {
            std::env::var("CORRAL_BASE_IMAGE")
                .ok()
                .filter(|b| !b.is_empty())
        })
        .unwrap_or_else(|| image::default_base(&profile).to_string());
    let Some(dockerfile) = image::dockerfile(&profile, &base) else {
        bail!(
            "profile {profile:?} has no Dockerfile template; known: {}",
            image::PROFILES.join(", ")
        );
    };
    let tag = tag.unwrap_or_else(|| corral_engine::argv::harness_image(&plan));
    let dir = corral_audit::state_dir()?.join("images").join(&profile);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(dir.join("Containerfile"), &dockerfile)
        .with_context(|| format!("cannot write {}/Containerfile", dir.display()))?;
    let build = image::build_command(kind, &tag, &base, &dir);
    eprintln!("corral: {build}");
    // The engine's own progress goes straight to the terminal.
    let status = build
        .to_std()
        .status()
        .with_context(|| format!("cannot start {kind}"))?;
    if !status.success() {
        bail!(
            "`{build}` failed ({status}); the Containerfile is {}/Containerfile",
            dir.display()
        );
    }
    eprintln!("corral: built {tag}; `corral run --engine {kind}` uses it");
    Ok(ExitCode::SUCCESS)
}
