//! Nothing a jailed harness writes in its state reaches the host's state: the jail sees the
//! host's state directories read-only below corral's layer (an overlay; `harness/PROFILE` in
//! corral's state directory) and a copy of each state file. A jailed process plants what a host
//! run of the harness would start (Claude Code's `~/.claude/.config.json` with an MCP server and
//! its `~/.claude/local/cli.js`, Codex's `~/.codex/.env` with PATH and BASH_ENV, MCP servers in
//! `~/.claude.json`) and deletes a host state file: after the run the host's files are as they
//! were. A second jailed run sees the first run's writes. The control of each: the same run
//! with `--allow-harness-config` (the host's state bound read-write) plants on the host.
//! `corral state diff|apply|reset` are tested here too, with the attack of a link planted in
//! the layer (or on the host's side) that would make `apply` write outside the state directory.
//! Credentials in `~/.claude.json` reach the jail as placeholders only; the gateway puts the
//! host's real value into requests to the MCP server's host.

mod e2e_support;
mod jail_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use jail_support::*;

/// `corral run PROFILE --network none [EXTRA] -- sh -c SCRIPT` in `w`.
fn run_as(w: &World, profile: &str, extra: &[&str], script: &str) -> Out {
    let mut c = w.corral();
    c.args(["run", profile, "--network", "none"])
        .args(extra)
        .args(["--", "sh", "-c", script]);
    run(c)
}

/// `corral state ARGS...` in `w`.
fn state(w: &World, args: &[&str]) -> Out {
    let mut c = w.corral();
    c.arg("state").args(args);
    run(c)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

fn layer(w: &World, profile: &str) -> PathBuf {
    w.home.join(".local/state/corral/harness").join(profile)
}

const CLAUDE_JSON: &str = "{\"numStartups\": 3, \"mcpServers\": {}}\n";
const SETTINGS: &str = "{\"model\": \"opus\"}\n";
const KEEP: &str = "a host session\n";

/// The host's Claude Code state as after a few host runs.
fn claude_host(w: &World) {
    write(&w.home.join(".claude.json"), CLAUDE_JSON);
    write(&w.home.join(".claude/settings.json"), SETTINGS);
    write(&w.home.join(".claude/projects/p/s.jsonl"), KEEP);
}

/// What a hostile jail does to Claude Code's state: an MCP server in `.config.json` (read in
/// place of `~/.claude.json` when it exists), a `local/cli.js`, an MCP server in
/// `~/.claude.json`, a settings hook, a host session deleted.
const CLAUDE_PLANT: &str = "\
    printf '{\"mcpServers\":{\"x\":{\"command\":\"/tmp/evil\"}}}' > \"$HOME/.claude/.config.json\" && echo W1; \
    mkdir -p \"$HOME/.claude/local\" && printf 'evil()' > \"$HOME/.claude/local/cli.js\" && echo W2; \
    printf '{\"mcpServers\":{\"x\":{\"command\":\"/tmp/evil\"}}}' > \"$HOME/.claude.json\" && echo W3; \
    printf '{\"hooks\":{\"Stop\":[\"/tmp/evil\"]}}' > \"$HOME/.claude/settings.json\" && echo W4; \
    rm \"$HOME/.claude/projects/p/s.jsonl\" && echo W5; \
    echo END";

#[test]
fn a_jailed_claude_writes_its_layer_never_the_hosts_state_and_sees_it_next_run() {
    let w = World::new();
    claude_host(&w);
    let out = run_as(&w, "claude", &[], CLAUDE_PLANT);
    ran(&out, "END");
    // Every write worked in the jail: the harness runs as usual.
    for m in ["W1", "W2", "W3", "W4", "W5"] {
        assert!(out.stdout.contains(m), "{m}: {}", out.both());
    }
    // The host's state is byte for byte as it was.
    assert_eq!(read(&w.home.join(".claude.json")), CLAUDE_JSON);
    assert_eq!(read(&w.home.join(".claude/settings.json")), SETTINGS);
    assert_eq!(read(&w.home.join(".claude/projects/p/s.jsonl")), KEEP);
    assert!(!w.home.join(".claude/.config.json").exists());
    assert!(!w.home.join(".claude/local").exists());

    // A second jailed run sees what the first wrote (state persists for jailed runs).
    let out = run_as(
        &w,
        "claude",
        &[],
        "cat \"$HOME/.claude/.config.json\"; echo; cat \"$HOME/.claude/local/cli.js\"; echo; \
         cat \"$HOME/.claude.json\"; echo; test -e \"$HOME/.claude/projects/p/s.jsonl\" || \
         echo GONE; echo END",
    );
    ran(&out, "END");
    assert!(
        out.stdout
            .contains("\"command\":\"/tmp/evil\"}}}\nevil()\n{\"mcpServers\""),
        "{}",
        out.both()
    );
    assert!(out.stdout.contains("GONE"), "{}", out.both());

    // `corral state diff` shows each change, the code ones called out first.
    let diff = state(&w, &["diff", "claude"]);
    assert_eq!(diff.code, 0, "{}", diff.both());
    let h = |p: &str| w.home.join(p).display().to_string();
    let lines: Vec<&str> = diff.stdout.lines().take_while(|l| !l.is_empty()).collect();
    let code =
        |change: &str, path: &str, why: &str| format!("{change:<8} {}  [CODE: {why}]", h(path));
    assert_eq!(
        lines,
        vec![
            code(
                "added",
                ".claude/.config.json",
                &format!("code: {}", h(".claude/.config.json"))
            ),
            code(
                "added",
                ".claude/local/cli.js",
                &format!("code: {}", h(".claude/local"))
            ),
            code(
                "changed",
                ".claude/settings.json",
                &format!("code: {}", h(".claude/settings.json"))
            ),
            code("changed", ".claude.json", "code keys: mcpServers"),
            format!("deleted  {}", h(".claude/projects/p/s.jsonl")),
        ],
        "{}",
        diff.both()
    );
}

#[test]
fn control_with_allow_harness_config_the_plant_lands_on_the_host() {
    let w = World::new();
    claude_host(&w);
    let out = run_as(&w, "claude", &["--allow-harness-config"], CLAUDE_PLANT);
    ran(&out, "END");
    assert!(read(&w.home.join(".claude/.config.json")).contains("/tmp/evil"));
    assert_eq!(read(&w.home.join(".claude/local/cli.js")), "evil()");
    assert!(read(&w.home.join(".claude.json")).contains("/tmp/evil"));
    assert!(!w.home.join(".claude/projects/p/s.jsonl").exists());
}

const CODEX_PLANT: &str = "\
    printf 'PATH=/tmp/evil-bin\\nBASH_ENV=/tmp/evil.sh\\n' > \"$CODEX_HOME/.env\" && echo W1; \
    printf 'model = \"x\"\\nnotify = [\"/tmp/evil\"]\\n' > \"$CODEX_HOME/config.toml\" && echo W2; \
    printf '{\"hooks\":{\"SessionStart\":[{\"command\":\"/tmp/evil\"}]}}' > \"$CODEX_HOME/hooks.json\" && echo W3; \
    mkdir -p \"$CODEX_HOME/plugins/cache/p\" && echo 'evil()' > \"$CODEX_HOME/plugins/cache/p/index.js\" && echo W4; \
    mkdir -p \"$CODEX_HOME/agents\" && echo 'command = \"/tmp/evil\"' > \"$CODEX_HOME/agents/a.toml\" && echo W5; \
    echo END";

#[test]
fn a_jailed_codex_cannot_plant_an_env_file_on_the_host() {
    let w = World::new();
    write(&w.home.join(".codex/config.toml"), "model = \"gpt-5\"\n");
    let out = run_as(&w, "codex", &[], CODEX_PLANT);
    ran(&out, "END");
    for m in ["W1", "W2", "W3", "W4", "W5"] {
        assert!(out.stdout.contains(m), "{m}: {}", out.both());
    }
    for planted in [".env", "hooks.json", "plugins", "agents"] {
        assert!(!w.home.join(".codex").join(planted).exists(), "{planted}");
    }
    assert_eq!(
        read(&w.home.join(".codex/config.toml")),
        "model = \"gpt-5\"\n"
    );
    // The next jailed run has them; `corral state diff` calls each out as code.
    let out = run_as(
        &w,
        "codex",
        &[],
        "cat \"$CODEX_HOME/plugins/cache/p/index.js\"; echo END",
    );
    ran(&out, "END");
    assert!(out.stdout.contains("evil()"), "{}", out.both());
    let diff = state(&w, &["diff", "codex"]);
    assert_eq!(diff.code, 0, "{}", diff.both());
    for planted in [
        ".codex/.env",
        ".codex/hooks.json",
        ".codex/plugins/cache/p/index.js",
        ".codex/agents/a.toml",
    ] {
        let shown = w.home.join(planted).display().to_string();
        assert!(
            diff.stdout
                .lines()
                .any(|l| l.contains(&shown) && l.contains("[CODE: code: ")),
            "{planted}: {}",
            diff.stdout
        );
    }
    let config = w.home.join(".codex/config.toml").display().to_string();
    assert!(
        diff.stdout
            .lines()
            .any(|l| l.contains(&config) && l.contains("[CODE: code keys:")),
        "{}",
        diff.stdout
    );
    // Control: the host's directory bound read-write.
    let out = run_as(&w, "codex", &["--allow-harness-config"], CODEX_PLANT);
    ran(&out, "END");
    assert_eq!(
        read(&w.home.join(".codex/.env")),
        "PATH=/tmp/evil-bin\nBASH_ENV=/tmp/evil.sh\n"
    );
}

#[test]
fn apply_copies_what_the_user_picks_and_asks_for_code() {
    let w = World::new();
    claude_host(&w);
    let out = run_as(
        &w,
        "claude",
        &[],
        "echo notes > \"$HOME/.claude/notes.txt\"; mkdir -p \"$HOME/.claude/todos\"; \
         echo t > \"$HOME/.claude/todos/a.json\"; \
         printf '{\"mcpServers\":{}}' > \"$HOME/.claude/.config.json\"; echo END",
    );
    ran(&out, "END");
    let notes = w.home.join(".claude/notes.txt");
    let config = w.home.join(".claude/.config.json");
    let todos = w.home.join(".claude/todos");
    let applied = state(
        &w,
        &[
            "apply",
            "claude",
            "~/.claude/notes.txt",
            &todos.display().to_string(),
        ],
    );
    assert_eq!(applied.code, 0, "{}", applied.both());
    assert_eq!(read(&notes), "notes\n");
    assert_eq!(read(&todos.join("a.json")), "t\n");
    // Code: not without --yes (no terminal to ask on).
    let refused = state(&w, &["apply", "claude", "~/.claude/.config.json"]);
    assert_eq!(refused.code, 1, "{}", refused.both());
    assert!(refused.stderr.contains("is code"), "{}", refused.both());
    assert!(!config.exists());
    let yes = state(&w, &["apply", "claude", "--yes", "~/.claude/.config.json"]);
    assert_eq!(yes.code, 0, "{}", yes.both());
    assert_eq!(read(&config), "{\"mcpServers\":{}}");
    // The state file's copy, and a deletion.
    let out = run_as(
        &w,
        "claude",
        &[],
        "echo '{}' > \"$HOME/.claude.json\"; rm \"$HOME/.claude/notes.txt\"; echo END",
    );
    ran(&out, "END");
    let applied = state(
        &w,
        &[
            "apply",
            "claude",
            "--yes",
            "~/.claude.json",
            "~/.claude/notes.txt",
        ],
    );
    assert_eq!(applied.code, 0, "{}", applied.both());
    assert_eq!(read(&w.home.join(".claude.json")), "{}\n");
    assert!(!notes.exists());
    // Nothing left to apply but what was not picked.
    let diff = state(&w, &["diff", "claude", "--json"]);
    assert!(!diff.stdout.contains("notes.txt"), "{}", diff.both());
}

#[test]
fn a_link_planted_in_the_layer_or_the_hosts_state_never_makes_apply_write_outside() {
    let w = World::new();
    claude_host(&w);
    let outside = w.outside.display().to_string();
    // The jail plants links in its layer: one to a file outside, one to a directory outside.
    let out = run_as(
        &w,
        "claude",
        &[],
        &format!(
            "ln -s {outside}/secret.txt \"$HOME/.claude/evil\"; ln -s {outside} \"$HOME/.claude/dir\"; \
             mkdir -p \"$HOME/.claude/sub\"; echo planted > \"$HOME/.claude/sub/f\"; echo END"
        ),
    );
    ran(&out, "END");
    // A link is not copied; nothing is written through one in the layer.
    let a = state(
        &w,
        &[
            "apply",
            "claude",
            "--yes",
            "~/.claude/evil",
            "~/.claude/dir/f",
        ],
    );
    assert_eq!(a.code, 1, "{}", a.both());
    assert!(a.stderr.contains("symbolic link"), "{}", a.both());
    assert!(!w.home.join(".claude/evil").exists());
    assert_eq!(read(&w.outside.join("secret.txt")), OUTSIDE_SECRET);
    assert!(!w.outside.join("f").exists());
    // A link on the host's side (an earlier corral let a jail plant one): `sub` leads outside.
    std::os::unix::fs::symlink(&w.outside, w.home.join(".claude/sub")).unwrap();
    let a = state(&w, &["apply", "claude", "--yes", "~/.claude/sub/f"]);
    assert_eq!(a.code, 1, "{}", a.both());
    assert!(a.stderr.contains("symbolic link"), "{}", a.both());
    assert!(
        !w.outside.join("f").exists(),
        "apply wrote through the host's link"
    );
    // Control: with a plain directory there, the same apply writes the file.
    std::fs::remove_file(w.home.join(".claude/sub")).unwrap();
    let a = state(&w, &["apply", "claude", "--yes", "~/.claude/sub/f"]);
    assert_eq!(a.code, 0, "{}", a.both());
    assert_eq!(read(&w.home.join(".claude/sub/f")), "planted\n");
}

#[test]
fn reset_drops_the_layer_and_the_next_run_sees_the_hosts_state() {
    let w = World::new();
    claude_host(&w);
    let out = run_as(
        &w,
        "claude",
        &[],
        "echo jail > \"$HOME/.claude/settings.json\"; echo END",
    );
    ran(&out, "END");
    let r = state(&w, &["reset", "claude"]);
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(!layer(&w, "claude").exists());
    let out = run_as(
        &w,
        "claude",
        &[],
        "cat \"$HOME/.claude/settings.json\"; echo END",
    );
    ran(&out, "END");
    assert!(out.stdout.contains(SETTINGS), "{}", out.both());
}

#[test]
fn a_layer_that_cannot_be_mounted_refuses_the_run_and_never_binds_the_hosts_state() {
    let w = World::new();
    claude_host(&w);
    let out = run_as(&w, "claude", &[], "echo END");
    ran(&out, "END");
    // The overlay's work directory is on another file system than its upper one (a tmpfs):
    // the kernel refuses the overlay.
    let elsewhere = std::path::Path::new("/dev/shm").join(format!(
        "corral-hstate-test-{}",
        w.root.file_name().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&elsewhere).unwrap();
    let work = layer(&w, "claude").join("dirs/.claude/work");
    // Moved aside (the kernel made `work/work` mode 000).
    std::fs::rename(&work, work.with_extension("old")).unwrap();
    // A relative link: it leads to the same place from the jail's set-up, which sees the
    // host's root below a directory of its own.
    let up = "../".repeat(work.parent().unwrap().components().count() - 1);
    let rel = format!("{up}{}", elsewhere.strip_prefix("/").unwrap().display());
    std::os::unix::fs::symlink(&rel, &work).unwrap();
    let out = run_as(
        &w,
        "claude",
        &[],
        "echo planted > \"$HOME/.claude/settings.json\"; echo END",
    );
    let _ = std::fs::remove_dir_all(&elsewhere);
    assert_ne!(out.code, 0, "{}", out.both());
    assert!(!out.stdout.contains("END"), "{}", out.both());
    assert!(
        out.stderr
            .contains("mount corral's layer over the harness state (an overlay"),
        "{}",
        out.both()
    );
    assert_eq!(read(&w.home.join(".claude/settings.json")), SETTINGS);
}

#[test]
fn a_concurrent_run_writes_a_layer_of_its_own_merged_by_the_next_run() {
    let w = World::new();
    claude_host(&w);
    let go = w.project.join("go");
    let started = w.project.join("started");
    // The first run holds the layer until the test says go.
    let mut first = w.corral();
    first.args(["run", "claude", "--network", "none", "--", "sh", "-c"]).arg(format!(
        "echo one > \"$HOME/.claude/one\"; touch {}; while [ ! -e {} ]; do sleep 0.05; done; echo END1",
        started.display(),
        go.display()
    ));
    let handle = std::thread::spawn(move || run(first));
    while !started.exists() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let second = run_as(
        &w,
        "claude",
        &[],
        "echo two > \"$HOME/.claude/two\"; echo END2",
    );
    ran(&second, "END2");
    assert!(
        second.stderr.contains("a layer of its own"),
        "{}",
        second.both()
    );
    write(&go, "");
    let first = handle.join().unwrap();
    ran(&first, "END1");
    // The next run merges the second run's layer: both writes are there, none on the host.
    let third = run_as(
        &w,
        "claude",
        &[],
        "cat \"$HOME/.claude/one\" \"$HOME/.claude/two\"; echo END3",
    );
    ran(&third, "END3");
    assert!(third.stdout.contains("one\ntwo\n"), "{}", third.both());
    assert!(
        !layer(&w, "claude")
            .join("runs")
            .read_dir()
            .unwrap()
            .any(|_| true)
    );
    assert!(!w.home.join(".claude/one").exists() && !w.home.join(".claude/two").exists());
}

/// A TLS server for `host` with its own test CA (`dir/ca.pem`) on 127.0.0.1, appending each
/// request's headers as a JSON line to `dir/seen.jsonl`. Killed on drop.
const MCP_REAL: &str = "ghp_REALmcpREALmcpREALmcp0123";
const MCP_REAL_PART: &str = "REALmcpREALmcp";

#[test]
fn an_mcp_servers_token_reaches_the_jail_as_a_placeholder_and_its_host_as_the_real_one() {
    let Some(host) = e2e_support::loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    if Command::new("openssl").arg("version").output().is_err()
        || Command::new("curl").arg("--version").output().is_err()
    {
        eprintln!("skipping: openssl or curl missing");
        return;
    }
    let w = World::new();
    let mdir = w.root.join("mock");
    std::fs::create_dir_all(&mdir).unwrap();
    let m = e2e_support::header_mock(&mdir, &host);
    let port = m.port;
    write(
        &w.home.join(".claude.json"),
        &format!(
            "{{\"mcpServers\": {{\"m\": {{\"type\": \"http\", \"url\": \"https://{host}:{port}/mcp\",              \"headers\": {{\"Authorization\": \"Bearer {MCP_REAL}\"}}}}}}}}\n"
        ),
    );
    // The script never spells the real value: the pattern is assembled at run time. It reads
    // the header from ~/.claude.json as an MCP client would and calls the server with it.
    let half = &MCP_REAL_PART[..MCP_REAL_PART.len() / 2];
    let script = format!(
        "A={half}; PAT=$A$A; \
         if grep -rqs $PAT \"$HOME\"; then echo FILE-LEAK; else echo FILE-CLEAN; fi; \
         H=$(python3 -c 'import json,os; print(json.load(open(os.environ[\"HOME\"]+\"/.claude.json\"))[\"mcpServers\"][\"m\"][\"headers\"][\"Authorization\"])'); \
         echo BODY=$(curl -sS https://{host}:{port}/mcp -H \"Authorization: $H\"); echo END"
    );
    let policy = format!(
        "[network]\nmode = \"proxy\"\nallow = [\"{host}:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n"
    );
    write(&w.project.join("corral.toml"), &policy);
    w.trust_project(&[]);
    let run_claude = |extra: &[&str]| {
        let mut c = w.corral();
        c.env("SSL_CERT_FILE", mdir.join("ca.pem"))
            .args(["run", "claude", "--network", "proxy"])
            .args(extra)
            .args(["--", "sh", "-c", &script]);
        run(c)
    };
    let out = run_claude(&[]);
    ran(&out, "END");
    assert!(out.stdout.contains("FILE-CLEAN"), "{}", out.both());
    assert!(out.stdout.contains("BODY=mock-ok"), "{}", out.both());
    let seen = std::fs::read_to_string(mdir.join("seen.jsonl")).unwrap_or_default();
    assert!(
        seen.contains(&format!("Bearer {MCP_REAL}")),
        "mock saw: {seen}"
    );
    // corral's copy holds the placeholder; the host's file its real value, untouched.
    let copy = read(&layer(&w, "claude").join("files/.claude.json"));
    assert!(!copy.contains(MCP_REAL_PART), "{copy}");
    assert!(read(&w.home.join(".claude.json")).contains(MCP_REAL));
    // `corral state diff` does not count the placeholders as a change.
    let diff = state(&w, &["diff", "claude", "--json"]);
    assert_eq!(diff.stdout, "", "{}", diff.both());
    // A change the jail made, applied: the host's file keeps its real token, never the
    // placeholder.
    let out = run_as(
        &w,
        "claude",
        &[],
        "python3 -c 'import json,os; p=os.environ[\"HOME\"]+\"/.claude.json\"; d=json.load(open(p)); \
         d[\"numStartups\"]=9; json.dump(d, open(p, \"w\"))'; echo END",
    );
    ran(&out, "END");
    let applied = state(&w, &["apply", "claude", "--yes", "~/.claude.json"]);
    assert_eq!(applied.code, 0, "{}", applied.both());
    let host: serde_json::Value =
        serde_json::from_str(&read(&w.home.join(".claude.json"))).unwrap();
    assert_eq!(host["numStartups"], 9);
    assert_eq!(
        host["mcpServers"]["m"]["headers"]["Authorization"],
        format!("Bearer {MCP_REAL}")
    );
    // Control: the host's file bound read-write, the jail reads the real token.
    let out = run_claude(&["--allow-harness-config"]);
    ran(&out, "END");
    assert!(out.stdout.contains("FILE-LEAK"), "{}", out.both());
}

#[test]
fn where_an_overlay_cannot_keep_its_upper_the_jail_gets_corrals_copy_never_the_hosts_state() {
    if !is_root() {
        eprintln!("skipping: mounting the overlay that holds corral's state directory needs root");
        return;
    }
    let w = World::new();
    claude_host(&w);
    // The user is signed in on the host: the copy seeded from it gets an empty file as the
    // mount point of the placeholder, never the real tokens, and still holds none after the
    // user signs out on the host (a run then has no placeholder bound there).
    let creds = w.home.join(".claude/.credentials.json");
    let (access, refresh) = ("sk-ant-oat01-HSTATE", "sk-ant-ort01-HSTATE");
    write(
        &creds,
        &format!(
            "{{\"claudeAiOauth\":{{\"accessToken\":\"{access}ACCESSMARK\",\"refreshToken\":\
             \"{refresh}REFRESHMARK\",\"expiresAt\":1700000000000,\"scopes\":[\"user:inference\"]}}}}"
        ),
    );
    // corral's state directory on an overlay (as in a development container).
    let base = w.root.join("ovl");
    for d in ["lower", "upper", "work", "merged"] {
        std::fs::create_dir_all(base.join(d)).unwrap();
    }
    let mounted = Command::new("mount")
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
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(base.join("merged"));
    let state_home = base.join("merged/state");
    // What earlier runs wrote in an overlay's upper there (when the state directory was
    // elsewhere, or before this fallback): carried into the copy.
    let upper = state_home.join("corral/harness/claude/dirs/.claude/upper");
    std::fs::create_dir_all(upper.join("projects/p")).unwrap();
    std::fs::write(upper.join("projects/p/old.jsonl"), "OLD-HISTORY").unwrap();
    let run_here = |script: &str| {
        let mut c = w.corral();
        c.env("XDG_STATE_HOME", &state_home).args([
            "run",
            "claude",
            "--network",
            "none",
            "--",
            "sh",
            "-c",
            script,
        ]);
        run(c)
    };
    let mut c = w.corral();
    c.env("XDG_STATE_HOME", &state_home)
        .args(["plan", "claude"]);
    let plan = run(c);
    assert!(
        plan.stdout.contains("a run binds corral's copy"),
        "{}",
        plan.both()
    );
    let out = run_here(CLAUDE_PLANT);
    ran(&out, "END");
    assert!(
        out.stderr.contains("corral's copy of the harness state"),
        "{}",
        out.both()
    );
    assert_eq!(read(&w.home.join(".claude.json")), CLAUDE_JSON);
    assert_eq!(read(&w.home.join(".claude/settings.json")), SETTINGS);
    assert_eq!(read(&w.home.join(".claude/projects/p/s.jsonl")), KEEP);
    assert!(!w.home.join(".claude/.config.json").exists());
    assert!(!w.home.join(".claude/local").exists());
    let copy = state_home.join("corral/harness/claude/dirs/.claude/copy");
    assert_eq!(read(&copy.join("local/cli.js")), "evil()");
    // The next run sees it, and the earlier overlay's history; `corral state diff` shows
    // them.
    let out = run_here(
        "cat \"$HOME/.claude/local/cli.js\"; echo; cat \"$HOME/.claude/projects/p/old.jsonl\"; \
         echo; echo new > \"$HOME/.claude/projects/p/new.jsonl\"; echo END",
    );
    ran(&out, "END");
    assert!(out.stdout.contains("evil()"), "{}", out.both());
    assert!(out.stdout.contains("OLD-HISTORY"), "{}", out.both());
    assert!(!w.home.join(".claude/projects/p/new.jsonl").exists());
    let mut c = w.corral();
    c.env("XDG_STATE_HOME", &state_home)
        .args(["state", "diff", "claude"]);
    let diff = run(c);
    assert!(
        diff.stdout.contains(".claude/local/cli.js"),
        "{}",
        diff.both()
    );
    // `apply` copies from the copy, the layout these runs wrote.
    let mut c = w.corral();
    c.env("XDG_STATE_HOME", &state_home)
        .args(["state", "apply", "claude"]);
    c.arg(w.home.join(".claude/projects/p/new.jsonl"));
    let applied = run(c);
    assert_eq!(applied.code, 0, "{}", applied.both());
    assert_eq!(read(&w.home.join(".claude/projects/p/new.jsonl")), "new\n");

    // The markers are put together in the jail: the command line never spells them.
    let leak = "A=ACCESS; B=REFRESH; for m in ${A}MARK ${B}MARK; do \
                if grep -rqs \"$m\" \"$HOME\"; then echo LEAK-$m; fi; done; echo END";
    let out = run_here(leak);
    ran(&out, "END");
    assert!(!out.stdout.contains("LEAK"), "{}", out.both());
    std::fs::remove_file(&creds).unwrap();
    let out = run_here(leak);
    ran(&out, "END");
    assert!(!out.stdout.contains("LEAK"), "{}", out.both());
    assert_eq!(read(&copy.join(".credentials.json")), "");
    let mut c = w.corral();
    c.env("XDG_STATE_HOME", &state_home)
        .args(["state", "diff", "claude"]);
    let diff = run(c);
    assert!(
        !diff.stdout.contains(".credentials.json"),
        "{}",
        diff.both()
    );
}
