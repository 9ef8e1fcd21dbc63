//! The real pi (`@mariozechner/pi-coding-agent` from npm) jailed end to end: `corral run pi`
//! in the native jail, network through corral's proxy, the model API key served by the
//! credential gateway. The model is a scripted OpenAI-compatible mock over HTTPS
//! (tests/fixtures/mock-model/server.py) that answers with tool calls and records the tool
//! results pi sends back, so the test reads what each attack did inside the jail.

mod e2e_support;
mod jail_support;

use std::process::Command;

use e2e_support::*;

use jail_support::*;

const REAL: &str = "sk-test-REALkeyREALkeyREALkey0123456789abc";
const REAL_PART: &str = "REALkeyREALkey";

#[test]
fn pi_in_the_jail_edits_the_project_and_every_attack_fails() {
    let Some(pi) = which("pi") else {
        eprintln!(
            "skipping: pi is not installed (npm install -g @mariozechner/pi-coding-agent; .ci/run does)"
        );
        return;
    };
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let w = World::new();
    let mdir = w.root.join("mock");
    std::fs::create_dir_all(&mdir).unwrap();
    certs(&mdir, &host);
    let steps = serde_json::json!({
        "steps": [
            {"tool": "bash", "arguments": {"command": "cat ~/.ssh/id_ed25519; echo rc=$?"}},
            {"tool": "bash", "arguments": {"command": "curl -sS -m 20 https://example.com/ 2>&1; echo rc=$?"}},
            // The pattern is assembled at run time, so the command text never holds the value.
            {"tool": "bash", "arguments": {"command": format!(
                "A={}; echo env=$(env | grep -c $A$A) proc=$(grep -c $A$A /proc/self/environ) all=$(cat /proc/[0-9]*/environ 2>/dev/null | grep -c $A$A); echo prefix=${{MOCK_API_KEY:0:8}}",
                &REAL_PART[..REAL_PART.len() / 2]
            )}},
            {"tool": "edit", "arguments": {"path": "app.conf", "edits": [{"oldText": "version = 1", "newText": "version = 2"}]}},
            {"tool": "bash", "arguments": {"command": "corral exec -- sh -c 'echo EXEC-$((40+2))'; echo rc=$?"}}
        ],
        "final": "all done"
    });
    let m = mock_model(&mdir, &steps);
    let port = m.port;
    write(&w.project.join("app.conf"), "version = 1\n");
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nallow = [\"{host}:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [secrets]\nMOCK_API_KEY = {{ from_env = \"CALLER_MOCK_KEY\", hosts = [\"{host}\"] }}\n"
        ),
    );
    w.trust_project(&[]);
    // pi's provider for the mock; `apiKey` names the variable pi reads (the placeholder).
    write(
        &w.home.join(".pi/agent/models.json"),
        &serde_json::json!({"providers": {"mock": {
            "baseUrl": format!("https://{host}:{port}/v1"),
            "api": "openai-completions",
            "apiKey": "MOCK_API_KEY",
            "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
            "models": [{"id": "mock-1"}]
        }}})
        .to_string(),
    );

    let mut c = Command::new("timeout");
    c.arg("300")
        .arg(corral_bin())
        .args(["run", "pi", "--network", "proxy", "--"])
        .arg(&pi)
        .args([
            "-p",
            "--provider",
            "mock",
            "--model",
            "mock-1",
            "Do the task.",
        ])
        .current_dir(&w.project)
        .env_clear()
        .env("HOME", &w.home)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .env("TMPDIR", std::env::temp_dir())
        .env("CALLER_MOCK_KEY", REAL)
        // The gateway verifies the mock with the system store plus this test CA.
        .env("SSL_CERT_FILE", mdir.join("ca.pem"));
    let out = run(c);
    assert_eq!(out.code, 0, "corral run pi failed:\n{}", out.both());
    assert!(out.stdout.contains("all done"), "{}", out.both());
    assert!(!out.both().contains(REAL_PART), "real value printed");

    let reqs = m.requests();
    let posts: Vec<_> = reqs.iter().filter(|r| r["method"] == "POST").collect();
    assert_eq!(
        posts.len(),
        6,
        "one model call per step plus the last: {reqs:#?}"
    );
    // The mock saw the real key on every call, never the placeholder.
    for r in &reqs {
        assert_eq!(r["authorization"], format!("Bearer {REAL}"), "{r}");
    }
    let results: Vec<String> = posts[5]["tool_results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(results.len(), 5, "{results:#?}");
    // ~/.ssh: the jail's home is private, the host's key is not there.
    assert!(
        results[0].contains("No such file") && results[0].contains("rc=1"),
        "{}",
        results[0]
    );
    assert!(!results[0].contains(SSH_SECRET));
    // A host not in network.allow: the proxy refused the CONNECT.
    assert!(
        results[1].contains("403") && !results[1].contains("rc=0"),
        "{}",
        results[1]
    );
    // The real key is in no environment the jail can read; the placeholder has its shape.
    assert!(results[2].contains("env=0 proc=0 all=0"), "{}", results[2]);
    assert!(results[2].contains("prefix=sk-test-"), "{}", results[2]);
    // pi's edit tool changed the project file, seen on the host.
    assert!(results[3].contains("Successfully"), "{}", results[3]);
    assert_eq!(
        std::fs::read_to_string(w.project.join("app.conf")).unwrap(),
        "version = 2\n"
    );
    // `corral exec` from inside the jail: the executor ran the command and streamed its output.
    assert!(
        results[4].contains("EXEC-42") && results[4].contains("rc=0"),
        "{}",
        results[4]
    );
    // The denial is summarised on stderr; the audit log has the injections, never the value.
    assert!(
        out.stderr.contains("blocked CONNECT example.com:443"),
        "{}",
        out.stderr
    );
    let mut logs = String::new();
    for f in walk(&w.home.join(".local/state/corral")) {
        logs.push_str(&std::fs::read_to_string(f).unwrap_or_default());
    }
    assert!(!logs.contains(REAL_PART), "real value in the audit log");
    assert!(
        logs.contains("\"secret\":\"MOCK_API_KEY\"")
            && logs.contains("injected into authorization"),
        "{logs}"
    );
}

/// The real pi with its key in `~/.pi/agent/auth.json` (`[signin.pi]`): pi reads the jail's
/// copy, where the key is a placeholder, and the mock gets the real key; the key of a provider
/// the entry does not name is a placeholder pi holds and nothing swaps. Control: the same run
/// with the sign-in pointed at an absent file shows pi's jail the real values.
#[test]
fn pi_with_its_key_in_auth_json_holds_placeholders_and_the_model_gets_the_real_key() {
    let Some(pi) = which("pi") else {
        eprintln!(
            "skipping: pi is not installed (npm install -g @mariozechner/pi-coding-agent; .ci/run does)"
        );
        return;
    };
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    const KEY: &str = "sk-test-AUTHJSONkeyAUTHJSONkey0123456789abcdef";
    const UNKNOWN: &str = "gsk_AUTHJSONunknownAUTHJSONunknown0123456789";
    for (file_at, signed_in) in [
        (".pi/agent/auth.json", true),
        (".pi/agent/absent.json", false),
    ] {
        let w = World::new();
        let mdir = w.root.join("mock");
        std::fs::create_dir_all(&mdir).unwrap();
        certs(&mdir, &host);
        // The pattern is assembled at run time, so the command text never holds a value.
        let steps = serde_json::json!({
            "steps": [{"tool": "bash", "arguments": {"command":
                "P=AUTHJSON; P=${P}key; U=AUTHJSON; U=${U}unknown; \
                 echo key=$(grep -rc $P ~/.pi/agent/auth.json) unknown=$(grep -rc $U ~/.pi/agent/auth.json) \
                 all=$(grep -rl -e $P -e $U ~ /tmp 2>/dev/null | wc -l) \
                 groq=$(python3 -c 'import json,os; print(json.load(open(os.path.expanduser(\"~/.pi/agent/auth.json\")))[\"groq\"][\"key\"][:4])')"}}],
            "final": "all done"
        });
        let m = mock_model(&mdir, &steps);
        let port = m.port;
        write(
            &w.project.join("corral.toml"),
            &format!(
                "[network]\nallow = [\"{host}:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
                 [signin.pi]\nformat = \"pi\"\nfile = \"~/{file_at}\"\n\
                 [signin.pi.providers.mock]\napi_hosts = [\"{host}:{port}\"]\n"
            ),
        );
        w.trust_project(&[]);
        write(
            &w.home.join(".pi/agent/models.json"),
            // pi requires an `apiKey` for a provider of its own; auth.json's key comes first
            // (dist/core/auth-storage.js getApiKey), so this one is never sent.
            &serde_json::json!({"providers": {"mock": {
                "baseUrl": format!("https://{host}:{port}/v1"),
                "api": "openai-completions",
                "apiKey": "MOCK_UNUSED_KEY",
                "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
                "models": [{"id": "mock-1"}]
            }}})
            .to_string(),
        );
        write(
            &w.home.join(".pi/agent/auth.json"),
            &serde_json::json!({"mock": {"type": "api_key", "key": KEY},
                "groq": {"type": "api_key", "key": UNKNOWN}})
            .to_string(),
        );
        let mut c = Command::new("timeout");
        c.arg("300")
            .arg(corral_bin())
            .args(["run", "pi", "--network", "proxy", "--"]);
        if signed_in {
            c.arg(&pi).args([
                "-p",
                "--provider",
                "mock",
                "--model",
                "mock-1",
                "Do the task.",
            ]);
        } else {
            // Control: the same jail without the sign-in reads the real values (the jail's
            // pi would not reach the mock: only the gateway's interception trusts its CA).
            c.args([
                "sh",
                "-c",
                steps["steps"][0]["arguments"]["command"].as_str().unwrap(),
            ]);
        }
        c.current_dir(&w.project)
            .env_clear()
            .env("HOME", &w.home)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("LANG", "C.UTF-8")
            .env("TMPDIR", std::env::temp_dir())
            .env("SSL_CERT_FILE", mdir.join("ca.pem"));
        let out = run(c);
        let reqs = m.requests();
        if !signed_in {
            assert!(
                out.stdout.contains("key=1 unknown=1") && out.stdout.contains("groq=gsk_"),
                "{}",
                out.both()
            );
            continue;
        }
        assert_eq!(out.code, 0, "corral run pi failed:\n{}", out.both());
        assert!(out.stdout.contains("all done"), "{}", out.both());
        for marker in ["AUTHJSONkeyAUTHJSONkey", "AUTHJSONunknownAUTHJSONunknown"] {
            assert!(!out.both().contains(marker), "real value printed");
        }
        let posts: Vec<_> = reqs.iter().filter(|r| r["method"] == "POST").collect();
        assert_eq!(posts.len(), 2, "{reqs:#?}");
        for r in &reqs {
            assert_eq!(r["authorization"], format!("Bearer {KEY}"), "{r}");
        }
        let result = posts[1]["tool_results"][0].as_str().unwrap_or_default();
        assert!(
            result.contains("key=0 unknown=0 all=0 groq=gsk_"),
            "{result}"
        );
        assert!(!serde_json::to_string(&reqs).unwrap().contains(UNKNOWN));
        // The user's file is as it was: nothing refreshed, nothing the jail wrote.
        let v: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(w.home.join(".pi/agent/auth.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(v["mock"]["key"], KEY);
        assert_eq!(v["groq"]["key"], UNKNOWN);
    }
}

/// Review mode with the real pi: its edit and write tools write the project's overlay, its
/// next command reads its own writes, the host's project is unchanged during and after the
/// run until `corral accept` (`review_end_to_end`); `corral exec` is off in review mode (its
/// commands would run on the host's project) and says so.
#[test]
fn pi_in_review_mode_sees_its_own_writes_and_the_host_gets_them_on_accept() {
    let Some(pi) = which("pi") else {
        eprintln!(
            "skipping: pi is not installed (npm install -g @mariozechner/pi-coding-agent; .ci/run does)"
        );
        return;
    };
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let w = World::new();
    let mdir = w.root.join("mock");
    std::fs::create_dir_all(&mdir).unwrap();
    certs(&mdir, &host);
    let a = attacks(&w);
    let steps = serde_json::json!({
        "steps": [
            {"tool": "edit", "arguments": {"path": "app.conf", "edits": [{"oldText": "version = 1", "newText": "version = 2"}]}},
            {"tool": "write", "arguments": {"path": REVIEW_FILE, "content": format!("{REVIEW_TEXT}\n")}},
            {"tool": "bash", "arguments": {"command": format!("cat app.conf; {}", a.read_back)}},
            {"tool": "bash", "arguments": {"command": "echo exec=${CORRAL_EXECUTOR:-none}; corral exec -- true; echo rc=$?"}}
        ],
        "final": "all done"
    });
    let m = mock_model(&mdir, &steps);
    let port = m.port;
    write(&w.project.join("app.conf"), "version = 1\n");
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[filesystem]\nreview = true\n\n\
             [network]\nallow = [\"{host}:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [secrets]\nMOCK_API_KEY = {{ from_env = \"CALLER_MOCK_KEY\", hosts = [\"{host}\"] }}\n"
        ),
    );
    w.trust_project(&[]);
    // The project's policy asks for review mode too (any layer may turn it on).
    review_mode(&w);
    write(
        &w.home.join(".pi/agent/models.json"),
        &serde_json::json!({"providers": {"mock": {
            "baseUrl": format!("https://{host}:{port}/v1"),
            "api": "openai-completions",
            "apiKey": "MOCK_API_KEY",
            "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
            "models": [{"id": "mock-1"}]
        }}})
        .to_string(),
    );
    let out = review_end_to_end(&w, || {
        let mut c = Command::new("timeout");
        c.arg("300")
            .arg(corral_bin())
            .args(["run", "pi", "--network", "proxy", "--"])
            .arg(&pi)
            .args([
                "-p",
                "--provider",
                "mock",
                "--model",
                "mock-1",
                "Do the task.",
            ])
            .current_dir(&w.project)
            .env_clear()
            .env("HOME", &w.home)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("LANG", "C.UTF-8")
            .env("TMPDIR", std::env::temp_dir())
            .env("CALLER_MOCK_KEY", REAL)
            .env("SSL_CERT_FILE", mdir.join("ca.pem"));
        run(c)
    });
    assert!(out.stdout.contains("all done"), "{}", out.both());
    assert!(
        out.stderr.contains("review: 2 changes held"),
        "{}",
        out.stderr
    );
    let reqs = m.requests();
    let posts: Vec<_> = reqs.iter().filter(|r| r["method"] == "POST").collect();
    let results: Vec<String> = posts.last().unwrap()["tool_results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(results.len(), 4, "{results:#?}");
    assert!(results[0].contains("Successfully"), "{}", results[0]);
    // pi reads its own writes in the jail.
    assert!(results[2].contains("version = 2"), "{}", results[2]);
    saw_own_write(&results[2]);
    assert!(
        results[3].contains("exec=none")
            && results[3].contains("the executor is off in review mode")
            && results[3].contains("rc=125"),
        "{}",
        results[3]
    );
    // Accepted: the edit is on the host too.
    assert_eq!(
        std::fs::read_to_string(w.project.join("app.conf")).unwrap(),
        "version = 2\n"
    );
}
