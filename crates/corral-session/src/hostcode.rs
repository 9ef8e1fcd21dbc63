//! Names in a project that make a tool on the host run code or load configuration as code: a
//! shell's directory hook (`.envrc`), git's files, an editor's workspace tasks, a build file,
//! a package manifest's scripts, a harness's project settings (hooks, MCP servers). The change
//! summary lists a created, modified or deleted file whose path has one of these names first,
//! and never folds it into "and N more" (changes.rs `Changes::summary`).
//!
//! This list decides only what the summary shows first; nothing is allowed or refused by it.

/// A path component, compared whole (`Makefile`), or as a prefix (`.git` covers `.gitmodules`,
/// `.gitattributes`, `.github`), or as a suffix (`.mk`).
#[derive(Debug, Clone, Copy)]
enum Pattern {
    Is(&'static str),
    StartsWith(&'static str),
    EndsWith(&'static str),
}

use Pattern::*;

/// The names, one place. A path is host code when any of its components matches.
const HOST_CODE: &[Pattern] = &[
    // direnv, dotenv loaders, shells' version managers
    Is(".envrc"),
    StartsWith(".env"),
    Is(".tool-versions"),
    Is(".mise.toml"),
    Is("mise.toml"),
    // git: config, hooks, gitfiles, attributes (filters), modules
    StartsWith(".git"),
    Is(".pre-commit-config.yaml"),
    Is(".husky"),
    Is(".lefthook.yml"),
    Is("lefthook.yml"),
    // editors' workspace settings and tasks
    Is(".vscode"),
    Is(".idea"),
    Is(".devcontainer"),
    Is(".nvim.lua"),
    Is(".exrc"),
    Is(".vimrc"),
    Is(".dir-locals.el"),
    // harnesses' project settings (hooks, MCP servers)
    Is(".claude"),
    Is(".mcp.json"),
    Is(".codex"),
    Is(".gemini"),
    Is(".cursor"),
    Is(".opencode"),
    Is("opencode.json"),
    Is(".pi"),
    Is(".aider.conf.yml"),
    // build files and package manifests
    Is("Makefile"),
    Is("makefile"),
    Is("GNUmakefile"),
    EndsWith(".mk"),
    Is("justfile"),
    Is("Justfile"),
    Is("Taskfile.yml"),
    Is("package.json"),
    Is(".npmrc"),
    Is(".yarnrc"),
    Is(".yarnrc.yml"),
    Is(".pnpmfile.cjs"),
    Is("Cargo.toml"),
    Is("build.rs"),
    Is(".cargo"),
    Is("rust-toolchain.toml"),
    Is("rust-toolchain"),
    Is("setup.py"),
    Is("pyproject.toml"),
    Is("conftest.py"),
    Is("tox.ini"),
    Is("noxfile.py"),
    Is("Rakefile"),
    Is("Gemfile"),
    Is("go.mod"),
    Is("build.gradle"),
    Is("build.gradle.kts"),
    Is("settings.gradle"),
    Is("gradlew"),
    Is("pom.xml"),
    Is("mvnw"),
    Is("CMakeLists.txt"),
    Is("meson.build"),
    Is("flake.nix"),
    Is("shell.nix"),
    Is("default.nix"),
    Is("compose.yaml"),
    Is("compose.yml"),
    Is("docker-compose.yml"),
    Is("docker-compose.yaml"),
    Is("corral.toml"),
];

/// Whether `path` (relative to the project, `/`-separated; a trailing `/` for a directory)
/// names host code: one of its components matches [`HOST_CODE`].
pub fn is_host_code(path: &str) -> bool {
    path.split('/').filter(|c| !c.is_empty()).any(|c| {
        HOST_CODE.iter().any(|p| match *p {
            Is(n) => c == n,
            StartsWith(n) => c.starts_with(n),
            EndsWith(n) => c.len() > n.len() && c.ends_with(n),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_code_names_anywhere_in_the_path() {
        for p in [
            ".envrc",
            "sub/.envrc",
            ".env.local",
            ".git",
            ".gitmodules",
            ".gitattributes",
            "vendor/lib/.git",
            ".github/workflows/ci.yml",
            ".vscode/tasks.json",
            ".vscode/",
            "Makefile",
            "tools/rules.mk",
            "package.json",
            "web/package.json",
            ".claude/settings.json",
            ".mcp.json",
            "Cargo.toml",
            "crates/x/build.rs",
            ".cargo/config.toml",
            "conftest.py",
        ] {
            assert!(is_host_code(p), "{p}");
        }
        for p in [
            "README",
            "src/lib.rs",
            "f001",
            "docs/envrc.md",
            "mk",
            ".mk",
            "Makefile.bak",
            "my.git",
            "package.json5",
        ] {
            assert!(!is_host_code(p), "{p}");
        }
    }
}
