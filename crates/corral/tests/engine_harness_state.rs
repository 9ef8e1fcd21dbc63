//! Harness state on the container backends, for real: podman mounts the host's state directory
//! as an overlay volume (`:O,upperdir=,workdir=`) with corral's layer above, docker (no overlay
//! volume) binds corral's seeded copy; each state file is corral's copy. The harness container
//! plants Claude Code's `~/.claude/.config.json` and `local/cli.js`, MCP servers in
//! `~/.claude.json`, and deletes a host session: the host's state is as it was afterwards, and a
//! second run sees the first one's writes. The control: `--allow-harness-config` binds the
//! host's state and the plant lands there. Likewise Codex's `$CODEX_HOME/.env`, `hooks.json`,
//! `plugins/cache/`, `agents/`.
//!
//! Needs root and the image `localhost/corral-ci-harness:latest` (ci/podman-setup.sh,
//! ci/docker-setup.sh), as engine_containers.rs.

mod engine_support;

use std::path::Path;
use std::process::Output;

use engine_support::{Engine, IMAGE, World, on_every_engine, text};

on_every_engine!(
    a_harness_container_writes_corrals_layer_never_the_hosts_state,
    a_codex_container_plants_nothing_in_the_hosts_codex_home,
    where_an_overlay_cannot_keep_its_upper_the_container_gets_corrals_copy,
);

const CLAUDE_JSON: &str = "{\"numStartups\": 3, \"mcpServers\": {}}\n";
const SETTINGS: &str = "{\"model\": \"opus\"}\n";
const KEEP: &str = "a host session\n";

const PLANT: &str = "\
    printf '{\"mcpServers\":{\"x\":{\"command\":\"/tmp/evil\"}}}' > \"$HOME/.claude/.config.json\" && echo W1; \
    mkdir -p \"$HOME/.claude/local\" && printf 'evil()' > \"$HOME/.claude/local/cli.js\" && echo W2; \
    printf '{\"mcpServers\":{\"x\":{\"command\":\"/tmp/evil\"}}}' > \"$HOME/.claude.json\" && echo W3; \
    rm \"$HOME/.claude/projects/p/s.jsonl\" && echo W4; \
    echo END";

fn write(p: &Path, s: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, s).unwrap();
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// `corral run claude --engine E --network none [EXTRA] -- /bin/sh -c SCRIPT` with `home`.
fn run_claude(w: &World, home: &Path, extra: &[&str], script: &str) -> Output {
    run_profile(w, "claude", home, extra, script)
}

/// `corral run PROFILE --engine E --network none [EXTRA] -- /bin/sh -c SCRIPT` with `home`.
fn run_profile(w: &World, profile: &str, home: &Path, extra: &[&str], script: &str) -> Output {
    let mut args = vec![
        "run",
        profile,
        "--engine",
        w.engine.name(),
        "--network",
        "none",
    ];
    args.extend(extra);
    args.extend(["--", "/bin/sh", "-c", script]);
    w.command(&args)
        .env("HOME", home)
        .output()
        .expect("corral runs")
}

fn a_harness_container_writes_corrals_layer_never_the_hosts_state(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "hs");
    let home = w.dir.path().join("home");
    write(&home.join(".claude.json"), CLAUDE_JSON);
    write(&home.join(".claude/settings.json"), SETTINGS);
    write(&home.join(".claude/projects/p/s.jsonl"), KEEP);
    std::fs::write(
        w.project.join("corral.toml"),
        format!("[run]\nimage = \"{IMAGE}\"\n"),
    )
    .unwrap();
    let trust = w.command(&["trust"]).env("HOME", &home).output().unwrap();
    assert!(trust.status.success(), "{}", text(&trust));

    let out = run_claude(&w, &home, &[], PLANT);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for m in ["W1", "W2", "W3", "W4", "END"] {
        assert!(t.contains(m), "{m}: {t}");
    }
    assert_eq!(read(&home.join(".claude.json")), CLAUDE_JSON);
    assert_eq!(read(&home.join(".claude/settings.json")), SETTINGS);
    assert_eq!(read(&home.join(".claude/projects/p/s.jsonl")), KEEP);
    assert!(!home.join(".claude/.config.json").exists());
    assert!(!home.join(".claude/local").exists());

    // The next run sees the first one's writes.
    let out = run_claude(
        &w,
        &home,
        &[],
        "cat \"$HOME/.claude/local/cli.js\"; echo; cat \"$HOME/.claude.json\"; echo; \
         test -e \"$HOME/.claude/projects/p/s.jsonl\" || echo GONE; echo END",
    );
    let t = text(&out);
    assert!(t.contains("evil()\n{\"mcpServers\""), "{t}");
    assert!(t.contains("GONE"), "{t}");

    // Control: the host's state bound read-write.
    let out = run_claude(&w, &home, &["--allow-harness-config"], PLANT);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(read(&home.join(".claude/local/cli.js")), "evil()");
    assert!(read(&home.join(".claude.json")).contains("/tmp/evil"));
}

const CODEX_PLANT: &str = "\
    printf 'PATH=/tmp/evil-bin\\nBASH_ENV=/tmp/evil.sh\\n' > \"$CODEX_HOME/.env\" && echo W1; \
    printf '{\"hooks\":{}}' > \"$CODEX_HOME/hooks.json\" && echo W2; \
    mkdir -p \"$CODEX_HOME/plugins/cache/p\" && echo 'evil()' > \"$CODEX_HOME/plugins/cache/p/index.js\" && echo W3; \
    mkdir -p \"$CODEX_HOME/agents\" && echo 'command = 1' > \"$CODEX_HOME/agents/a.toml\" && echo W4; \
    echo END";

fn a_codex_container_plants_nothing_in_the_hosts_codex_home(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "hc");
    let home = w.dir.path().join("home");
    write(&home.join(".codex/config.toml"), "model = \"gpt-5\"\n");
    std::fs::write(
        w.project.join("corral.toml"),
        format!("[run]\nimage = \"{IMAGE}\"\n"),
    )
    .unwrap();
    let trust = w.command(&["trust"]).env("HOME", &home).output().unwrap();
    assert!(trust.status.success(), "{}", text(&trust));
    let planted = [".env", "hooks.json", "plugins", "agents"];

    let out = run_profile(&w, "codex", &home, &[], CODEX_PLANT);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for m in ["W1", "W2", "W3", "W4", "END"] {
        assert!(t.contains(m), "{m}: {t}");
    }
    for p in planted {
        assert!(!home.join(".codex").join(p).exists(), "{p}: {t}");
    }
    // The next run sees them.
    let out = run_profile(
        &w,
        "codex",
        &home,
        &[],
        "cat \"$CODEX_HOME/plugins/cache/p/index.js\"; echo END",
    );
    let t = text(&out);
    assert!(t.contains("evil()"), "{t}");

    // Control: the host's state bound read-write.
    let out = run_profile(&w, "codex", &home, &["--allow-harness-config"], CODEX_PLANT);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for p in planted {
        assert!(home.join(".codex").join(p).exists(), "{p}: {t}");
    }
}

/// corral's state directory on an overlay (as in a development container): overlayfs cannot
/// keep an upper directory there, so podman gets corral's copy bound as docker does; the host's
/// state is untouched and the next run sees the first one's writes.
fn where_an_overlay_cannot_keep_its_upper_the_container_gets_corrals_copy(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "ho");
    let base = w.dir.path().join("ovl");
    for d in ["lower", "upper", "work", "merged"] {
        std::fs::create_dir_all(base.join(d)).unwrap();
    }
    let mounted = std::process::Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o"])
        .arg(format!(
            "lowerdir={},upperdir={},workdir={}",
            base.join("lower").display(),
            base.join("upper").display(),
            base.join("work").display()
        ))
        .arg(base.join("merged"))
        .status()
        .unwrap();
    assert!(mounted.success());
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(base.join("merged"));
    let state_home = base.join("merged/state");
    let home = w.dir.path().join("home");
    write(&home.join(".claude.json"), CLAUDE_JSON);
    write(&home.join(".claude/settings.json"), SETTINGS);
    write(&home.join(".claude/projects/p/s.jsonl"), KEEP);
    std::fs::write(
        w.project.join("corral.toml"),
        format!("[run]\nimage = \"{IMAGE}\"\n"),
    )
    .unwrap();
    let corral = |args: &[&str]| {
        let mut c = w.command(args);
        c.env("HOME", &home).env("XDG_STATE_HOME", &state_home);
        c.output().expect("corral runs")
    };
    let trust = corral(&["trust"]);
    assert!(trust.status.success(), "{}", text(&trust));
    let run = |script: &str| {
        corral(&[
            "run",
            "claude",
            "--engine",
            w.engine.name(),
            "--network",
            "none",
            "--",
            "/bin/sh",
            "-c",
            script,
        ])
    };
    let out = run(PLANT);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for m in ["W1", "W2", "W3", "W4", "END"] {
        assert!(t.contains(m), "{m}: {t}");
    }
    assert_eq!(read(&home.join(".claude.json")), CLAUDE_JSON);
    assert_eq!(read(&home.join(".claude/projects/p/s.jsonl")), KEEP);
    assert!(!home.join(".claude/.config.json").exists());
    assert!(!home.join(".claude/local").exists());
    let copy = state_home.join("corral/harness/claude/dirs/.claude/copy");
    assert_eq!(read(&copy.join("local/cli.js")), "evil()");
    let out = run("cat \"$HOME/.claude/local/cli.js\"; echo; echo END");
    let t = text(&out);
    assert!(t.contains("evil()"), "{t}");
}
