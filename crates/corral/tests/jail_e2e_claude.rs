//! A second harness from npm, Claude Code (`@anthropic-ai/claude-code`, a native binary), jailed:
//! `corral run claude` starts it in the native jail with `ANTHROPIC_BASE_URL` pointing at the
//! scripted mock model over HTTPS (Anthropic Messages), and its `x-api-key` reaches the mock as
//! the real key through the proxy and the credential gateway, while the jail holds a placeholder.

mod e2e_support;
mod jail_support;

use std::process::Command;

use e2e_support::*;
use jail_support::*;

const REAL: &str = "sk-ant-api03-REALkeyREALkeyREALkey0123456789abcdefghijklmnop";
const REAL_PART: &str = "REALkeyREALkey";

#[test]
fn claude_starts_in_the_jail_and_reaches_its_model_through_the_gateway() {
    let Some(claude) = which("claude") else {
        eprintln!(
            "skipping: claude is not installed (npm install -g @anthropic-ai/claude-code; .ci/run does)"
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
    let m = mock_model(
        &mdir,
        &serde_json::json!({"steps": [], "final": "claude reached the mock"}),
    );
    let port = m.port;
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nallow = [\"{host}:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [secrets]\nANTHROPIC_API_KEY = {{ from_env = \"CALLER_ANTHROPIC_KEY\", hosts = [\"{host}\"] }}\n"
        ),
    );
    w.trust_project(&[]);
    // Claude Code's state, as after a first run on the host.
    std::fs::create_dir_all(w.home.join(".claude")).unwrap();
    write(&w.home.join(".claude.json"), "{}");

    let mut c = Command::new("timeout");
    c.arg("300")
        .arg(corral_bin())
        .args(["run", "claude", "--network", "proxy", "--"])
        .arg(&claude)
        .args(["-p", "Say hi."])
        .current_dir(&w.project)
        .env_clear()
        .env("HOME", &w.home)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .env("TMPDIR", std::env::temp_dir())
        .env("CALLER_ANTHROPIC_KEY", REAL)
        .env("ANTHROPIC_BASE_URL", format!("https://{host}:{port}"))
        .env("SSL_CERT_FILE", mdir.join("ca.pem"));
    let out = run(c);
    assert_eq!(out.code, 0, "corral run claude failed:\n{}", out.both());
    assert!(
        out.stdout.contains("claude reached the mock"),
        "{}",
        out.both()
    );
    assert!(!out.both().contains(REAL_PART), "real value printed");

    let reqs = m.requests();
    let messages: Vec<_> = reqs.iter().filter(|r| r["api"] == "anthropic").collect();
    assert!(
        !messages.is_empty(),
        "claude never reached the mock: {reqs:#?}"
    );
    for r in &reqs {
        let key = r["x_api_key"].as_str().or(r["authorization"].as_str());
        assert!(
            key.is_none_or(|k| k == REAL || k == format!("Bearer {REAL}")),
            "the mock saw something other than the real key: {r}"
        );
    }
    assert_eq!(messages[0]["x_api_key"], REAL, "{reqs:#?}");

    let mut logs = String::new();
    for f in walk(&w.home.join(".local/state/corral")) {
        logs.push_str(&std::fs::read_to_string(f).unwrap_or_default());
    }
    assert!(!logs.contains(REAL_PART), "real value in the audit log");
    assert!(
        logs.contains("\"secret\":\"ANTHROPIC_API_KEY\"")
            && logs.contains("injected into x-api-key"),
        "{logs}"
    );
    // Nothing under the jail's reach kept the real key: Claude Code's state on the host.
    for f in walk(&w.home.join(".claude"))
        .into_iter()
        .chain([w.home.join(".claude.json")])
    {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        assert!(!text.contains(REAL_PART), "real value in {}", f.display());
    }
}
