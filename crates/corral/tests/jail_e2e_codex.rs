//! The real Codex CLI (`@openai/codex` from npm, a native binary) jailed end to end:
//! `corral run codex` in the native jail, network through corral's proxy, the API key served by
//! the credential gateway. The model is the scripted mock (tests/fixtures/mock-model/server.py)
//! speaking the OpenAI Responses API over HTTPS; it makes Codex's shell tool edit the project,
//! read host secrets and reach a host the policy does not allow, and the test judges each on
//! the host.

mod e2e_support;
mod jail_support;

use e2e_support::*;
use jail_support::*;

const REAL: &str = "sk-proj-REALkeyREALkeyREALkey0123456789abc";
const REAL_PART: &str = "REALkeyREALkey";

/// Codex's shell tool (unified exec): `exec_command` with `cmd`.
fn step(cmd: &str) -> serde_json::Value {
    serde_json::json!({"tool": "exec_command", "arguments": {"cmd": cmd}})
}

/// A world with the mock scripted for Codex's shell tool and a provider for it in ~/.codex.
fn codex_world(host: &str) -> (World, std::path::PathBuf, Mock) {
    codex_world_with(host, |a: &Attacks| {
        serde_json::json!({
            "steps": [step(&a.edit), step(&a.read_secrets), step(&a.other_host)],
            "final": "codex is done"
        })
    })
}

fn codex_world_with(
    host: &str,
    script: impl FnOnce(&Attacks) -> serde_json::Value,
) -> (World, std::path::PathBuf, Mock) {
    let (w, mdir, m) = world_with_mock(host, script, "OPENAI_API_KEY");
    // A provider for the mock in Codex's own config (the user's ~/.codex, bound into the jail).
    write(
        &w.home.join(".codex/config.toml"),
        &format!(
            "model = \"mock-1\"\nmodel_provider = \"mock\"\n\n\
             [model_providers.mock]\nname = \"mock\"\nbase_url = \"https://{host}:{}/v1\"\n\
             env_key = \"OPENAI_API_KEY\"\nwire_api = \"responses\"\n",
            m.port
        ),
    );
    (w, mdir, m)
}

/// `corral run codex`: the profile's command (Codex's own sandbox off: it cannot create
/// namespaces inside the jail, and corral is the sandbox), then `exec`: one task, no
/// approvals, then exit.
fn run_codex(w: &World, mdir: &std::path::Path, codex: &std::path::Path) -> Out {
    let mut argv = profile_command(w, "codex");
    assert_eq!(argv[0], codex.display().to_string());
    argv.extend(["exec", "--skip-git-repo-check", "Do the task."].map(String::from));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    run_harness(
        w,
        "codex",
        &[],
        &argv,
        &[("CALLER_KEY", REAL.to_string())],
        mdir,
    )
}

#[test]
fn codex_in_the_jail_edits_the_project_and_every_attack_fails() {
    let Some(codex) = which("codex") else {
        eprintln!("skipping: codex is not installed (npm install -g @openai/codex; .ci/run does)");
        return;
    };
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let (w, mdir, m) = codex_world(&host);
    let out = run_codex(&w, &mdir, &codex);
    assert_eq!(out.code, 0, "corral run codex failed:\n{}", out.both());
    assert!(out.stdout.contains("codex is done"), "{}", out.both());

    let reqs = m.requests();
    let turns: Vec<_> = reqs.iter().filter(|r| r["api"] == "responses").collect();
    let last = turns.last().expect("codex never reached the mock");
    // The mock saw the real key on every call, never the placeholder.
    for r in &turns {
        assert_eq!(r["authorization"], format!("Bearer {REAL}"), "{r}");
    }
    judge_tool_results(last);
    judge(&w, &m, &out, REAL_PART);
}

/// The control: the same Codex and script without corral. The secret files are read and sent
/// to the model, which is what the judge looks for in the jailed run.
#[test]
fn codex_without_the_jail_sends_the_host_secrets_to_the_model() {
    let Some(codex) = which("codex") else {
        eprintln!("skipping: codex is not installed (npm install -g @openai/codex; .ci/run does)");
        return;
    };
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let (w, mdir, m) = codex_world(&host);
    let mut c = std::process::Command::new("timeout");
    c.arg("120")
        .arg(&codex)
        .args(["-c", "sandbox_mode=\"danger-full-access\""])
        .args(["exec", "--skip-git-repo-check", "Do the task."])
        .current_dir(&w.project)
        .env_clear()
        .env("HOME", &w.home)
        .env("CODEX_HOME", w.home.join(".codex"))
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .env("OPENAI_API_KEY", REAL)
        .env("CODEX_CA_CERTIFICATE", mdir.join("ca.pem"));
    let out = run(c);
    assert_eq!(out.code, 0, "codex failed:\n{}", out.both());
    let bodies = m.bodies();
    for secret in [SSH_SECRET, OUTSIDE_SECRET] {
        assert!(
            bodies.contains(secret),
            "the unjailed run did not send {secret}"
        );
    }
}

/// Review mode: Codex's shell tool writes a project file and reads it back from the held
/// change set; the host gets it only on `corral accept` (`review_end_to_end`).
#[test]
fn codex_in_review_mode_sees_its_own_writes_and_the_host_gets_them_on_accept() {
    let Some(codex) = which("codex") else {
        eprintln!("skipping: codex is not installed (npm install -g @openai/codex; .ci/run does)");
        return;
    };
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let (w, mdir, m) = codex_world_with(&host, |a: &Attacks| {
        // The read-back waits at the gate: past `yield_time_ms` Codex would answer "still
        // running" and move on.
        let mut read_back = step(&a.read_back);
        read_back["arguments"]["yield_time_ms"] = 120_000.into();
        serde_json::json!({
            "steps": [step(&format!("echo {REVIEW_TEXT} > {REVIEW_FILE}; echo rc=$?")), read_back],
            "final": "codex is done"
        })
    });
    review_mode(&w);
    let out = review_end_to_end(&w, || run_codex(&w, &mdir, &codex));
    assert!(out.stdout.contains("codex is done"), "{}", out.both());
    let reqs = m.requests();
    let last = reqs
        .iter()
        .rfind(|r| r["api"] == "responses")
        .expect("codex never reached the mock");
    let results = last["tool_results"].as_array().expect("tool_results");
    assert_eq!(results.len(), 2, "{results:#?}");
    assert!(
        results[0].as_str().unwrap_or_default().contains("rc=0"),
        "{results:#?}"
    );
    saw_own_write(results[1].as_str().unwrap_or_default());
}

/// An API-key Codex user: the key is in `~/.codex/auth.json` as `codex login --with-api-key`
/// writes it (`{"auth_mode": "apikey", "OPENAI_API_KEY": ...}`), not in the environment. The
/// real Codex 0.171 reads the jail's copy (a placeholder) and sends it to the mock model (a
/// provider that uses the login, `requires_openai_auth`), named in the sign-in entry's
/// `api_key_hosts`: the mock gets the real key on every call. The shell tool prints the jail's
/// `auth.json` into the conversation: the model sees the placeholder, never the key.
#[test]
fn codex_with_its_key_in_auth_json_reaches_the_model_with_the_real_key_only() {
    let Some(codex) = which("codex") else {
        eprintln!("skipping: codex is not installed (npm install -g @openai/codex; .ci/run does)");
        return;
    };
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let script = |a: &Attacks| {
        serde_json::json!({
            "steps": [step(&format!("{}; cat ~/.codex/auth.json", a.edit)),
                step(&a.read_secrets), step(&a.other_host)],
            "final": "codex is done"
        })
    };
    let (w, mdir, m) = world_with_mock(&host, script, "UNUSED_SECRET");
    let port = m.port;
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nallow = [\"{host}:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [signin.codex]\nformat = \"codex\"\nfile = \"~/.codex/auth.json\"\n\
             api_hosts = [\"chatgpt.com\"]\ntoken_url = \"https://auth.openai.com/oauth/token\"\n\
             api_key_hosts = [\"{host}:{port}\"]\n"
        ),
    );
    w.trust_project(&[]);
    write(
        &w.home.join(".codex/config.toml"),
        &format!(
            "model = \"mock-1\"\nmodel_provider = \"mock\"\n\n\
             [model_providers.mock]\nname = \"mock\"\nbase_url = \"https://{host}:{port}/v1\"\n\
             requires_openai_auth = true\nwire_api = \"responses\"\n"
        ),
    );
    let auth = serde_json::json!({"auth_mode": "apikey", "OPENAI_API_KEY": REAL});
    let file = w.home.join(".codex/auth.json");
    write(&file, &serde_json::to_string_pretty(&auth).unwrap());
    let mut argv = profile_command(&w, "codex");
    assert_eq!(argv[0], codex.display().to_string());
    argv.extend(["exec", "--skip-git-repo-check", "Do the task."].map(String::from));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let out = run_harness(&w, "codex", &[], &argv, &[], &mdir);
    assert_eq!(out.code, 0, "corral run codex failed:\n{}", out.both());
    assert!(out.stdout.contains("codex is done"), "{}", out.both());

    let reqs = m.requests();
    let turns: Vec<_> = reqs.iter().filter(|r| r["api"] == "responses").collect();
    let last = turns.last().expect("codex never reached the mock");
    for r in &turns {
        assert_eq!(r["authorization"], format!("Bearer {REAL}"), "{r}");
    }
    // The jail's auth.json, printed by the shell tool, reached the model with a placeholder.
    let bodies = m.bodies();
    assert!(
        bodies.contains("apikey") && bodies.contains("sk-proj-"),
        "the model never saw the jail's auth.json: {bodies}"
    );
    judge_tool_results(last);
    judge(&w, &m, &out, REAL_PART);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(v["OPENAI_API_KEY"], REAL, "{v}");
}
