//! The layer's host-side operations on real directories: seeding without following links,
//! merging a concurrent run's layer without writing through a link planted in the shared one,
//! docker's copy compared both ways.

use std::path::{Path, PathBuf};

use corral_policy::plan::{Engine, HarnessState};

use super::*;

fn write(p: &Path, s: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, s).unwrap();
}

fn claude(home: &Path, engine: Engine) -> HarnessState {
    let p = corral_policy::profile::profile("claude").unwrap();
    corral_policy::harness::layer_for(&p, home, &home.join(".local/state/corral"), engine)
}

#[test]
fn a_state_file_that_is_a_link_is_not_followed_when_seeding() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path();
    write(&home.join("elsewhere/secret"), "SECRET");
    std::os::unix::fs::symlink(home.join("elsewhere/secret"), home.join(".claude.json")).unwrap();
    let state = claude(home, Engine::Native);
    let notes = seed_file(&state.files[0].host, &state.files[0].copy).unwrap();
    assert_eq!(std::fs::read_to_string(&state.files[0].copy).unwrap(), "");
    assert!(notes[0].contains("not a regular file"), "{notes:?}");
    // Control: a regular file is copied, 0600.
    std::fs::remove_file(home.join(".claude.json")).unwrap();
    std::fs::remove_file(&state.files[0].copy).unwrap();
    write(&home.join(".claude.json"), "{\"a\":1}");
    seed_file(&state.files[0].host, &state.files[0].copy).unwrap();
    assert_eq!(
        std::fs::read_to_string(&state.files[0].copy).unwrap(),
        "{\"a\":1}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&state.files[0].copy)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn merging_a_runs_layer_never_writes_through_a_link_in_the_shared_one() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path();
    let outside = home.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let state = claude(home, Engine::Native);
    let StateLayer::Overlay { upper, .. } = &state.dirs[0].layer else {
        unreachable!()
    };
    // The shared layer has `plugins` as a link out (a jail made it); the run's layer has a
    // directory `plugins` with a file in it.
    std::fs::create_dir_all(upper).unwrap();
    std::os::unix::fs::symlink(&outside, upper.join("plugins")).unwrap();
    let run = state.layer.join("runs/r1");
    write(&run.join("dirs/.claude/upper/plugins/p.js"), "evil");
    write(&run.join("dirs/.claude/upper/notes"), "n");
    std::fs::write(run.join("lock"), "").unwrap();
    let notes = merge_finished_runs(&state).unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(!outside.join("p.js").exists(), "merged through the link");
    assert_eq!(
        std::fs::read_to_string(upper.join("plugins/p.js")).unwrap(),
        "evil"
    );
    assert_eq!(std::fs::read_to_string(upper.join("notes")).unwrap(), "n");
    assert!(!run.exists());
}

#[test]
fn dockers_copy_is_seeded_without_links_and_compared_both_ways() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path();
    write(&home.join(".claude/settings.json"), "{}");
    write(&home.join(".claude/gone"), "g");
    write(&home.join("secret"), "SECRET");
    std::os::unix::fs::symlink(home.join("secret"), home.join(".claude/link")).unwrap();
    let state = claude(home, Engine::Docker);
    let StateLayer::Copy { dir } = &state.dirs[0].layer else {
        unreachable!()
    };
    let notes = seed_copy(&state.dirs[0].host, dir).unwrap();
    assert!(notes[0].contains("leaves out 1 links"), "{notes:?}");
    assert!(dir.join("link").symlink_metadata().is_err());
    assert_eq!(
        std::fs::read_to_string(dir.join("settings.json")).unwrap(),
        "{}"
    );
    // What a container run does to the copy.
    std::fs::remove_file(dir.join("gone")).unwrap();
    write(&dir.join("settings.json"), "{\"hooks\":1}");
    write(&dir.join("local/cli.js"), "x");
    let mut state = state;
    state.files.clear();
    let changes: Vec<(PathBuf, ChangeKind)> = diff(&state)
        .unwrap()
        .into_iter()
        .map(|c| (c.path, c.kind))
        .collect();
    let h = |p: &str| home.join(".claude").join(p);
    assert_eq!(
        changes,
        vec![
            (h("gone"), ChangeKind::Deleted),
            (h("local/cli.js"), ChangeKind::Added),
            (h("settings.json"), ChangeKind::Changed),
        ]
    );
}
