//! First contact without a jail: `corral plan` and `corral trust` from the home directory, run
//! as the real binary with HOME and the XDG directories in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

struct Home {
    _tmp: tempfile::TempDir,
    home: PathBuf,
}

fn home() -> Home {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().canonicalize().unwrap().join("home");
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    Home { _tmp: tmp, home }
}

fn corral(h: &Home, cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_corral"))
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .env("HOME", &h.home)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .unwrap()
}

#[test]
fn plan_from_the_home_is_refused_with_the_ways_out() {
    let h = home();
    let out = corral(&h, &h.home, &["plan"]);
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "refusing to make {} the project: it is your home directory",
            h.home.display()
        )) && err.contains("--project DIR")
            && err.contains("--scratch"),
        "{err}"
    );
    // `--project` and `--scratch` together name two projects: a usage error.
    let out = corral(&h, &h.home, &["plan", "--scratch", "--project", "."]);
    assert_eq!(out.status.code().map(|c| c != 0), Some(true));
}

#[test]
fn trust_takes_the_project_the_run_would_take() {
    let h = home();
    std::fs::write(
        h.home.join("corral.toml"),
        "[network]\nallow = [\"x.example.com\"]\n",
    )
    .unwrap();
    let home = h.home.display().to_string();
    // The home's corral.toml, for a run with --project ~: trusted with the same option.
    let out = corral(&h, &h.home, &["trust", "--project", &home]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = corral(&h, &h.home, &["plan", "--project", &home]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(rw; named with --project)"), "{text}");
    assert!(text.contains("trusted (this content"), "{text}");
}
