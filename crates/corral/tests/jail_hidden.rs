//! Secret files that appear during a run. `filesystem.hide` masks the project's matching files
//! when the run starts; a matching file made later would not be masked. The jail cannot make
//! one in the project (the name gate refuses the name, whichever syscall makes it); one the
//! host makes during the run is readable in the jail until the run ends (the limit), and the
//! end of the run names it (stderr and an `exposed` audit record). Runs as root and, through
//! scripts/test-rootless, unprivileged.

mod jail_support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use jail_support::*;

/// Every way to make a name in the project that the world's `hide` (`.env`, `.env.*`)
/// matches, each printing `MADE(name)` or `refused(name)`; then the same in the jail's own
/// /tmp, and a name no pattern matches, which must be made.
const ATTEMPTS: &str = r#"
try() { n=$1; shift; if "$@" 2>/dev/null; then echo "MADE($n)"; else echo "refused($n)"; fi; }
try redirect sh -c 'echo x > .env.local'
echo x > tmp1
try rename mv tmp1 .env.local
echo x > tmp2
try link ln tmp2 .env.prod
try symlink ln -s tmp2 .env.sym
try mkdir mkdir .env.d
mkdir -p app
try nested sh -c 'echo x > app/.env'
try python python3 -c '
import os, sys
try:
    os.open(".env.py", os.O_CREAT | os.O_WRONLY, 0o600)
except OSError as e:
    print("errno", e.errno)
    sys.exit(1)
'
try noreplace python3 -c '
import ctypes, sys
open("tmp3", "w").write("x")
libc = ctypes.CDLL(None, use_errno=True)
# RENAME_NOREPLACE onto a new hidden name
sys.exit(libc.renameat2(-100, b"tmp3", -100, b".env.x", 1) != 0)
'
try tmp-redirect sh -c 'echo x > /tmp/.env.local'
try tmp-rename sh -c 'echo x > /tmp/t && mv /tmp/t /tmp/.env.prod'
try tmp-mkdir mkdir /tmp/.env.d
try plain sh -c 'echo x > notes.txt && mv notes.txt env.example.txt'
echo END
"#;

/// The attempts made in the project.
const IN_PROJECT: [(&str, &str); 8] = [
    ("redirect", ".env.local"),
    ("rename", ".env.local"),
    ("link", ".env.prod"),
    ("symlink", ".env.sym"),
    ("mkdir", ".env.d"),
    ("nested", "app/.env"),
    ("python", ".env.py"),
    ("noreplace", ".env.x"),
];

#[test]
fn the_jail_cannot_make_a_name_filesystem_hide_matches_in_the_project() {
    let w = World::new();
    let out = w.sh("none", ATTEMPTS);
    let all = out.both();
    assert!(out.stdout.contains("END"), "the script did not end:\n{all}");
    for (attempt, name) in IN_PROJECT {
        assert!(
            out.stdout.contains(&format!("refused({attempt})")),
            "{attempt} was not refused:\n{all}"
        );
        assert!(
            std::fs::symlink_metadata(w.project.join(name)).is_err(),
            "{name} exists in the project:\n{all}"
        );
    }
    // EACCES, as a permission refusal.
    assert!(
        out.stdout.contains(&format!("errno {}", libc::EACCES)),
        "{all}"
    );
    // Control: the attempts work where the host cannot see them, and for other names.
    for attempt in ["tmp-redirect", "tmp-rename", "tmp-mkdir", "plain"] {
        assert!(
            out.stdout.contains(&format!("MADE({attempt})")),
            "{attempt} failed (the attempts themselves do not work):\n{all}"
        );
    }
    assert!(w.project.join("env.example.txt").exists(), "{all}");
    // Said, with what to do.
    assert!(
        out.stderr.contains("corral: refused creating")
            && out.stderr.contains("/.env.local")
            && out.stderr.contains("matches `filesystem.hide`")
            && out.stderr.contains("create it on the host"),
        "the refusal was not said:\n{all}"
    );
    // Nothing was made, so nothing is reported as exposed.
    assert!(!all.contains("was not masked in this run"), "{all}");
}

/// Control: without the name gate (`filesystem.allow_new_repositories`), the same attempts
/// make the names (the attack is real), and the end of the run names each as readable in the
/// jail.
#[test]
fn control_without_the_gate_the_names_are_made_and_the_end_of_the_run_names_them() {
    let w = World::new();
    w.allow_new_repositories();
    let out = w.sh("none", ATTEMPTS);
    let all = out.both();
    assert!(out.stdout.contains("END"), "the script did not end:\n{all}");
    for attempt in ["redirect", "link", "symlink", "mkdir", "nested", "python"] {
        assert!(
            out.stdout.contains(&format!("MADE({attempt})")),
            "{attempt} was refused without the gate:\n{all}"
        );
    }
    for name in [".env.local", ".env.prod", ".env.d", "app/.env", ".env.py"] {
        let path = w.project.join(name);
        assert!(path.exists(), "{name} was not made:\n{all}");
        assert!(
            out.stderr.contains(&format!(
                "{} matches `filesystem.hide` but was not masked in this run",
                path.display()
            )),
            "{name} was not named at the end of the run:\n{all}"
        );
    }
}

/// The jail, running `sh -c SCRIPT` in the project, not waited for.
fn spawn(w: &World, script: &str) -> Child {
    let mut c = w.corral();
    c.args(["run", "--network", "none", "--", "sh", "-c", script]);
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("corral")
}

/// Wait until `file` exists while `child` runs.
fn wait_for(child: &mut Child, file: &Path) {
    let start = Instant::now();
    while !file.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the jail ended ({status}) before {}", file.display());
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the jail never made {}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the jail printed, once it ended.
fn finish(mut child: Child) -> String {
    let mut out = String::new();
    let mut err = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    child.wait().unwrap();
    format!("{out}{err}")
}

/// A `.env` the host makes during the run is not masked (masking is decided when the run
/// starts): the jail reads it, which is the known limit, and the end of the run names it on
/// stderr and in an `exposed` audit record, so the user knows the jail saw it.
#[test]
fn a_hidden_file_the_host_makes_during_the_run_is_named_when_the_run_ends() {
    let w = World::new();
    std::fs::remove_file(w.project.join(".env")).unwrap();
    let secret = format!("HOST-MADE-{}", std::process::id());
    let env: PathBuf = w.project.join(".env");
    let mut jail = spawn(
        &w,
        ": > started; while [ ! -e go ]; do sleep 0.05; done; cat .env; echo; echo END",
    );
    wait_for(&mut jail, &w.project.join("started"));
    // The host (the user, a tool) makes `.env` while the jail runs.
    let host = {
        let (env, secret, go) = (env.clone(), secret.clone(), w.project.join("go"));
        std::thread::spawn(move || {
            std::fs::write(&env, format!("TOKEN={secret}\n")).unwrap();
            std::fs::write(go, "").unwrap();
        })
    };
    host.join().unwrap();
    let out = finish(jail);
    assert!(
        out.contains("END"),
        "the jail did not reach its end:\n{out}"
    );
    // The limit, shown: the jail read it.
    assert!(
        out.contains(&secret),
        "the jail did not read the host's new .env (the scenario did not happen):\n{out}"
    );
    let line = format!(
        "{} matches `filesystem.hide` but was not masked in this run",
        env.display()
    );
    assert!(
        out.contains(&line),
        "the end of the run did not name it:\n{out}"
    );
    assert!(out.contains("the next run masks it"), "{out}");
    assert!(
        w.audit_records()
            .iter()
            .any(|r| r["event"] == "exposed"
                && r["detail"].as_str().unwrap_or("").starts_with(&line)),
        "no exposed record:\n{out}"
    );
    // The .env of the project that was there at start (masked) is not named.
    assert!(!out.contains("sub/dir/.env matches"), "{out}");
}

/// After the first run the masking search answers from the project's tree index (kept in
/// corral's state directory), relisting only directories whose key changed. A `.env` the host
/// makes between runs, in a directory the index holds as unchanged since long before, is
/// masked on the next run all the same: adding it moved its directory's ctime. So is one made
/// in a directory created since.
#[test]
fn a_hidden_file_made_between_runs_is_masked_though_the_tree_index_is_kept() {
    let w = World::new();
    write(&w.project.join("deep/er/notes.txt"), "x\n");
    // Past the index's racy window, then two runs: the index is written, then trusted.
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..2 {
        let out = w.sh("none", "cat deep/er/notes.txt");
        assert_eq!(out.code, 0, "{}", out.both());
    }
    let state = w.home.join(".local/state/corral");
    let kept = std::fs::read_dir(&state)
        .unwrap()
        .flatten()
        .any(|e| e.path().join("tree-index").is_file());
    assert!(kept, "no tree index under {}", state.display());
    write(&w.project.join("deep/er/.env"), ENV_SECRET);
    write(&w.project.join("new/dir/.env.local"), ENV_SECRET);
    let out = w.sh(
        "none",
        "cat deep/er/.env new/dir/.env.local 2>&1; cat deep/er/notes.txt; echo END",
    );
    let all = out.both();
    assert!(out.stdout.contains("END"), "{all}");
    assert!(
        out.stdout.contains("x\n"),
        "the plain file was not read:\n{all}"
    );
    assert!(!all.contains(ENV_SECRET), "a hidden file was read:\n{all}");
}
