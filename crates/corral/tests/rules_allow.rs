//! `corral allow` / `corral deny` on real files: comments and key order kept, whole-file
//! comparisons, the loader's error text for a bad pattern, `--user`, file creation.

use std::path::Path;
use std::process::{Command, Output};

use similar_asserts::assert_eq;

const POLICY: &str = r#"# corral policy for this project
profile = "pi"   # the harness

[filesystem]
hide = [".env"]  # secrets stay out

# Network: who the agent may talk to.
[network]
mode = "proxy"
allow = [
    "api.anthropic.com",  # the model
    "*.github.com",
]
deny = ["gist.github.com"]  # no pastebins
allow_cidrs = []

[limits]
memory = "4g"
"#;

fn corral(cwd: &Path, env: &[(&str, &Path)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_corral"));
    cmd.current_dir(cwd)
        .args(args)
        .env_remove("XDG_CONFIG_HOME");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run corral")
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

/// A git project (a `.git` directory is what marks the root) with the commented policy, and a
/// subdirectory to run from.
fn project() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join(".git")).unwrap();
    std::fs::create_dir_all(d.path().join("src/deep")).unwrap();
    std::fs::write(d.path().join("corral.toml"), POLICY).unwrap();
    d
}

#[test]
fn allow_keeps_comments_and_key_order() {
    let d = project();
    let o = corral(
        &d.path().join("src/deep"),
        &[],
        &["allow", "Registry.NPMjs.org:443"],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let file = d.path().join("corral.toml");
    assert_eq!(
        text(&o.stdout),
        format!(
            "updated {}: network.allow += \"registry.npmjs.org:443\"\n",
            file.display()
        )
    );
    let want = POLICY.replace(
        "    \"*.github.com\",\n]",
        "    \"*.github.com\",\n    \"registry.npmjs.org:443\",\n]",
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), want);

    // Again: nothing changes, and it says so.
    let o = corral(d.path(), &[], &["allow", "registry.npmjs.org:443"]);
    assert!(o.status.success());
    assert_eq!(
        text(&o.stdout),
        format!(
            "network.allow in {} already has \"registry.npmjs.org:443\"\n",
            file.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), want);
}

#[test]
fn deny_appends_to_the_inline_array() {
    let d = project();
    let o = corral(d.path(), &[], &["deny", "pastebin.com"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let want = POLICY.replace(
        "deny = [\"gist.github.com\"]  # no pastebins",
        "deny = [\"gist.github.com\", \"pastebin.com\"]  # no pastebins",
    );
    assert_eq!(
        std::fs::read_to_string(d.path().join("corral.toml")).unwrap(),
        want
    );
}

#[test]
fn allowing_a_denied_pattern_takes_it_out_of_deny() {
    let d = project();
    let o = corral(d.path(), &[], &["allow", "gist.github.com"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let file = d.path().join("corral.toml");
    assert_eq!(
        text(&o.stdout),
        format!(
            "removed \"gist.github.com\" from network.deny in {0}\nupdated {0}: network.allow += \"gist.github.com\"\n",
            file.display()
        )
    );
    let want = POLICY
        .replace(
            "    \"*.github.com\",\n]",
            "    \"*.github.com\",\n    \"gist.github.com\",\n]",
        )
        .replace("deny = [\"gist.github.com\"]", "deny = []");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), want);
}

#[test]
fn bad_pattern_is_refused_with_the_loaders_error() {
    let d = project();
    for bad in [
        "evil.com:443.example.com",
        "*",
        "exa mple.com",
        "foo.*.com",
        "[fe80::1%eth0]",
    ] {
        let o = corral(d.path(), &[], &["allow", bad]);
        assert_eq!(o.status.code(), Some(125), "{bad}");
        assert!(o.stdout.is_empty());
        assert_eq!(
            std::fs::read_to_string(d.path().join("corral.toml")).unwrap(),
            POLICY
        );
        // What the policy loader says about the same pattern in a file, after FILE:LINE:COL.
        let other = tempfile::tempdir().unwrap();
        let file = other.path().join("corral.toml");
        std::fs::write(
            &file,
            format!("[network]\nallow = [{}]\n", toml_string(bad)),
        )
        .unwrap();
        let plan = corral(other.path(), &[], &["plan", "shell"]);
        assert_eq!(plan.status.code(), Some(125), "{bad}");
        let err = text(&plan.stderr);
        let prefix = format!("corral: {}:2:10: ", file.display());
        let loader = err
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("{err:?} does not start with {prefix:?}"))
            .trim_end();
        assert_eq!(text(&o.stderr), format!("corral: {loader}\n"), "{bad}");
    }
}

fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

#[test]
fn creates_the_project_file_when_missing() {
    let d = tempfile::tempdir().unwrap();
    let o = corral(d.path(), &[], &["allow", "*.example.org"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let file = d.path().join("corral.toml");
    assert_eq!(
        text(&o.stdout),
        format!(
            "created {}: network.allow += \"*.example.org\"\n",
            file.display()
        )
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "[network]\nallow = [\"*.example.org\"]\n"
    );
}

#[test]
fn user_flag_edits_the_user_config() {
    let d = project();
    let xdg = tempfile::tempdir().unwrap();
    let o = corral(
        d.path(),
        &[("XDG_CONFIG_HOME", xdg.path())],
        &["deny", "--user", "tracker.example"],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let user = xdg.path().join("corral/config.toml");
    assert_eq!(
        std::fs::read_to_string(&user).unwrap(),
        "[network]\ndeny = [\"tracker.example\"]\n"
    );
    assert_eq!(
        std::fs::read_to_string(d.path().join("corral.toml")).unwrap(),
        POLICY
    );

    // Without XDG_CONFIG_HOME: ~/.config.
    let home = tempfile::tempdir().unwrap();
    let o = corral(
        d.path(),
        &[("HOME", home.path())],
        &["allow", "--user", "a.example"],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        std::fs::read_to_string(home.path().join(".config/corral/config.toml")).unwrap(),
        "[network]\nallow = [\"a.example\"]\n"
    );
}

#[test]
fn a_file_without_network_gets_the_table_at_the_end() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("corral.toml");
    std::fs::write(
        &file,
        "# mine\nprofile = \"claude\"\n\n[limits]\npids = 512 # enough\n",
    )
    .unwrap();
    let o = corral(d.path(), &[], &["allow", "api.example.com"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "# mine\nprofile = \"claude\"\n\n[limits]\npids = 512 # enough\n\n[network]\nallow = [\"api.example.com\"]\n"
    );
}

#[test]
fn broken_toml_is_not_touched() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("corral.toml");
    std::fs::write(&file, "[network\nallow = [\n").unwrap();
    let o = corral(d.path(), &[], &["allow", "api.example.com"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(
        text(&o.stderr).contains(&file.display().to_string()),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "[network\nallow = [\n"
    );
}
