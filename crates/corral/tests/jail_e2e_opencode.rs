//! The real opencode (`opencode-ai` from npm, a compiled Bun binary) jailed end to end:
//! `corral run opencode` in the native jail, network through corral's proxy, the API key served
//! by the credential gateway. The model is the scripted mock (tests/fixtures/mock-model/server.py)
//! speaking OpenAI chat completions over HTTPS, configured as an OpenAI-compatible provider in
//! opencode's own config; it makes opencode's bash tool edit the project, read host secrets and
//! reach a host the policy does not allow, and the test judges each on the host.

mod e2e_support;
mod jail_support;

use e2e_support::*;
use jail_support::*;

const REAL: &str = "sk-proj-REALkeyREALkeyREALkey0123456789abc";
const REAL_PART: &str = "REALkeyREALkey";

/// opencode's bash tool.
fn step(cmd: &str) -> serde_json::Value {
    serde_json::json!({"tool": "bash", "arguments": {"command": cmd, "description": "a step"}})
}

/// A world with the mock scripted by `script`, as an OpenAI-compatible provider in opencode's
/// global config (bound into the jail); the key is read from the variable the gateway serves
/// (the jail has a placeholder).
fn opencode_world(
    host: &str,
    script: impl FnOnce(&Attacks) -> serde_json::Value,
) -> (World, std::path::PathBuf, Mock) {
    let (w, mdir, m) = world_with_mock(host, script, "OPENAI_API_KEY");
    write(
        &w.home.join(".config/opencode/opencode.json"),
        &serde_json::json!({
            "$schema": "https://opencode.ai/config.json",
            "provider": {"mock": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Mock",
                "options": {"baseURL": format!("https://{host}:{}/v1", m.port), "apiKey": "{env:OPENAI_API_KEY}"},
                "models": {"mock-1": {"name": "Mock 1", "tool_call": true}}
            }},
            "model": "mock/mock-1",
            "autoupdate": false,
            "share": "disabled"
        })
        .to_string(),
    );
    // What opencode writes into its config directory at its first start on the host: the
    // directory is code, read-only in the jail, and opencode stops if it cannot write this.
    write(
        &w.home.join(".config/opencode/.gitignore"),
        "node_modules\npackage.json\npackage-lock.json\nbun.lock\n.gitignore",
    );
    (w, mdir, m)
}

/// `corral run opencode` with the profile's command, then `run`: one message, then exit;
/// `--auto`: every permission granted (corral is the sandbox). Its model catalogue
/// (models.opencode.ai, which the profile allows) is not needed for a provider of the user's
/// own: the test stays off the internet.
fn run_opencode(w: &World, mdir: &std::path::Path, opencode: &std::path::Path) -> Out {
    let mut argv = profile_command(w, "opencode");
    assert_eq!(argv[0], opencode.display().to_string());
    argv.extend(
        [
            "run",
            "--auto",
            "--title",
            "e2e",
            "-m",
            "mock/mock-1",
            "Do the task.",
        ]
        .map(String::from),
    );
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    run_harness(
        w,
        "opencode",
        &["--env", "OPENCODE_DISABLE_MODELS_FETCH=1"],
        &argv,
        &[("CALLER_KEY", REAL.to_string())],
        mdir,
    )
}

/// The model's turns.
fn turns(m: &Mock) -> Vec<serde_json::Value> {
    m.requests()
        .into_iter()
        .filter(|r| r["method"] == "POST" && r["path"] == "/v1/chat/completions")
        .collect()
}

#[test]
fn opencode_in_the_jail_edits_the_project_and_every_attack_fails() {
    let Some(opencode) = which("opencode") else {
        eprintln!("skipping: opencode is not installed (npm install -g opencode-ai; .ci/run does)");
        return;
    };
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let script = |a: &Attacks| {
        serde_json::json!({
            "steps": [step(&a.edit), step(&a.read_secrets), step(&a.other_host)],
            "final": "opencode is done"
        })
    };
    let (w, mdir, m) = opencode_world(&host, script);
    let out = run_opencode(&w, &mdir, &opencode);
    assert_eq!(out.code, 0, "corral run opencode failed:\n{}", out.both());
    assert!(out.stdout.contains("opencode is done"), "{}", out.both());

    let turns = turns(&m);
    let last = turns.last().expect("opencode never reached the mock");
    // The mock saw the real key on every call, never the placeholder.
    for r in &turns {
        assert_eq!(r["authorization"], format!("Bearer {REAL}"), "{r}");
    }
    judge_tool_results(last);
    judge(&w, &m, &out, REAL_PART);
}

/// The real opencode with its key in `~/.local/share/opencode/auth.json`
/// (`[signin.opencode]`): opencode reads the jail's copy, where the key is a placeholder, and
/// the mock gets the real key; the key of a provider the entry does not name stays a
/// placeholder. The control (`jail_signin::control_without_the_by_provider_signin_...`) shows
/// the same file read in the clear without the sign-in.
#[test]
fn opencode_with_its_key_in_auth_json_holds_placeholders_and_the_model_gets_the_real_key() {
    let Some(opencode) = which("opencode") else {
        eprintln!("skipping: opencode is not installed (npm install -g opencode-ai; .ci/run does)");
        return;
    };
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    const KEY: &str = "sk-proj-OCAUTHkeyOCAUTHkeyOCAUTHkey0123456789abc";
    const UNKNOWN: &str = "gsk_OCAUTHunknownOCAUTHunknown0123456789abcdef";
    // The pattern is assembled at run time, so the command text never holds a value.
    let probe = "P=OCAUTH; P=${P}key; U=OCAUTH; U=${U}unknown; \
                 F=~/.local/share/opencode/auth.json; \
                 echo key=$(grep -c $P $F) unknown=$(grep -c $U $F) \
                 all=$(grep -rl -e $P -e $U ~ /tmp 2>/dev/null | wc -l)";
    let steps = serde_json::json!({
        "steps": [{"tool": "bash", "arguments": {"command": probe, "description": "a step"}}],
        "final": "opencode is done"
    });
    let w = World::new();
    let mdir = w.root.join("mock");
    std::fs::create_dir_all(&mdir).unwrap();
    certs(&mdir, &host);
    let m = mock_model(&mdir, &steps);
    let port = m.port;
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nallow = [\"{host}:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [signin.opencode]\nformat = \"opencode\"\nfile = \"~/.local/share/opencode/auth.json\"\n\
             [signin.opencode.providers.mock]\napi_hosts = [\"{host}:{port}\"]\n"
        ),
    );
    w.trust_project(&[]);
    // The provider's key is not in the config: opencode takes it from auth.json.
    write(
        &w.home.join(".config/opencode/opencode.json"),
        &serde_json::json!({
            "$schema": "https://opencode.ai/config.json",
            "provider": {"mock": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Mock",
                "options": {"baseURL": format!("https://{host}:{port}/v1")},
                "models": {"mock-1": {"name": "Mock 1", "tool_call": true}}
            }},
            "model": "mock/mock-1",
            "autoupdate": false,
            "share": "disabled"
        })
        .to_string(),
    );
    write(
        &w.home.join(".config/opencode/.gitignore"),
        "node_modules\npackage.json\npackage-lock.json\nbun.lock\n.gitignore",
    );
    let auth = w.home.join(".local/share/opencode/auth.json");
    write(
        &auth,
        &serde_json::json!({"mock": {"type": "api", "key": KEY},
            "groq": {"type": "api", "key": UNKNOWN}})
        .to_string(),
    );
    let before = std::fs::read(&auth).unwrap();
    let mut argv = profile_command(&w, "opencode");
    assert_eq!(argv[0], opencode.display().to_string());
    argv.extend(
        [
            "run",
            "--auto",
            "--title",
            "e2e",
            "-m",
            "mock/mock-1",
            "Do the task.",
        ]
        .map(String::from),
    );
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = run_harness(
        &w,
        "opencode",
        &["--env", "OPENCODE_DISABLE_MODELS_FETCH=1"],
        &argv,
        &[],
        &mdir,
    );
    assert_eq!(out.code, 0, "corral run opencode failed:\n{}", out.both());
    assert!(out.stdout.contains("opencode is done"), "{}", out.both());
    for marker in ["OCAUTHkeyOCAUTHkey", "OCAUTHunknownOCAUTHunknown"] {
        assert!(!out.both().contains(marker), "real value printed");
    }
    let reqs = m.requests();
    let turns: Vec<_> = reqs
        .iter()
        .filter(|r| r["method"] == "POST" && r["path"] == "/v1/chat/completions")
        .collect();
    let last = turns.last().expect("opencode never reached the mock");
    for r in &turns {
        assert_eq!(r["authorization"], format!("Bearer {KEY}"), "{r}");
    }
    let result = last["tool_results"][0].as_str().unwrap_or_default();
    assert!(result.contains("key=0 unknown=0 all=0"), "{result}");
    assert!(!serde_json::to_string(&reqs).unwrap().contains(UNKNOWN));
    assert_eq!(
        std::fs::read(&auth).unwrap(),
        before,
        "the user's file changed"
    );
}

/// Review mode: opencode's write tool creates a project file, its bash tool reads it back from
/// the held change set; the host gets it only on `corral accept` (`review_end_to_end`).
#[test]
fn opencode_in_review_mode_sees_its_own_writes_and_the_host_gets_them_on_accept() {
    let Some(opencode) = which("opencode") else {
        eprintln!("skipping: opencode is not installed (npm install -g opencode-ai; .ci/run does)");
        return;
    };
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let (w, mdir, m) = opencode_world(&host, |a: &Attacks| {
        let path = a.project.join(REVIEW_FILE).display().to_string();
        serde_json::json!({
            "steps": [
                {"tool": "write", "arguments": {"filePath": path, "content": format!("{REVIEW_TEXT}\n")}},
                step(&a.read_back),
            ],
            "final": "opencode is done"
        })
    });
    review_mode(&w);
    let out = review_end_to_end(&w, || run_opencode(&w, &mdir, &opencode));
    assert!(out.stdout.contains("opencode is done"), "{}", out.both());
    let turns = turns(&m);
    let last = turns.last().expect("opencode never reached the mock");
    let results = last["tool_results"].as_array().expect("tool_results");
    assert_eq!(results.len(), 2, "{results:#?}");
    saw_own_write(results[1].as_str().unwrap_or_default());
}
