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
    let step =
        |cmd: &str| serde_json::json!({"tool": "run_shell_command", "arguments": {"command": cmd}});
    let script = |a: &Attacks| {
        serde_json::json!({
            "steps": [step(&a.edit), step(&a.read_secrets), step(&a.other_host)],
            "final": "gemini is done"
        })
    };
    let (w, mdir, m) = world_with_mock(&host, script, "GEMINI_API_KEY");
    // Gemini CLI's settings as a user of the API-key mode keeps them (~/.gemini, bound into the
    // jail): the key's auth type, no update check, no usage statistics; the folder-trust
    // question is corral's (`corral trust`), not asked again.
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
    let mut argv = profile_command(&w, "gemini");
    assert_eq!(argv[0], gemini.display().to_string());
    // -p: one prompt, no terminal UI; --yolo: every tool call approved (corral is the sandbox).
    argv.extend(["-p", "Do the task.", "--yolo", "-m", "gemini-2.5-pro"].map(String::from));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = run_harness(
        &w,
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
        &mdir,
    );
    assert_eq!(out.code, 0, "corral run gemini failed:\n{}", out.both());
    assert!(out.stdout.contains("gemini is done"), "{}", out.both());

    let reqs = m.requests();
    let turns: Vec<_> = reqs
        .iter()
        .filter(|r| r["api"] == "gemini" && r["side"] == false)
        .collect();
    let last = turns.last().expect("gemini never reached the mock");
    // The mock saw the real key on every call, never the placeholder.
    for r in reqs.iter().filter(|r| r["api"] == "gemini") {
        assert_eq!(r["x_goog_api_key"], REAL, "{r}");
    }
    judge_tool_results(last);
    judge(&w, &m, &out, REAL_PART);
}
