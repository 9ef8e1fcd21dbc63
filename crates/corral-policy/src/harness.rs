//! corral's layer over a harness's state: where it lives and how it is laid out.
//!
//! A jailed harness writes its state (sessions, settings, MCP servers, hooks, plugins, its own
//! `cli.js`, `.env` files) where the host's harness reads it as code the next time it starts.
//! So the jail never writes the host's state: per host user and profile corral keeps a layer,
//! `harness/PROFILE/` in its state directory, and the jail sees the host's state below it
//! (read-only) with the layer above, where every write goes. The layer persists across jailed
//! runs; `corral state diff|apply|reset` shows it, copies what the user picks to the host, or
//! drops it.

use std::path::{Path, PathBuf};

use crate::plan::{CodeKeys, Engine, HarnessState, StateDir, StateFile, StateLayer};
use crate::profile::Profile;
use crate::resolve::expand_home;

/// The layer's directory for `profile` in corral's state directory `state_dir`.
pub fn layer_dir(state_dir: &Path, profile: &str) -> PathBuf {
    state_dir.join("harness").join(profile)
}

/// The name of a state path in the layer: its path relative to the home (the absolute path
/// for one outside it), `%` written `%25` and `/` written `%2F`, so every state path has one
/// flat, distinct name.
pub fn key(path: &Path, home: &Path) -> String {
    let rel = path.strip_prefix(home).unwrap_or(path);
    rel.to_string_lossy()
        .replace('%', "%25")
        .replace('/', "%2F")
}

/// The layer of `profile` for the user whose home is `home`: an overlay per state directory
/// (a copy with `Engine::Docker`, which has no overlay volume), a copy per state file, and the
/// profile's code paths and code keys, `~/` expanded.
pub fn layer_for(profile: &Profile, home: &Path, state_dir: &Path, engine: Engine) -> HarnessState {
    let layer = layer_dir(state_dir, &profile.name);
    let dirs = profile
        .state_dirs
        .iter()
        .map(|d| {
            let host = expand_home(d, home);
            let key = key(&host, home);
            let base = layer.join("dirs").join(&key);
            let layer = match engine {
                Engine::Docker => StateLayer::Copy {
                    dir: base.join("copy"),
                },
                Engine::Native | Engine::Auto | Engine::Podman | Engine::Kube => {
                    StateLayer::Overlay {
                        upper: base.join("upper"),
                        work: base.join("work"),
                    }
                }
            };
            StateDir { host, key, layer }
        })
        .collect();
    let files = profile
        .state_files
        .iter()
        .map(|f| {
            let host = expand_home(f, home);
            let copy = layer.join("files").join(key(&host, home));
            StateFile { host, copy }
        })
        .collect();
    HarnessState {
        layer,
        dirs,
        files,
        code_paths: profile
            .state_code
            .iter()
            .map(|c| expand_home(c, home))
            .collect(),
        code_keys: profile
            .guard
            .iter()
            .map(|e| CodeKeys {
                path: expand_home(&e.file, home),
                format: e.format,
                keys: e.keys.clone(),
                commands: e.commands.clone(),
            })
            .collect(),
        signin_files: profile
            .signin
            .values()
            .map(|s| expand_home(&s.file, home))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_flat_and_distinct() {
        let home = Path::new("/home/u");
        assert_eq!(key(Path::new("/home/u/.claude"), home), ".claude");
        assert_eq!(key(Path::new("/home/u/.pi/agent"), home), ".pi%2Fagent");
        assert_eq!(key(Path::new("/home/u/.pi%2Fagent"), home), ".pi%252Fagent");
        assert_eq!(key(Path::new("/etc/x"), home), "%2Fetc%2Fx");
    }

    #[test]
    fn the_layer_of_claude_is_laid_out_per_key() {
        let home = Path::new("/home/u");
        let state = Path::new("/home/u/.local/state/corral");
        let p = crate::profile::profile("claude").unwrap();
        let l = layer_for(&p, home, state, Engine::Native);
        let base = PathBuf::from("/home/u/.local/state/corral/harness/claude");
        assert_eq!(l.layer, base);
        assert_eq!(
            l.dirs,
            vec![StateDir {
                host: "/home/u/.claude".into(),
                key: ".claude".into(),
                layer: StateLayer::Overlay {
                    upper: base.join("dirs/.claude/upper"),
                    work: base.join("dirs/.claude/work"),
                },
            }]
        );
        assert_eq!(
            l.files,
            vec![StateFile {
                host: "/home/u/.claude.json".into(),
                copy: base.join("files/.claude.json"),
            }]
        );
        let docker = layer_for(&p, home, state, Engine::Docker);
        assert_eq!(
            docker.dirs[0].layer,
            StateLayer::Copy {
                dir: base.join("dirs/.claude/copy")
            }
        );
        assert!(
            l.code_paths
                .contains(&PathBuf::from("/home/u/.claude/settings.json"))
        );
        assert_eq!(l.code_keys[0].path, PathBuf::from("/home/u/.claude.json"));
    }
}
