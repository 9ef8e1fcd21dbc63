//! `corral watch` driven in a real terminal (a pty): it shows the running jail's denial, and
//! its keys have their effect on the running jail and on `corral.toml`: `a` allows for the run
//! (the jail's next request succeeds, the file is untouched), `d` denies in `corral.toml` (which
//! beats the run's allow), `p` adds the allow to `corral.toml` with every comment kept. A
//! question about a name too long for the screen shows its registrable domain and port, and
//! `a` does not allow it.

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

/// A 253-character name that starts like `api.github.com`, asked about (`on_deny = "ask"`) on a
/// 120-column screen: the question shows the name's registrable domain and port, and `a` is
/// refused with a message (nothing allowed, the question still pending), `r` refuses it. Control:
/// the same question on a screen wide enough for the whole name is allowed by `a`.
#[test]
fn watch_shows_a_long_names_domain_and_port_and_does_not_allow_it_cut() {
    let w = World::new();
    // The second question names another port: a refused destination is not asked again.
    let (port, other) = (8443, 9443);
    let host = format!(
        "api.github.com.{}.{}.{}.{}.attacker.example",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(29)
    );
    assert_eq!(host.len(), 253);
    write(
        &w.project.join("corral.toml"),
        &policy("").replace(
            "[network]\n",
            "[network]\non_deny = \"ask\"\nask_timeout = 300\n",
        ),
    );
    w.trust_project(&[]);
    let script = format!(
        "{}get() {{ curl -s --max-time 200 --noproxy '' -o /dev/null -w '%{{http_code}}' \"$1\"; }}\n\
         step 1 ready\necho \"FIRST $(get http://{host}:{port}/x)\"\n\
         step 2 second\necho \"SECOND $(get http://{host}:{other}/y)\"\necho END\n",
        script_prelude(1)
    );
    let bg = Background::start(&w, &script);
    wait_file(&w.project.join("step1"));
    let socket = control_socket(&w);
    let pending = |socket: &std::path::Path| {
        let answer = control(socket, "asks");
        let json = answer.strip_prefix("ok ").expect(&answer).to_string();
        serde_json::from_str::<Vec<serde_json::Value>>(&json).unwrap()
    };
    let wait_pending = |n: usize| {
        let start = std::time::Instant::now();
        loop {
            let asks = pending(&socket);
            if asks.len() == n {
                return asks;
            }
            assert!(start.elapsed() < DEADLINE, "questions: {asks:?}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let asks = wait_pending(1);
    assert_eq!(asks[0]["host"], host.as_str());

    let mut watch = Watch::start_sized(corral_watch(&w), 30, 120);
    // The end of the name, the port, and the marker before them (no space inside, so it
    // arrives in one piece).
    watch.wait_for(0, "….attacker.example:8443");
    let from = watch.len();
    watch.key("a");
    watch.wait_for(from, "attacker.example:8443");
    watch.wait_for(from, "(253");
    watch.wait_for(from, "widen");
    // Nothing was allowed: the question still waits, and no allow for the run was recorded.
    let asks = pending(&socket);
    assert_eq!(asks.len(), 1, "{asks:?}");
    assert!(
        !w.audit_records()
            .iter()
            .any(|r| r["kind"] == "jail" && r["event"] == "live-allow"),
        "a name shown in part was allowed"
    );
    watch.key("r");
    assert!(watch.quit().success());
    wait_file(&w.project.join("step2"));

    // Control: on a screen the whole name fits on, `a` allows it for the run.
    wait_pending(1);
    let mut wide = Watch::start_sized(corral_watch(&w), 30, 400);
    wide.wait_for(0, &format!("{host}:{other}"));
    wide.key("a");
    wait_record(&w, "live-allow", |r| {
        summary(r).contains(&format!("{host}:{other}"))
    });
    assert!(wide.quit().success());
    let out = bg.finish();
    assert!(out.stdout.contains("FIRST 403"), "{}", out.both());
    assert!(!out.stdout.contains("SECOND 403"), "{}", out.both());
}

#[test]
fn watch_shows_a_pending_reviews_changes() {
    let w = World::new();
    let mut c = w.corral();
    c.args([
        "run",
        "--review",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        "echo x > made.txt && rm README && echo END",
    ]);
    let out = run(c);
    ran(&out, "END");
    let mut watch = Watch::start(corral_watch(&w));
    let at = watch.wait_for(0, "review:");
    for word in ["2", "pending", "added,", "deleted)", "made.txt", "README"] {
        watch.wait_for(at, word);
    }
    assert!(watch.quit().success());
    // Without a pending review there is no such line (the control): the first screen is drawn
    // whole (its last line, the keys, is there) without it.
    let mut c = w.corral();
    c.arg("discard");
    assert_eq!(run(c).code, 0);
    let mut watch = Watch::start(corral_watch(&w));
    watch.wait_for(0, "quit");
    assert!(!watch.text().contains("review:"), "{}", watch.text());
    assert!(watch.quit().success());
}
