//! Harness images: a Dockerfile per profile (the seeds' shape: a small base, the harness, the
//! tools agents use) and the engine's build command.
//!
//! The templates live here until profiles carry their own (`corral_policy` profiles are data; when
//! they gain a Dockerfile template field, [`dockerfile`] should prefer it).

use std::path::Path;

use crate::{Command, EngineKind};

/// The tools every harness image carries (the seeds': bash git ripgrep fd jq curl).
const APT_TOOLS: &str = "bash ca-certificates curl fd-find git jq ripgrep";
const APK_TOOLS: &str = "bash ca-certificates curl fd git jq ripgrep";

/// The tag `corral run` uses when the policy names no image: `localhost/corral-<profile>:latest`.
pub fn default_tag(profile: &str) -> String {
    format!("localhost/corral-{profile}:latest")
}

/// The default base image of a profile (overridable: `corral image build --base IMAGE`).
pub fn default_base(profile: &str) -> &'static str {
    match profile {
        "aider" => "docker.io/library/python:3.12-slim-bookworm",
        "pi" | "claude" | "codex" | "gemini" | "opencode" => {
            "docker.io/library/node:22-bookworm-slim"
        }
        _ => "docker.io/library/debian:bookworm-slim",
    }
}

/// The harness install step of a profile, or `None` for a profile without one (`shell`).
fn install(profile: &str) -> Option<&'static str> {
    Some(match profile {
        // seed 003 installs pi with --ignore-scripts.
        "pi" => "npm install -g --ignore-scripts @earendil-works/pi-coding-agent",
        "claude" => "npm install -g @anthropic-ai/claude-code",
        "codex" => "npm install -g @openai/codex",
        "gemini" => "npm install -g @google/gemini-cli",
        "opencode" => "npm install -g opencode-ai",
        "aider" => "pip install --no-cache-dir aider-chat",
        _ => return None,
    })
}

/// Profiles with a Dockerfile.
pub const PROFILES: &[&str] = &[
    "pi", "claude", "codex", "gemini", "opencode", "aider", "shell",
];

/// The Dockerfile of `profile` on `base`.
pub fn dockerfile(profile: &str, base: &str) -> Option<String> {
    if !PROFILES.contains(&profile) {
        return None;
    }
    let mut s = format!(
        "# corral harness image for the {profile} profile, written by `corral image build`.\n\
         # The harness runs as the caller's uid (--userns keep-id / --user), on a read-only root.\n\
         ARG BASE={base}\n\
         FROM ${{BASE}}\n\
         USER root\n\
         RUN set -eu; \\\n\
         \x20   if command -v apt-get >/dev/null 2>&1; then \\\n\
         \x20       apt-get update; \\\n\
         \x20       DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {APT_TOOLS}; \\\n\
         \x20       rm -rf /var/lib/apt/lists/*; \\\n\
         \x20       ln -sf /usr/bin/fdfind /usr/local/bin/fd; \\\n\
         \x20   elif command -v apk >/dev/null 2>&1; then \\\n\
         \x20       apk add --no-cache {APK_TOOLS}; \\\n\
         \x20   else \\\n\
         \x20       echo \"corral: the base image has neither apt-get nor apk; pick another with --base\" >&2; exit 1; \\\n\
         \x20   fi\n"
    );
    if let Some(step) = install(profile) {
        s.push_str(&format!("RUN {step}\n"));
    }
    s.push_str("CMD [\"bash\"]\n");
    Some(s)
}

/// `podman build` / `docker build` of the context directory holding the Containerfile, with
/// the progress streamed by the engine itself.
pub fn build_command(engine: EngineKind, tag: &str, base: &str, context: &Path) -> Command {
    let file = context.join("Containerfile");
    let mut c = Command::new(engine.program()).args([
        "build".to_string(),
        "--tag".into(),
        tag.into(),
        "--build-arg".into(),
        format!("BASE={base}"),
        "--file".into(),
        file.display().to_string(),
    ]);
    if engine == EngineKind::Docker {
        c = c.args(["--progress", "plain"]);
    }
    c.arg(context.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_has_a_dockerfile_with_the_tools() {
        for p in PROFILES {
            let d = dockerfile(p, default_base(p)).unwrap();
            assert!(
                d.contains(&format!("ARG BASE={}\nFROM ${{BASE}}\n", default_base(p))),
                "{d}"
            );
            assert!(d.contains(APT_TOOLS), "{d}");
        }
        assert!(dockerfile("nope", "x").is_none());
    }

    #[test]
    fn pi_dockerfile_whole() {
        similar_asserts::assert_eq!(
            dockerfile("pi", "localhost/base:1").unwrap(),
            r#"# corral harness image for the pi profile, written by `corral image build`.
# The harness runs as the caller's uid (--userns keep-id / --user), on a read-only root.
ARG BASE=localhost/base:1
FROM ${BASE}
USER root
RUN set -eu; \
    if command -v apt-get >/dev/null 2>&1; then \
        apt-get update; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bash ca-certificates curl fd-find git jq ripgrep; \
        rm -rf /var/lib/apt/lists/*; \
        ln -sf /usr/bin/fdfind /usr/local/bin/fd; \
    elif command -v apk >/dev/null 2>&1; then \
        apk add --no-cache bash ca-certificates curl fd git jq ripgrep; \
    else \
        echo "corral: the base image has neither apt-get nor apk; pick another with --base" >&2; exit 1; \
    fi
RUN npm install -g --ignore-scripts @earendil-works/pi-coding-agent
CMD ["bash"]
"#
        );
    }

    #[test]
    fn build_argv_whole() {
        let c = build_command(
            EngineKind::Podman,
            "localhost/corral-pi:latest",
            "docker.io/library/node:22-bookworm-slim",
            Path::new("/s/image/pi"),
        );
        similar_asserts::assert_eq!(
            c.argv(),
            [
                "podman",
                "build",
                "--tag",
                "localhost/corral-pi:latest",
                "--build-arg",
                "BASE=docker.io/library/node:22-bookworm-slim",
                "--file",
                "/s/image/pi/Containerfile",
                "/s/image/pi"
            ]
        );
        let d = build_command(EngineKind::Docker, "t", "b", Path::new("/c"));
        similar_asserts::assert_eq!(
            d.argv(),
            [
                "docker",
                "build",
                "--tag",
                "t",
                "--build-arg",
                "BASE=b",
                "--file",
                "/c/Containerfile",
                "--progress",
                "plain",
                "/c"
            ]
        );
    }
}
