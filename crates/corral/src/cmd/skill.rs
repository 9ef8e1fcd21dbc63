//! `corral skill [PROFILE]`: print the SKILL.md that teaches a harness to use `corral exec`.

use std::process::ExitCode;

use anyhow::bail;

use crate::cli::SkillArgs;

/// Profiles whose harness gets the skill (SPEC section 7).
const PROFILES: &[&str] = &[
    "pi", "claude", "codex", "gemini", "opencode", "aider", "shell",
];

pub fn run(args: SkillArgs) -> anyhow::Result<ExitCode> {
    if let Some(p) = &args.profile
        && !PROFILES.contains(&p.as_str())
    {
        let hint = corral_policy::config::closest(p, PROFILES.iter().copied())
            .map(|n| format!(" (did you mean {n:?}?)"))
            .unwrap_or_default();
        bail!(
            "unknown profile {p:?}{hint}; known profiles: {}",
            PROFILES.join(", ")
        );
    }
    // Every profile gets the same text: pi and Claude Code load it as a skill (frontmatter
    // `name` and `description`), the others read it as plain instructions.
    out!("{}", corral_exec::SKILL_MD)?;
    Ok(ExitCode::SUCCESS)
}
