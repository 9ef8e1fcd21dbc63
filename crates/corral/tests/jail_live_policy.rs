//! The running jail's network rules follow the policy files (live.rs): `corral
//! allow`/`deny` take effect without a restart and are recorded; an edit of `corral.toml` the
//! user has not trusted does not widen the jail, nor does the jail's own attempt to write it;
//! the jail cannot reach its control socket, which does widen it from outside.
//!
//! The jail's script and the test take turns through files in the project (live_support): the
//! test waits for the audit record of a change before letting the jail try again, so nothing
//! depends on timing.

mod jail_support;
mod live_support;

use jail_support::*;
use live_support::*;

#[test]
fn corral_allow_reaches_the_running_jail_and_is_logged() {
    let w = World::new();
    let port = origin();
    write(&w.project.join("corral.toml"), &policy(""));
    w.trust_project(&[]);
    let script = format!(
        "{}step 1 \"BEFORE $(try before)\"\nwait_go 1\necho \"AFTER $(try after)\"\necho END\n",
        script_prelude(port)
    );
    let bg = Background::start(&w, &script);
    let before = wait_file(&w.project.join("step1"));
    assert_eq!(before.trim(), "BEFORE 403");
    let target = format!("127.0.0.1:{port}");
    corral_ok(&w, &["allow", &target]);
    let r = wait_record(&w, "live-policy", |r| summary(r).contains(&target));
    assert!(
        summary(&r).contains(&format!("network.allow +{target}")),
        "{r}"
    );
    go(&w, 1);
    let out = bg.finish();
    assert!(out.stdout.contains("AFTER 200"), "{}", out.both());
    // `corral log` shows the change with what it changed.
    let log = corral_ok(&w, &["log"]);
    assert!(
        log.stdout
            .lines()
            .any(|l| l.contains("live-policy") && l.contains(&format!("network.allow +{target}"))),
        "{}",
        log.stdout
    );
}

#[test]
fn corral_deny_cuts_new_connections_of_the_running_jail() {
    let w = World::new();
    let port = origin();
    let target = format!("127.0.0.1:{port}");
    write(
        &w.project.join("corral.toml"),
        &policy(&format!("\"{target}\"")),
    );
    w.trust_project(&[]);
    let script = format!(
        "{}step 1 \"BEFORE $(try before)\"\nwait_go 1\necho \"AFTER $(try after)\"\necho END\n",
        script_prelude(port)
    );
    let bg = Background::start(&w, &script);
    assert_eq!(wait_file(&w.project.join("step1")).trim(), "BEFORE 200");
    corral_ok(&w, &["deny", &target]);
    let r = wait_record(&w, "live-policy", |r| {
        summary(r).contains(&format!("network.deny +{target}"))
    });
    assert!(
        summary(&r).contains(&format!("network.allow -{target}")),
        "{r}"
    );
    go(&w, 1);
    let out = bg.finish();
    assert!(out.stdout.contains("AFTER 403"), "{}", out.both());
}

#[test]
fn an_untrusted_edit_of_corral_toml_does_not_widen_the_running_jail() {
    let w = World::new();
    let port = origin();
    let target = format!("127.0.0.1:{port}");
    write(&w.project.join("corral.toml"), &policy(""));
    w.trust_project(&[]);
    let script = format!(
        "{}step 1 \"BEFORE $(try before)\"\nwait_go 1\nstep 2 \"MID $(try mid)\"\nwait_go 2\n\
         echo \"AFTER $(try after)\"\necho END\n",
        script_prelude(port)
    );
    let bg = Background::start(&w, &script);
    assert_eq!(wait_file(&w.project.join("step1")).trim(), "BEFORE 403");
    // The attack: the file changes without the user's trust (a `git pull`, a tool, an editor
    // the user has not reviewed with `corral trust`), granting the destination.
    write(
        &w.project.join("corral.toml"),
        &policy(&format!("\"{target}\"")),
    );
    let r = wait_record(&w, "live-policy-refused", |_| true);
    assert!(summary(&r).contains("corral trust"), "{r}");
    go(&w, 1);
    assert_eq!(wait_file(&w.project.join("step2")).trim(), "MID 403");
    // The control: once the user trusts exactly this content, the same edit applies.
    w.trust_project(&[]);
    wait_record(&w, "live-policy", |r| {
        summary(r).contains(&format!("network.allow +{target}"))
    });
    go(&w, 2);
    let out = bg.finish();
    assert!(out.stdout.contains("AFTER 200"), "{}", out.both());
}

#[test]
fn the_jail_cannot_widen_itself_by_writing_its_policy_file() {
    let w = World::new();
    let port = origin();
    let target = format!("127.0.0.1:{port}");
    write(&w.project.join("corral.toml"), &policy(""));
    w.trust_project(&[]);
    let original = std::fs::read_to_string(w.project.join("corral.toml")).unwrap();
    // The jail appends the grant, then tries to replace the file whole.
    let widen = format!(
        "printf 'allow = [\"{target}\"]\\n' >> corral.toml 2>/dev/null; a=$?; \
         {{ cat corral.toml; printf '[network]\\nallow = [\"{target}\"]\\n'; }} > .p.tmp 2>/dev/null \
         && mv -f .p.tmp corral.toml 2>/dev/null; m=$?; rm -f .p.tmp"
    );
    let script = format!(
        "{}{widen}\nstep 1 \"WRITE append=$a replace=$m\"\nwait_go 1\n\
         echo \"AFTER1 $(try after1)\"\n{widen}\nstep 2 \"WRITE2 append=$a replace=$m\"\nwait_go 2\n\
         echo \"AFTER2 $(try after2)\"\necho END\n",
        script_prelude(port)
    );
    let bg = Background::start(&w, &script);
    let first = wait_file(&w.project.join("step1"));
    assert!(
        !first.contains("append=0") && !first.contains("replace=0"),
        "the jail wrote its policy file: {first}"
    );
    assert_eq!(
        std::fs::read_to_string(w.project.join("corral.toml")).unwrap(),
        original
    );
    // A change of the user's makes the run read the file again: the grant is not in it.
    corral_ok(&w, &["allow", "other.example"]);
    wait_record(&w, "live-policy", |r| summary(r).contains("other.example"));
    go(&w, 1);
    // corral allow rewrote the file in place: the jail's read-only bind of it is still there
    // (a rename over it would have detached the bind in the jail's namespace).
    let second = wait_file(&w.project.join("step2"));
    assert!(
        !second.contains("append=0") && !second.contains("replace=0"),
        "the jail wrote its policy file after corral allow: {second}"
    );
    assert!(
        !std::fs::read_to_string(w.project.join("corral.toml"))
            .unwrap()
            .contains(&target)
    );
    go(&w, 2);
    let out = bg.finish();
    assert!(out.stdout.contains("AFTER1 403"), "{}", out.both());
    assert!(out.stdout.contains("AFTER2 403"), "{}", out.both());
}

#[test]
fn the_jail_cannot_reach_its_control_socket_which_widens_it_from_outside() {
    let w = World::new();
    let port = origin();
    write(&w.project.join("corral.toml"), &policy(""));
    w.trust_project(&[]);
    let script = format!(
        r#"{}step 1 ready
wait_go 1
sock=$(cat sockpath)
python3 - "$sock" <<'PY'
import os, socket, sys
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(path)
    s.sendall(b"allow 127.0.0.1:{port}\n")
    print("CONTROL reached", s.recv(200))
except OSError as e:
    print("CONTROL unreachable", type(e).__name__)
try:
    print("CONTROL-DIR", os.listdir(os.path.dirname(path)))
except OSError as e:
    print("CONTROL-DIR unreachable", type(e).__name__)
PY
step 2 "INSIDE $(try inside)"
wait_go 2
echo "AFTER $(try after)"
echo END
"#,
        script_prelude(port)
    );
    let bg = Background::start(&w, &script);
    wait_file(&w.project.join("step1"));
    let socket = control_socket(&w);
    write(&w.project.join("sockpath"), socket.to_str().unwrap());
    go(&w, 1);
    assert_eq!(wait_file(&w.project.join("step2")).trim(), "INSIDE 403");
    // The control: the same request from outside the jail widens it.
    let answer = control(&socket, &format!("allow 127.0.0.1:{port}"));
    assert!(answer.starts_with("ok "), "{answer}");
    go(&w, 2);
    let out = bg.finish();
    assert!(out.stdout.contains("CONTROL unreachable"), "{}", out.both());
    assert!(
        out.stdout.contains("CONTROL-DIR unreachable"),
        "{}",
        out.both()
    );
    assert!(out.stdout.contains("AFTER 200"), "{}", out.both());
    wait_record(&w, "live-allow", |r| {
        summary(r).contains(&format!("127.0.0.1:{port}"))
    });
    // The registration is gone with the run.
    assert!(!socket.exists(), "{} left behind", socket.display());
}
