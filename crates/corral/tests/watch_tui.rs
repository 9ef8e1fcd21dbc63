//! `corral watch` driven in a real terminal (a pty): it shows the running jail's denial, and
//! its keys have their effect on the running jail and on `corral.toml`: `a` allows for the run
//! (the jail's next request succeeds, the file is untouched), `d` denies in `corral.toml` (which
//! beats the run's allow), `p` adds the allow to `corral.toml` with every comment kept.

mod jail_support;
mod live_support;
mod watch_support;

use jail_support::*;
use live_support::*;
use watch_support::{Watch, corral_watch};

#[test]
fn watch_allows_for_the_run_then_denies_in_corral_toml() {
    let w = World::new();
    let port = origin();
    let target = format!("127.0.0.1:{port}");
    let policy_file = w.project.join("corral.toml");
    write(&policy_file, &policy(""));
    w.trust_project(&[]);
    let script = format!(
        "{}step 1 \"BEFORE $(try before)\"\nwait_go 1\nstep 2 \"ALLOWED $(try allowed)\"\n\
         wait_go 2\necho \"DENIED $(try denied)\"\necho END\n",
        script_prelude(port)
    );
    let bg = Background::start(&w, &script);
    assert_eq!(wait_file(&w.project.join("step1")).trim(), "BEFORE 403");
    let mut watch = Watch::start(corral_watch(&w));
    // The denial, with the rule that denied it (words: the terminal skips cells that are
    // already blank, so a phrase arrives in pieces).
    watch.wait_for(0, &target);
    watch.wait_for(0, "network.allow");
    let before = std::fs::read_to_string(&policy_file).unwrap();
    watch.key("a");
    wait_record(&w, "live-allow", |r| summary(r).contains(&target));
    go(&w, 1);
    assert_eq!(wait_file(&w.project.join("step2")).trim(), "ALLOWED 200");
    assert_eq!(
        std::fs::read_to_string(&policy_file).unwrap(),
        before,
        "an allow for the run is written nowhere"
    );
    // `d` on the same denial: into corral.toml's deny list, which wins over the run's allow.
    watch.key("d");
    wait_record(&w, "live-policy", |r| {
        summary(r).contains(&format!("network.deny +{target}"))
    });
    let text = std::fs::read_to_string(&policy_file).unwrap();
    assert!(text.contains(&format!("deny = [\"{target}\"]")), "{text}");
    assert!(
        text.starts_with("# corral.toml of the live-policy test: this comment stays\n"),
        "{text}"
    );
    go(&w, 2);
    let out = bg.finish();
    assert!(out.stdout.contains("DENIED 403"), "{}", out.both());
    assert!(watch.quit().success());
}

#[test]
fn watch_adds_the_allow_to_corral_toml_keeping_its_comments() {
    let w = World::new();
    let port = origin();
    let target = format!("127.0.0.1:{port}");
    let policy_file = w.project.join("corral.toml");
    write(&policy_file, &policy(""));
    w.trust_project(&[]);
    let script = format!(
        "{}step 1 \"BEFORE $(try before)\"\nwait_go 1\necho \"AFTER $(try after)\"\necho END\n",
        script_prelude(port)
    );
    let bg = Background::start(&w, &script);
    assert_eq!(wait_file(&w.project.join("step1")).trim(), "BEFORE 403");
    let mut watch = Watch::start(corral_watch(&w));
    watch.wait_for(0, &target);
    watch.key("p");
    wait_record(&w, "live-policy", |r| {
        summary(r).contains(&format!("network.allow +{target}"))
    });
    // The whole file: only the one array gained the element.
    assert_eq!(
        std::fs::read_to_string(&policy_file).unwrap(),
        policy(&format!("\"{target}\""))
    );
    go(&w, 1);
    let out = bg.finish();
    assert!(out.stdout.contains("AFTER 200"), "{}", out.both());
    // The file stays trusted: the next run starts without asking.
    let again = w.sh("proxy", "echo END");
    ran(&again, "END");
    assert!(watch.quit().success());
}

#[test]
fn watch_without_a_terminal_says_so() {
    let w = World::new();
    let mut c = w.corral();
    c.arg("watch");
    let out = run(c);
    assert_eq!(out.code, 125, "{}", out.both());
    assert!(
        out.stderr
            .contains("corral watch draws on a terminal and reads its keys"),
        "{}",
        out.both()
    );
}
