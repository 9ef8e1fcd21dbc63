//! The real aider (`aider-chat` from PyPI, in a virtualenv) jailed end to end: `corral run
//! aider` in the native jail, network through corral's proxy, `OPENAI_API_KEY` served by the
//! credential gateway. The model is the scripted mock (tests/fixtures/mock-model/server.py)
//! speaking OpenAI chat completions over HTTPS (`OPENAI_API_BASE`, through litellm). aider has no
//! tool calls: the mock's answer is what a model writes for aider, a SEARCH/REPLACE block that
//! creates a project file and a shell block that reads host secrets and reaches a host the
//! policy does not allow. aider asks before creating the file and before running the commands;
//! with `--message` and stdin closed each question takes its default answer (yes), as a user
//! pressing Enter would (`--yes-always` would refuse the shell commands). The test judges each
//! on the host.

mod e2e_support;
mod jail_support;

use std::path::PathBuf;

use e2e_support::*;
use jail_support::*;

const REAL: &str = "sk-proj-REALkeyREALkeyREALkey0123456789abc";
const REAL_PART: &str = "REALkeyREALkey";

/// Where .ci/run installs aider (a virtualenv of its own), or `CORRAL_TEST_AIDER`, or PATH.
fn aider() -> Option<PathBuf> {
    std::env::var_os("CORRAL_TEST_AIDER")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from("/opt/corral-ci-aider/bin/aider")))
        .filter(|p| p.is_file())
        .or_else(|| which("aider"))
}

/// A world with the mock scripted by `script`. aider needs a git identity: without one it
/// writes a placeholder into the repository's .git/config, which corral keeps read-only, and
/// stops. The user's ~/.gitconfig, given to the jail read-only in their corral config (SPEC's
/// own example).
fn aider_world(
    host: &str,
    script: impl FnOnce(&Attacks) -> serde_json::Value,
) -> (World, PathBuf, Mock) {
    let (w, mdir, m) = world_with_mock(host, script, "OPENAI_API_KEY");
    write(
        &w.home.join(".gitconfig"),
        "[user]\n\tname = Jail Tester\n\temail = tester@example.com\n",
    );
    let user_config = w.home.join(".config/corral/config.toml");
    let mut config = std::fs::read_to_string(&user_config).unwrap();
    config = config.replace(
        "[filesystem]\n",
        "[filesystem]\nread_only = [\"~/.gitconfig\"]\n",
    );
    write(&user_config, &config);
    (w, mdir, m)
}

/// `corral run aider -- AIDER --message ...`: one message, edits in the diff format, no
/// commits, plain output.
fn run_aider(
    w: &World,
    mdir: &std::path::Path,
    m: &Mock,
    aider: &std::path::Path,
    host: &str,
) -> Out {
    let aider = aider.display().to_string();
    let argv = [
        aider.as_str(),
        "--model",
        "openai/mock-1",
        "--edit-format",
        "diff",
        "--message",
        "Do the task.",
        "--no-auto-commits",
        "--no-gitignore",
        "--no-fancy-input",
        "--no-pretty",
        "--no-show-model-warnings",
    ];
    run_harness(
        w,
        "aider",
        &[],
        &argv,
        &[
            ("CALLER_KEY", REAL.to_string()),
            ("OPENAI_API_BASE", format!("https://{host}:{}/v1", m.port)),
        ],
        mdir,
    )
}

#[test]
fn aider_in_the_jail_edits_the_project_and_every_attack_fails() {
    let Some(aider) = aider() else {
        eprintln!(
            "skipping: aider is not installed (python3 -m venv /opt/corral-ci-aider && \
             /opt/corral-ci-aider/bin/pip install aider-chat; .ci/run does)"
        );
        return;
    };
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let script = |a: &Attacks| {
        let answer = format!(
            "I will write the proof file, then look around.\n\n\
             e2e-proof.txt\n```\n<<<<<<< SEARCH\n=======\n{PROOF}\n>>>>>>> REPLACE\n```\n\n\
             ```bash\n{}\n{}\n```\n",
            a.read_secrets, a.other_host
        );
        serde_json::json!({"steps": [{"text": answer}], "final": "aider is done"})
    };
    let (w, mdir, m) = aider_world(&host, script);
    let out = run_aider(&w, &mdir, &m, &aider, &host);
    assert_eq!(out.code, 0, "corral run aider failed:\n{}", out.both());

    let reqs = m.requests();
    let turns: Vec<_> = reqs
        .iter()
        .filter(|r| r["method"] == "POST" && r["path"] == "/v1/chat/completions")
        .collect();
    assert!(
        !turns.is_empty(),
        "aider never reached the mock: {}",
        out.both()
    );
    // The mock saw the real key on every call, never the placeholder.
    for r in &turns {
        assert_eq!(r["authorization"], format!("Bearer {REAL}"), "{r}");
    }
    // aider ran the commands (it prints their output, which it adds to the chat): the secrets
    // were not there, the other host was refused. Its history file in the project, read on the
    // host, holds no secret either.
    assert!(
        out.stdout.contains("Running cat ") && out.stdout.matches("No such file").count() == 2,
        "{}",
        out.both()
    );
    assert!(out.stdout.contains("rc=1"), "{}", out.both());
    assert!(
        out.stdout.contains("403") && out.stdout.contains("Added 8 lines of output"),
        "{}",
        out.both()
    );
    let history = std::fs::read_to_string(w.project.join(".aider.chat.history.md"))
        .expect("aider's chat history");
    for secret in [SSH_SECRET, OUTSIDE_SECRET, REAL_PART] {
        assert!(!history.contains(secret), "{secret} in aider's history");
    }
    judge(&w, &m, &out, REAL_PART);
}

/// Review mode: aider's SEARCH/REPLACE block creates a project file, its shell block reads it
/// back from the held change set; the host gets it (and aider's history files) only on
/// `corral accept` (`review_end_to_end`).
#[test]
fn aider_in_review_mode_sees_its_own_writes_and_the_host_gets_them_on_accept() {
    let Some(aider) = aider() else {
        eprintln!(
            "skipping: aider is not installed (python3 -m venv /opt/corral-ci-aider && \
             /opt/corral-ci-aider/bin/pip install aider-chat; .ci/run does)"
        );
        return;
    };
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let (w, mdir, m) = aider_world(&host, |a: &Attacks| {
        let answer = format!(
            "I will write the file, then read it back.\n\n\
             {REVIEW_FILE}\n```\n<<<<<<< SEARCH\n=======\n{REVIEW_TEXT}\n>>>>>>> REPLACE\n```\n\n\
             ```bash\n{}\n```\n",
            a.read_back
        );
        serde_json::json!({"steps": [{"text": answer}], "final": "aider is done"})
    });
    review_mode(&w);
    // aider prints its commands' output as they run (it sends none of it back: one message).
    let out = review_end_to_end(&w, || run_aider(&w, &mdir, &m, &aider, &host));
    saw_own_write(&out.stdout);
}
