//! The real Gemini CLI (`@google/gemini-cli` from npm) jailed end to end: `corral run gemini`
//! in the native jail, network through corral's proxy, `GEMINI_API_KEY` served by the credential
//! gateway (`x-goog-api-key`). The model is the scripted mock (tests/fixtures/mock-model/server.py)
//! speaking the Gemini API (`streamGenerateContent`) over HTTPS, reached through
//! `GOOGLE_GEMINI_BASE_URL`; it makes Gemini CLI's shell tool edit the project, read host
//! secrets and reach a host the policy does not allow, and the test judges each on the host.

mod e2e_support;
mod jail_support;

use e2e_support::*;
use jail_support::*;

// The shape of a Gemini API key: "AIza" and 35 more characters.
const REAL: &str = "AIzaREALkeyREALkeyREALkey0123456789ab";
const REAL_PART: &str = "REALkeyREALkey";

/// Gemini CLI's shell tool.
fn step(cmd: &str) -> serde_json::Value {
    serde_json::json!({"tool": "run_shell_command", "arguments": {"command": cmd}})
}

/// A world with the mock scripted by `script` and Gemini CLI's settings as a user of the
/// API-key mode keeps them (~/.gemini, bound into the jail): the key's auth type, no update
/// check, no usage statistics; the folder-trust question is corral's (`corral trust`), not
/// asked again.
fn gemini_world(
    host: &str,
    script: impl FnOnce(&Attacks) -> serde_json::Value,
) -> (World, std::path::PathBuf, Mock) {
    let (w, mdir, m) = world_with_mock(host, script, "GEMINI_API_KEY");
    write(
        &w.home.join(".gemini/settings.json"),
        &serde_json::json!({
            "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": false}},
            "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
            "privacy": {"usageStatisticsEnabled": false},
            "telemetry": {"enabled": false}
        })
        .to_string(),
    );
    (w, mdir, m)
}

/// `corral run gemini` with the profile's command, then `-p`: one prompt, no terminal UI;
/// `--yolo`: every tool call approved (corral is the sandbox).
fn run_gemini(
    w: &World,
    mdir: &std::path::Path,
    m: &Mock,
    gemini: &std::path::Path,
    host: &str,
) -> Out {
    let mut argv = profile_command(w, "gemini");
    assert_eq!(argv[0], gemini.display().to_string());
    argv.extend(["-p", "Do the task.", "--yolo", "-m", "gemini-2.5-pro"].map(String::from));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    run_harness(
        w,
        "gemini",
        &[],
        &argv,
        &[
            ("CALLER_KEY", REAL.to_string()),
            (
                "GOOGLE_GEMINI_BASE_URL",
                format!("https://{host}:{}", m.port),
            ),
        ],
        mdir,
    )
}

/// The model's turns (side questions, which carry no tools, left out).
fn turns(m: &Mock) -> Vec<serde_json::Value> {
    m.requests()
        .into_iter()
        .filter(|r| r["api"] == "gemini" && r["side"] == false)
        .collect()
}

#[test]
fn gemini_in_the_jail_edits_the_project_and_every_attack_fails() {
    let Some(gemini) = which("gemini") else {
        eprintln!(
            "skipping: gemini is not installed (npm install -g @google/gemini-cli; .ci/run does)"
        );
        return;
    };
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let script = |a: &Attacks| {
        serde_json::json!({
            "steps": [step(&a.edit), step(&a.read_secrets), step(&a.other_host)],
            "final": "gemini is done"
        })
    };
    let (w, mdir, m) = gemini_world(&host, script);
    let out = run_gemini(&w, &mdir, &m, &gemini, &host);
    assert_eq!(out.code, 0, "corral run gemini failed:\n{}", out.both());
    assert!(out.stdout.contains("gemini is done"), "{}", out.both());

    let reqs = m.requests();
    let turns = turns(&m);
    let last = turns.last().expect("gemini never reached the mock");
    // The mock saw the real key on every call, never the placeholder.
    for r in reqs.iter().filter(|r| r["api"] == "gemini") {
        assert_eq!(r["x_goog_api_key"], REAL, "{r}");
    }
    judge_tool_results(last);
    judge(&w, &m, &out, REAL_PART);
}

/// Review mode: Gemini CLI's write_file tool creates a project file, its shell tool reads it
/// back from the held change set; the host gets it only on `corral accept`
/// (`review_end_to_end`).
#[test]
fn gemini_in_review_mode_sees_its_own_writes_and_the_host_gets_them_on_accept() {
    let Some(gemini) = which("gemini") else {
        eprintln!(
            "skipping: gemini is not installed (npm install -g @google/gemini-cli; .ci/run does)"
        );
        return;
    };
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let (w, mdir, m) = gemini_world(&host, |a: &Attacks| {
        let path = a.project.join(REVIEW_FILE).display().to_string();
        serde_json::json!({
            "steps": [
                {"tool": "write_file", "arguments": {"file_path": path, "content": format!("{REVIEW_TEXT}\n")}},
                step(&a.read_back),
            ],
            "final": "gemini is done"
        })
    });
    review_mode(&w);
    let out = review_end_to_end(&w, || run_gemini(&w, &mdir, &m, &gemini, &host));
    assert!(out.stdout.contains("gemini is done"), "{}", out.both());
    let turns = turns(&m);
    let last = turns.last().expect("gemini never reached the mock");
    let results = last["tool_results"].as_array().expect("tool_results");
    assert_eq!(results.len(), 2, "{results:#?}");
    saw_own_write(results[1].as_str().unwrap_or_default());
}
