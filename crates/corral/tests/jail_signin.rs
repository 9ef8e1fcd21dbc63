//! Sign-in credentials never enter the jail (`[signin]`), tried for real with
//! Claude Code's file shape: the user's `~/.claude/.credentials.json` holds a real access and
//! refresh token; a TLS mock serves an API that accepts only the current real access token and
//! a token endpoint that accepts only the current real refresh token (and rotates both, as
//! Anthropic's does). A jailed script does what Claude Code does: reads its credential file,
//! calls the API, refreshes, writes the new tokens into its file, calls the API again, and also
//! asks an echo endpoint to reflect its Authorization header. From the host, while the jail is
//! still running, the memory of every jailed process is scanned for the real tokens; inside the
//! jail every file it can read and every environment are grepped. After the run the user's file
//! holds the new real tokens with its other fields and mode kept.

mod e2e_support;
mod jail_support;
mod signin_support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use e2e_support::{certs, loopback_name, walk};
use jail_support::*;
use signin_support::*;

struct Mock {
    child: Child,
    port: u16,
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The mock for Claude Code's tokens; see [`mock_with`].
fn mock(dir: &Path, host: &str) -> Mock {
    let tokens = serde_json::json!({"access": ACCESS, "refresh": REFRESH,
        "new_access": NEW_ACCESS, "new_refresh": NEW_REFRESH, "token_path": "/v1/oauth/token"});
    mock_with(dir, host, &tokens)
}

/// A TLS mock for `host` (test CA in `dir`): an API accepting only the current real access
/// token, `/echo` reflecting Authorization, and a token endpoint at `tokens.token_path`
/// accepting only the current real refresh token (JSON or form body) and rotating both.
fn mock_with(dir: &Path, host: &str, tokens: &serde_json::Value) -> Mock {
    certs(dir, host);
    spawn_mock(dir, tokens)
}

/// Another mock for the same host on a port of its own, with the certificate of the mock in
/// `first` (one test CA for both).
fn mock_beside(first: &Path, dir: &Path, tokens: &serde_json::Value) -> Mock {
    std::fs::create_dir_all(dir).unwrap();
    for f in ["ca.pem", "leaf.pem", "leaf.key"] {
        std::fs::copy(first.join(f), dir.join(f)).unwrap();
    }
    spawn_mock(dir, tokens)
}

fn spawn_mock(dir: &Path, tokens: &serde_json::Value) -> Mock {
    write(&dir.join("mock.py"), MOCK);
    write(&dir.join("tokens.json"), &tokens.to_string());
    let (child, port) =
        e2e_support::spawn_printing_port(Command::new("python3").arg("mock.py").current_dir(dir));
    Mock { child, port }
}

/// The user's signed-in Claude Code: `~/.claude/.credentials.json`, mode 0600.
fn signed_in(w: &World) -> std::path::PathBuf {
    let file = w.home.join(".claude/.credentials.json");
    let v = claude_credentials();
    write(&file, &serde_json::to_string_pretty(&v).unwrap());
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    file
}

/// What the jailed script does, Claude Code's way. It never spells a real token: the markers it
/// greps for are assembled at run time.
fn script(url: &str) -> String {
    let greps: Vec<String> = MARKERS
        .iter()
        .map(|m| {
            let (a, b) = m.split_at(m.len() / 2);
            format!(
                "P={a}; P=${{P}}{b}; \
                 if grep -rqs \"$P\" ~ /tmp \"$PWD\" /proc/self/environ; then echo FILE-LEAK-{a}; fi; \
                 if cat /proc/[0-9]*/environ 2>/dev/null | grep -q \"$P\"; then echo ENV-LEAK-{a}; fi; "
            )
        })
        .collect();
    let greps = greps.concat();
    let exchange = claude_exchange(url);
    format!(
        r#"{exchange}{greps}
touch "$PWD/ready"; while [ ! -e "$PWD/done" ]; do sleep 0.05; done
echo END
"#
    )
}

/// Shell lines that print `FILE-LEAK-`/`ENV-LEAK-` when a marker is in the jail's files or in
/// any of its processes' environments (each marker split, so the script holds neither whole).
fn leak_greps(markers: &[&str]) -> String {
    markers
        .iter()
        .map(|m| {
            let (a, b) = m.split_at(m.len() / 2);
            format!(
                "P={a}; P=${{P}}{b}; if grep -rqs \"$P\" ~ /tmp \"$PWD\"; then echo FILE-LEAK-{a}; fi; \
                 if cat /proc/[0-9]*/environ 2>/dev/null | grep -q \"$P\"; then echo ENV-LEAK-{a}; fi\n"
            )
        })
        .collect()
}

/// The user's credential file `rel` (under the home, mode 0600, `creds`) and a trusted project
/// policy serving it as sign-in `name` from the mock at `(host, port, token_path)`; the file's
/// path.
fn sign_in_project(
    w: &World,
    name: &str,
    rel: &str,
    (host, port, token_path): (&str, u16, &str),
    creds: &serde_json::Value,
) -> std::path::PathBuf {
    let file = w.home.join(rel);
    write(&file, &serde_json::to_string_pretty(creds).unwrap());
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [\"{host}:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [signin.{name}]\nformat = \"{name}\"\nfile = \"~/{rel}\"\n\
             api_hosts = [\"{host}:{port}\"]\ntoken_url = \"https://{host}:{port}{token_path}\"\n"
        ),
    );
    w.trust_project(&[]);
    file
}

/// `corral run PROFILE --network proxy -- sh -c SCRIPT` trusting the mock's CA; the script
/// must reach its last line, `echo END`.
fn run_jailed(w: &World, mdir: &Path, profile: &str, script: &str) -> Out {
    let mut c = w.corral();
    c.env("SSL_CERT_FILE", mdir.join("ca.pem")).args([
        "run",
        profile,
        "--network",
        "proxy",
        "--",
        "sh",
        "-c",
        script,
    ]);
    let out = run(c);
    ran(&out, "END");
    out
}

fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} line in:\n{out}"))
}

#[test]
fn the_jail_holds_placeholders_and_corral_refreshes_and_writes_back() {
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let w = World::new();
    let mdir = w.root.join("mock");
    std::fs::create_dir_all(&mdir).unwrap();
    let m = mock(&mdir, &host);
    let port = m.port;
    let file = signed_in(&w);
    // The profile's endpoints (api.anthropic.com, platform.claude.com) replaced by the mock's.
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [\"{host}:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [signin.claude]\nformat = \"claude\"\nfile = \"~/.claude/.credentials.json\"\n\
             api_hosts = [\"{host}:{port}\"]\ntoken_url = \"https://{host}:{port}/v1/oauth/token\"\n"
        ),
    );
    w.trust_project(&[]);
    let url = format!("https://{host}:{port}");
    let mut c = w.corral();
    c.env("SSL_CERT_FILE", mdir.join("ca.pem")).args([
        "run",
        "claude",
        "--network",
        "proxy",
        "--",
        "sh",
        "-c",
        &script(&url),
    ]);
    let (ready, done) = (w.project.join("ready"), w.project.join("done"));
    let runner = std::thread::spawn(move || run(c));
    let deadline = Instant::now() + Duration::from_secs(180);
    while !ready.exists() {
        if runner.is_finished() || Instant::now() > deadline {
            let _ = std::fs::write(&done, "");
            let out = runner.join().unwrap();
            panic!("the jail never became ready:\n{}", out.both());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Scan every process under corral (its set-up process, the jail's PID 1, the script) while
    // it runs; corral itself holds the real tokens by design and is not scanned.
    let corral = children_of(std::process::id());
    let jailed: Vec<u32> = corral.iter().flat_map(|p| descendants(*p)).collect();
    let mut found = Vec::new();
    let mut readable = 0;
    for pid in &jailed {
        for needle in [ACCESS, REFRESH, NEW_ACCESS, NEW_REFRESH] {
            match memory_holds(*pid, needle.as_bytes()) {
                Some(true) => found.push((*pid, needle)),
                Some(false) => readable += 1,
                None => {}
            }
        }
    }
    // The control: the script's shell assembled the last marker for its grep, so the scan must
    // find that marker in jailed memory.
    let control = jailed
        .iter()
        .any(|p| memory_holds(*p, MARKERS[3].as_bytes()) == Some(true));
    std::fs::write(&done, "").unwrap();
    let out = runner.join().unwrap();
    ran(&out, "END");
    let all = out.both();
    let stdout = out.stdout.as_str();
    assert!(
        found.is_empty(),
        "real tokens in jailed memory: {found:?}\n{all}"
    );
    assert!(
        control,
        "the scan did not find the script's own marker: it proves nothing"
    );
    assert!(
        readable > 0,
        "no jailed process's memory could be read: the scan proved nothing"
    );
    for marker in MARKERS {
        assert!(
            !all.contains(marker),
            "{marker} reached the jail's output:\n{all}"
        );
    }
    assert!(!stdout.contains("-LEAK-"), "{all}");
    let ph = line(stdout, "PH_ACCESS=");
    assert!(
        ph.starts_with("sk-ant-oat01-") && ph.len() == ACCESS.len(),
        "{ph}"
    );
    // The placeholder works for the API, and comes back as itself when reflected.
    assert_eq!(line(stdout, "API1="), "\"api-ok\"", "{all}");
    assert!(line(stdout, "ECHO=").contains(ph), "{all}");
    // The refresh worked with the real refresh token; the jail got new placeholders, which work.
    let resp: serde_json::Value = serde_json::from_str(line(stdout, "TOKENRESP=")).unwrap();
    let new_ph = resp["access_token"].as_str().unwrap();
    assert!(
        new_ph.starts_with("sk-ant-oat01-") && new_ph != ph,
        "{resp}"
    );
    assert_eq!(resp["scope"], "user:inference user:profile");
    assert_eq!(line(stdout, "RENAME="), "Device or resource busy", "{all}");
    assert_eq!(line(stdout, "API2="), "\"api-ok\"", "{all}");
    // The old refresh placeholder now maps to a rotated token: the endpoint refuses it.
    assert!(line(stdout, "REPLAY=").contains("invalid_grant"), "{all}");

    // The mock saw real tokens only, never a placeholder.
    let seen = std::fs::read_to_string(mdir.join("seen.jsonl")).unwrap();
    assert!(
        seen.contains(&format!("Bearer {ACCESS}"))
            && seen.contains(&format!("Bearer {NEW_ACCESS}")),
        "{seen}"
    );
    assert!(
        seen.contains(REFRESH) && !seen.contains(ph) && !seen.contains(new_ph),
        "{seen}"
    );

    // Written back: new real tokens, scopes and the rest kept, mode kept, no stray files.
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let o = &v["claudeAiOauth"];
    assert_eq!(o["accessToken"], NEW_ACCESS, "{v}");
    assert_eq!(o["refreshToken"], NEW_REFRESH, "{v}");
    assert_eq!(
        o["scopes"],
        serde_json::json!(["user:inference", "user:profile"])
    );
    assert_eq!(o["subscriptionType"], "max");
    assert!(o["expiresAt"].as_u64().unwrap() > 1_700_000_000_000);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let names: Vec<String> = std::fs::read_dir(w.home.join(".claude"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("credentials"))
        .collect();
    assert_eq!(names, vec![".credentials.json".to_string()]);

    // The audit log names the sign-in and the refresh, never a token.
    let mut logs = String::new();
    for e in walk(&w.home.join(".local/state/corral")) {
        logs.push_str(&std::fs::read_to_string(e).unwrap_or_default());
    }
    for marker in MARKERS {
        assert!(!logs.contains(marker), "{marker} in the audit log");
    }
    assert!(
        logs.contains("signin.claude: real refresh token put into POST /v1/oauth/token"),
        "{logs}"
    );
    assert!(logs.contains("written back to"), "{logs}");
}

/// A container engine serves sign-ins through its gateway proxy (engine_signin.rs), which needs
/// the proxy: with the host's network a signed-in harness is refused before any container is
/// started, rather than mounted with its real tokens.
#[test]
fn a_container_run_with_the_host_network_refuses_a_signed_in_harness() {
    let w = World::new();
    signed_in(&w);
    for engine in ["podman", "docker"] {
        let mut c = w.corral();
        c.args([
            "run",
            "claude",
            "--engine",
            engine,
            "--network",
            "host",
            "--",
            "true",
        ]);
        let out = run(c);
        assert_eq!(out.code, 125, "{}", out.both());
        assert!(
            out.stderr.contains("signin.claude") && out.stderr.contains("--network proxy"),
            "{}",
            out.both()
        );
        assert!(!out.both().contains(REFRESH), "{}", out.both());
    }
}

/// The control: without the sign-in entry's placeholder file, a jail that can see `~/.claude`
/// reads the real refresh token (the attack the feature stops).
#[test]
fn control_without_signin_the_jail_reads_the_real_refresh_token() {
    let w = World::new();
    signed_in(&w);
    let dir = w.home.join(".claude");
    let mut c = w.corral();
    c.args([
        "run",
        "--network",
        "none",
        "--rw",
        dir.to_str().unwrap(),
        "--",
    ])
    .args([
        "sh",
        "-c",
        "cat ~/.claude/.credentials.json; echo; echo END",
    ]);
    let out = run(c);
    ran(&out, "END");
    assert!(out.stdout.contains(REFRESH), "{}", out.both());
}

/// `--network none`: the jail still gets the placeholder file (the harness starts signed in),
/// nothing real, and the user's file is untouched by what the jail writes.
#[test]
fn without_network_the_jail_gets_the_placeholder_file_and_cannot_touch_the_real_one() {
    let w = World::new();
    let file = signed_in(&w);
    let before = std::fs::read(&file).unwrap();
    let mut c = w.corral();
    c.args(["run", "claude", "--network", "none", "--"]).args([
        "sh",
        "-c",
        "cat ~/.claude/.credentials.json; echo; \
         echo '{}' > ~/.claude/.credentials.json && echo WROTE; \
         rm -f ~/.claude/.credentials.json 2>/dev/null || echo RM-REFUSED; \
         mv ~/.claude ~/.claude-moved 2>/dev/null || echo MV-REFUSED; echo END",
    ]);
    let out = run(c);
    ran(&out, "END");
    for marker in MARKERS {
        assert!(!out.both().contains(marker), "{marker}:\n{}", out.both());
    }
    assert!(
        out.stdout.contains("sk-ant-ort01-") && out.stdout.contains("user:inference"),
        "{}",
        out.both()
    );
    assert!(
        out.stdout.contains("WROTE") && out.stdout.contains("RM-REFUSED"),
        "{}",
        out.both()
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "the jail changed the user's file"
    );
}

/// Codex's ChatGPT sign-in, the same attack: `~/.codex/auth.json` with JWT access and id
/// tokens and an opaque refresh token; the refresh is form-encoded (as Codex sends it).
#[test]
fn codex_auth_json_the_jail_holds_placeholders_and_corral_refreshes_and_writes_back() {
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    const HEAD: &str = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9";
    const EXP: &str = "eyJleHAiOjE5MDAwMDAwMDB9";
    const ID_CLAIMS: &str = "eyJlbWFpbCI6InVAZXhhbXBsZS5jb20iLCJodHRwczovL2FwaS5vcGVuYWkuY29tL2F1dGgiOnsiY2hhdGdwdF9wbGFuX3R5cGUiOiJwbHVzIn19";
    let jwt = |claims: &str, sig: &str| format!("{HEAD}.{claims}.{sig}");
    let access = jwt(
        EXP,
        "CDXACCESSsigCDXACCESSsigCDXACCESSsig0123456789-_abcdef",
    );
    let id = jwt(
        ID_CLAIMS,
        "CDXIDsigCDXIDsigCDXIDsigCDXIDsig0123456789-_abcdefghij",
    );
    let refresh = "rt_CDXREFRESHrealCDXREFRESHreal.0123456789abcdefABCDEF";
    let new_access = jwt(
        EXP,
        "CDXNEWACCESSsigCDXNEWACCESSsig0123456789-_abcdefghijkl",
    );
    let new_refresh = "rt_CDXNEWREFRESHnewCDXNEWREFRESH.0123456789abcdefABCD";
    let markers = [
        "CDXACCESSsig",
        "CDXIDsig",
        "CDXREFRESHreal",
        "CDXNEWACCESSsig",
        "CDXNEWREFRESH",
    ];

    let w = World::new();
    let mdir = w.root.join("mock");
    std::fs::create_dir_all(&mdir).unwrap();
    let tokens = serde_json::json!({"access": access, "refresh": refresh, "new_access": new_access,
        "new_refresh": new_refresh, "new_id": id, "token_path": "/oauth/token"});
    let m = mock_with(&mdir, &host, &tokens);
    let port = m.port;
    let auth = serde_json::json!({"OPENAI_API_KEY": null, "tokens": {"id_token": id,
        "access_token": access, "refresh_token": refresh, "account_id": "acc-1"},
        "last_refresh": "2026-01-01T00:00:00Z"});
    let file = sign_in_project(
        &w,
        "codex",
        ".codex/auth.json",
        (&host, port, "/oauth/token"),
        &auth,
    );
    let url = format!("https://{host}:{port}");
    let greps = leak_greps(&markers);
    // Codex writes auth.json in place.
    let script = format!(
        r#"F=~/.codex/auth.json
get() {{ python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens"][sys.argv[2]])' "$F" "$1"; }}
A=$(get access_token); R=$(get refresh_token); I=$(get id_token)
echo "PH_ACCESS=$A"
echo "PH_ID=$I"
echo "API1=$(curl -sS {url}/backend-api/codex -H "Authorization: Bearer $A")"
RESP=$(curl -sS -X POST {url}/oauth/token -H 'Content-Type: application/x-www-form-urlencoded' --data-urlencode grant_type=refresh_token --data-urlencode client_id=app_x --data-urlencode "refresh_token=$R")
echo "TOKENRESP=$RESP"
echo "$RESP" | python3 -c '
import json, sys
r = json.load(sys.stdin); f = sys.argv[1]
d = json.load(open(f))
for k in ("access_token", "refresh_token", "id_token"):
    d["tokens"][k] = r[k]
open(f, "w").write(json.dumps(d))
' "$F"
echo "API2=$(curl -sS {url}/backend-api/codex -H "Authorization: Bearer $(get access_token)")"
{greps}echo END
"#
    );
    let out = run_jailed(&w, &mdir, "codex", &script);
    let all = out.both();
    let stdout = out.stdout.as_str();
    for marker in markers {
        assert!(!all.contains(marker), "{marker} reached the jail:\n{all}");
    }
    assert!(!stdout.contains("-LEAK-"), "{all}");
    // JWT placeholders keep the header and claims (Codex reads them), not the signature.
    let ph_id = line(stdout, "PH_ID=");
    assert!(
        ph_id.starts_with(&format!("{HEAD}.{ID_CLAIMS}.")) && ph_id.len() == id.len(),
        "{ph_id}"
    );
    assert!(
        line(stdout, "PH_ACCESS=").starts_with(&format!("{HEAD}.{EXP}.")),
        "{all}"
    );
    assert_eq!(line(stdout, "API1="), "\"api-ok\"", "{all}");
    assert_eq!(line(stdout, "API2="), "\"api-ok\"", "{all}");
    let seen = std::fs::read_to_string(mdir.join("seen.jsonl")).unwrap();
    assert!(
        seen.contains("CDXREFRESHreal"),
        "the real refresh token did not reach the endpoint: {seen}"
    );

    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(v["tokens"]["access_token"], new_access.as_str(), "{v}");
    assert_eq!(v["tokens"]["refresh_token"], new_refresh, "{v}");
    assert_eq!(v["tokens"]["id_token"], id.as_str(), "{v}");
    assert_eq!(v["tokens"]["account_id"], "acc-1");
    assert_ne!(v["last_refresh"], "2026-01-01T00:00:00Z");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

/// Gemini CLI's Google sign-in: `~/.gemini/oauth_creds.json` with top-level Google OAuth fields;
/// the refresh is form-encoded and Google's answer carries no new refresh token.
#[test]
fn gemini_oauth_creds_the_jail_holds_placeholders_and_corral_refreshes_and_writes_back() {
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let access = "ya29.GEMACCESSrealGEMACCESSrealGEMACCESSreal_0123456789-abcdefABCDEF";
    let refresh = "1//GEMREFRESHrealGEMREFRESHrealGEMREFRESH-0123456789abcdefABCD";
    let new_access = "ya29.GEMNEWACCESSnewGEMNEWACCESSnewGEMNEW_0123456789-abcdefABCD";
    let markers = ["GEMACCESSreal", "GEMREFRESHreal", "GEMNEWACCESSnew"];

    let w = World::new();
    let mdir = w.root.join("mock");
    std::fs::create_dir_all(&mdir).unwrap();
    // Google does not rotate the refresh token: the mock answers the same one.
    let tokens = serde_json::json!({"access": access, "refresh": refresh, "new_access": new_access,
        "new_refresh": refresh, "token_path": "/token"});
    let m = mock_with(&mdir, &host, &tokens);
    let port = m.port;
    let creds = serde_json::json!({"access_token": access, "refresh_token": refresh,
        "scope": "https://www.googleapis.com/auth/cloud-platform", "token_type": "Bearer",
        "expiry_date": 1_700_000_000_000u64});
    let file = sign_in_project(
        &w,
        "gemini",
        ".gemini/oauth_creds.json",
        (&host, port, "/token"),
        &creds,
    );
    let url = format!("https://{host}:{port}");
    let greps = leak_greps(&markers);
    let script = format!(
        r#"F=~/.gemini/oauth_creds.json
get() {{ python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$F" "$1"; }}
A=$(get access_token); R=$(get refresh_token)
echo "API1=$(curl -sS {url}/v1internal:generateContent -H "Authorization: Bearer $A")"
RESP=$(curl -sS -X POST {url}/token -H 'Content-Type: application/x-www-form-urlencoded' --data-urlencode grant_type=refresh_token --data-urlencode "refresh_token=$R")
echo "TOKENRESP=$RESP"
echo "$RESP" | python3 -c '
import json, sys
r = json.load(sys.stdin); f = sys.argv[1]
d = json.load(open(f)); d["access_token"] = r["access_token"]
open(f, "w").write(json.dumps(d))
' "$F"
echo "API2=$(curl -sS {url}/v1internal:generateContent -H "Authorization: Bearer $(get access_token)")"
echo "SAME_REFRESH=$(test "$(get refresh_token)" = "$R" && echo yes)"
{greps}echo END
"#
    );
    let out = run_jailed(&w, &mdir, "gemini", &script);
    let all = out.both();
    let stdout = out.stdout.as_str();
    for marker in markers {
        assert!(!all.contains(marker), "{marker} reached the jail:\n{all}");
    }
    assert!(!stdout.contains("-LEAK-"), "{all}");
    assert_eq!(line(stdout, "API1="), "\"api-ok\"", "{all}");
    assert_eq!(line(stdout, "API2="), "\"api-ok\"", "{all}");
    // The unchanged refresh token keeps its placeholder.
    assert_eq!(line(stdout, "SAME_REFRESH="), "yes", "{all}");
    let seen = std::fs::read_to_string(mdir.join("seen.jsonl")).unwrap();
    assert!(seen.contains("GEMREFRESHreal"), "{seen}");

    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(v["access_token"], new_access, "{v}");
    assert_eq!(v["refresh_token"], refresh, "{v}");
    assert_eq!(v["scope"], creds["scope"]);
    assert!(v["expiry_date"].as_u64().unwrap() > 1_700_000_000_000);
}

/// A token endpoint that answers form-encoded tokens when asked (`Accept:
/// application/x-www-form-urlencoded`, as GitHub's does), or always (`always_form`): the jail
/// asks for form encoding. corral asks for JSON instead, so the endpoint that honours `Accept`
/// answers JSON and the jail gets placeholders; the one that answers form-encoded anyway gets
/// the jail a 502, never the new real tokens. Control: the same request sent straight to the
/// endpoint gets the new real tokens form-encoded (what was relayed as it was before).
#[test]
fn a_token_endpoint_answering_form_encoded_tokens_never_hands_them_to_the_jail() {
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    for always_form in [false, true] {
        let w = World::new();
        let mdir = w.root.join("mock");
        std::fs::create_dir_all(&mdir).unwrap();
        let tokens = serde_json::json!({"access": ACCESS, "refresh": REFRESH,
            "new_access": NEW_ACCESS, "new_refresh": NEW_REFRESH,
            "token_path": "/v1/oauth/token", "always_form": always_form});
        let m = mock_with(&mdir, &host, &tokens);
        let port = m.port;
        let file = sign_in_project(
            &w,
            "claude",
            ".claude/.credentials.json",
            (&host, port, "/v1/oauth/token"),
            &claude_credentials(),
        );
        let url = format!("https://{host}:{port}");
        let greps = leak_greps(&MARKERS);
        let script = format!(
            r#"F=~/.claude/.credentials.json
R=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["claudeAiOauth"]["refreshToken"])' "$F")
echo "TOKENRESP=$(curl -sS -w ' HTTP=%{{http_code}}' -X POST {url}/v1/oauth/token -H 'Accept: application/x-www-form-urlencoded' -H 'Content-Type: application/x-www-form-urlencoded' --data-urlencode grant_type=refresh_token --data-urlencode "refresh_token=$R" | tr -d '\n')"
{greps}echo END
"#
        );
        let mut c = w.corral();
        c.env("SSL_CERT_FILE", mdir.join("ca.pem")).args([
            "run",
            "claude",
            "--network",
            "proxy",
            "--",
            "sh",
            "-c",
            &script,
        ]);
        let out = run(c);
        ran(&out, "END");
        let all = out.both();
        for marker in MARKERS {
            assert!(!all.contains(marker), "{marker} reached the jail:\n{all}");
        }
        assert!(!out.stdout.contains("-LEAK-"), "{all}");
        let resp = line(&out.stdout, "TOKENRESP=");
        let seen = std::fs::read_to_string(mdir.join("seen.jsonl")).unwrap();
        assert!(
            seen.contains("REFRESHreal"),
            "the refresh never reached the endpoint: {seen}"
        );
        assert!(
            seen.contains(r#""accept": "application/json""#) && !seen.contains("x-www-form"),
            "corral did not ask for JSON: {seen}"
        );
        let on_disk = std::fs::read_to_string(&file).unwrap();
        if always_form {
            assert!(resp.ends_with("HTTP=502"), "{all}");
            assert!(resp.contains("corral credential gateway:"), "{all}");
            let audit = serde_json::to_string(&w.audit_records()).unwrap();
            assert!(audit.contains("the token endpoint answered 200"), "{audit}");
            assert!(on_disk.contains(REFRESH), "{on_disk}");
        } else {
            assert!(
                resp.ends_with("HTTP=200") && resp.contains("access_token"),
                "{all}"
            );
            assert!(on_disk.contains(NEW_REFRESH), "not written back: {on_disk}");
        }

        // Control: straight to the endpoint, with the real refresh token (the rotated one: both
        // runs above refreshed upstream) and the jail's Accept, the answer is the new real
        // tokens, form-encoded.
        let direct = std::process::Command::new("curl")
            .args(["-sS", "--cacert"])
            .arg(mdir.join("ca.pem"))
            .args(["-X", "POST", &format!("{url}/v1/oauth/token")])
            .args(["-H", "Accept: application/x-www-form-urlencoded"])
            .args(["-H", "Content-Type: application/x-www-form-urlencoded"])
            .args(["--data-urlencode", "grant_type=refresh_token"])
            .args(["--data-urlencode", &format!("refresh_token={NEW_REFRESH}")])
            .output()
            .unwrap();
        let direct = String::from_utf8_lossy(&direct.stdout);
        assert!(
            direct.starts_with("token_type=Bearer&access_token=")
                && direct.contains("NEWACCESSnewACCESS"),
            "control: {direct}"
        );
        drop(m);
    }
}

/// Google's refresh tokens (`1//...`) are percent-encoded in a form-encoded refresh; an error
/// answer quoting the request body returns the real one percent-encoded. It reaches the jail as
/// the percent-encoded placeholder. Control: the endpoint, sent the real token as corral sends
/// it, quotes it in a form that does not hold the raw token (a raw-only scrubber misses it).
#[test]
fn an_error_quoting_the_percent_encoded_refresh_token_reaches_the_jail_as_its_placeholder() {
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let access = "ya29.QUOACCESSrealQUOACCESSrealQUOACCESSreal_0123456789-abcdefABCDEF";
    let refresh = "1//QUOREFRESHrealQUOREFRESHrealQUOREFRESH-0123456789abcdefABCD";
    let w = World::new();
    let mdir = w.root.join("mock");
    std::fs::create_dir_all(&mdir).unwrap();
    let tokens = serde_json::json!({"access": access, "refresh": refresh, "new_access": access,
        "new_refresh": refresh, "token_path": "/token", "quote_errors": true});
    let m = mock_with(&mdir, &host, &tokens);
    let port = m.port;
    let creds = serde_json::json!({"access_token": access, "refresh_token": refresh,
        "token_type": "Bearer", "expiry_date": 1_700_000_000_000u64});
    sign_in_project(
        &w,
        "gemini",
        ".gemini/oauth_creds.json",
        (&host, port, "/token"),
        &creds,
    );
    let url = format!("https://{host}:{port}");
    let greps = leak_greps(&["QUOREFRESHreal", "QUOACCESSreal"]);
    let script = format!(
        r#"R=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["refresh_token"])' ~/.gemini/oauth_creds.json)
echo "PH_PCT=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$R")"
echo "ERR=$(curl -sS -w ' HTTP=%{{http_code}}' -X POST {url}/token -H 'Content-Type: application/x-www-form-urlencoded' --data-urlencode grant_type=refresh_token --data-urlencode "refresh_token=$R")"
{greps}echo END
"#
    );
    let out = run_jailed(&w, &mdir, "gemini", &script);
    let all = out.both();
    assert!(
        !all.contains("QUOREFRESHreal") && !all.contains("-LEAK-"),
        "{all}"
    );
    let err = line(&out.stdout, "ERR=");
    assert!(err.ends_with("HTTP=400"), "{all}");
    let ph_pct = line(&out.stdout, "PH_PCT=");
    assert!(ph_pct.contains("%2F%2F") && err.contains(ph_pct), "{all}");
    let seen = std::fs::read_to_string(mdir.join("seen.jsonl")).unwrap();
    assert!(seen.contains("1%2F%2FQUOREFRESHreal"), "{seen}");

    // Control: what the endpoint quotes when sent the real token the way corral sends it.
    let direct = std::process::Command::new("curl")
        .args(["-sS", "--cacert"])
        .arg(mdir.join("ca.pem"))
        .args(["-X", "POST", &format!("{url}/token")])
        .args(["-H", "Content-Type: application/x-www-form-urlencoded"])
        .args(["--data-urlencode", &format!("refresh_token={refresh}")])
        .output()
        .unwrap();
    let direct = String::from_utf8_lossy(&direct.stdout);
    assert!(
        direct.contains("1%2F%2FQUOREFRESHreal") && !direct.contains(refresh),
        "control: {direct}"
    );
    drop(m);
}

/// An origin that reflects `Authorization` and honours `Range`: the jail asks for the echo of
/// its placeholder in 10-byte pieces, which the whole-value scrubber would not recognise, and
/// joins them. corral drops `Range` where it injected a value, so each answer is the whole
/// echo, scrubbed. Control: the same pieces asked straight from the origin with the real token
/// join into it.
#[test]
fn a_reflected_token_cannot_be_fetched_in_pieces_with_range() {
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let w = World::new();
    let mdir = w.root.join("mock");
    std::fs::create_dir_all(&mdir).unwrap();
    let m = mock(&mdir, &host);
    let port = m.port;
    sign_in_project(
        &w,
        "claude",
        ".claude/.credentials.json",
        (&host, port, "/v1/oauth/token"),
        &claude_credentials(),
    );
    let url = format!("https://{host}:{port}");
    let script = format!(
        r#"A=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["claudeAiOauth"]["accessToken"])' ~/.claude/.credentials.json)
J=""; CODES=""
for s in $(seq 0 10 140); do
  C=$(curl -sS -o "$PWD/piece" -w '%{{http_code}}' {url}/echo -H "Authorization: Bearer $A" -H "Range: bytes=$s-$((s + 9))" -H 'If-Range: "x"')
  CODES="$CODES $C"; J="$J$(cat "$PWD/piece")"
done
echo "CODES=$CODES"
echo "JOINED=$J"
echo END
"#
    );
    let out = run_jailed(&w, &mdir, "claude", &script);
    let all = out.both();
    assert!(
        !all.contains("ACCESSrealACCESSreal"),
        "the pieces joined into the token:\n{all}"
    );
    let codes = line(&out.stdout, "CODES=");
    let codes: Vec<&str> = codes.split_whitespace().collect();
    assert_eq!(codes, ["200"; 15], "{all}");

    // Control: the same pieces straight from the origin, with the real token.
    let mut joined = String::new();
    for s in (0..150).step_by(10) {
        let piece = std::process::Command::new("curl")
            .args(["-sS", "--cacert"])
            .arg(mdir.join("ca.pem"))
            .arg(format!("{url}/echo"))
            .args(["-H", &format!("Authorization: Bearer {ACCESS}")])
            .args(["-H", &format!("Range: bytes={s}-{}", s + 9)])
            .output()
            .unwrap();
        joined.push_str(&String::from_utf8_lossy(&piece.stdout));
    }
    assert!(joined.contains(ACCESS), "control: {joined}");
    drop(m);
}

/// pi's and opencode's by-provider files: one Claude Pro/Max OAuth sign-in, one API key corral
/// knows the host of, one API key of a provider the entry does not name, a `!command` key.
struct ByProvider {
    profile: &'static str,
    rel: &'static str,
    api_key_type: &'static str,
}

const PI: ByProvider = ByProvider {
    profile: "pi",
    rel: ".pi/agent/auth.json",
    api_key_type: "api_key",
};
const OPENCODE: ByProvider = ByProvider {
    profile: "opencode",
    rel: ".local/share/opencode/auth.json",
    api_key_type: "api",
};

/// An account of the jail's own that the mock's token endpoint accepts as well.
const BP_FOREIGN_REFRESH: &str = "sk-ant-ort01-JAILSOWNrefreshJAILSOWNrefresh0123456789";
const BP_FOREIGN_ACCESS: &str = "sk-ant-oat01-JAILSOWNaccessJAILSOWNaccess0123456789ab";

/// The known provider's API key and the unknown provider's, with their scan markers.
const BP_KEY: &str = "sk-proj-BPKEYrealBPKEYrealBPKEYreal0123456789abcdefABCDEF";
const BP_UNKNOWN: &str = "gsk_BPUNKNOWNrealBPUNKNOWNrealBPUNKNOWN0123456789ab";
const BP_MARKERS: [&str; 6] = [
    MARKERS[0],
    MARKERS[1],
    MARKERS[2],
    MARKERS[3],
    "BPKEYrealBPKEY",
    "BPUNKNOWNrealBPUNKNOWN",
];

fn by_provider_file(h: &ByProvider) -> serde_json::Value {
    serde_json::json!({
        "anthropic": {"type": "oauth", "access": ACCESS, "refresh": REFRESH,
            "expires": 1_700_000_000_000u64},
        "openai": {"type": h.api_key_type, "key": BP_KEY},
        "groq": {"type": h.api_key_type, "key": BP_UNKNOWN},
        "google": {"type": h.api_key_type, "key": "!printf from-a-command"},
    })
}

/// The user's file `h.rel` and a trusted project policy serving it with `anthropic` (OAuth)
/// and `openai` (API key) at the mock; `groq` is not named. `file_at` replaces the entry's
/// file (the control points the sign-in elsewhere).
fn by_provider_project(
    w: &World,
    h: &ByProvider,
    (host, port): (&str, u16),
    file_at: &str,
) -> std::path::PathBuf {
    let file = w.home.join(h.rel);
    write(
        &file,
        &serde_json::to_string_pretty(&by_provider_file(h)).unwrap(),
    );
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let name = h.profile;
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [\"{host}:{port}\"]\nallow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [signin.{name}]\nformat = \"{name}\"\nfile = \"~/{file_at}\"\n\n\
             [signin.{name}.providers.anthropic]\napi_hosts = [\"{host}:{port}\"]\n\
             token_url = \"https://{host}:{port}/v1/oauth/token\"\n\n\
             [signin.{name}.providers.openai]\napi_hosts = [\"{host}:{port}\"]\n"
        ),
    );
    w.trust_project(&[]);
    file
}

/// What pi and opencode do with their file against the mock at `url`: read the placeholders,
/// call the API with the OAuth access token and with each API key, refresh Anthropic's way
/// (JSON body), write the new tokens into the file in place (pi's `writeFileSync`), call the
/// API again. Prints `PH_*=`, `API1=`, `KEY=`, `UNKNOWN=`, `UNKNOWN_ECHO=`, `COMMAND=`,
/// `TOKENRESP=`, `API2=` lines. Never spells a real value.
fn by_provider_script(h: &ByProvider, url: &str) -> String {
    let greps = leak_greps(&BP_MARKERS);
    let rel = h.rel;
    format!(
        r#"F=~/{rel}
get() {{ python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]][sys.argv[3]])' "$F" "$1" "$2"; }}
A=$(get anthropic access); R=$(get anthropic refresh); K=$(get openai key); U=$(get groq key)
echo "PH_ACCESS=$A"
echo "PH_UNKNOWN=$U"
echo "COMMAND=$(get google key)"
echo "API1=$(curl -sS {url}/v1/messages -H "Authorization: Bearer $A")"
echo "KEY=$(curl -sS {url}/echo -H "Authorization: Bearer $K")"
echo "UNKNOWN=$(curl -sS {url}/v1/messages -H "Authorization: Bearer $U")"
echo "UNKNOWN_ECHO=$(curl -sS {url}/echo -H "Authorization: Bearer $U")"
RESP=$(curl -sS -X POST {url}/v1/oauth/token -H 'Content-Type: application/json' -d "{{\"grant_type\":\"refresh_token\",\"refresh_token\":\"$R\",\"client_id\":\"9d1c250a\"}}")
echo "TOKENRESP=$RESP"
echo "$RESP" | python3 -c '
import json, sys
r = json.load(sys.stdin); f = sys.argv[1]
d = json.load(open(f))
d["anthropic"].update(access=r["access_token"], refresh=r["refresh_token"])
open(f, "w").write(json.dumps(d, indent=2))
' "$F"
echo "API2=$(curl -sS {url}/v1/messages -H "Authorization: Bearer $(get anthropic access)")"
# The jail's own account: a refresh with a token of its own, which the endpoint accepts.
echo "FOREIGN=$(curl -sS -X POST {url}/v1/oauth/token -H 'Content-Type: application/json' -d '{{"grant_type":"refresh_token","refresh_token":"{BP_FOREIGN_REFRESH}"}}')"
{greps}echo END
"#
    )
}

/// A by-provider sign-in in the jail, end to end (see [`by_provider_script`]).
fn by_provider_signin(h: &ByProvider) {
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let w = World::new();
    let mdir = w.root.join("mock");
    std::fs::create_dir_all(&mdir).unwrap();
    let tokens = serde_json::json!({"access": ACCESS, "refresh": REFRESH,
        "new_access": NEW_ACCESS, "new_refresh": NEW_REFRESH, "token_path": "/v1/oauth/token",
        "foreign_refresh": BP_FOREIGN_REFRESH, "foreign_access": BP_FOREIGN_ACCESS});
    let m = mock_with(&mdir, &host, &tokens);
    let file = by_provider_project(&w, h, (&host, m.port), h.rel);
    let url = format!("https://{host}:{}", m.port);
    let out = run_jailed(&w, &mdir, h.profile, &by_provider_script(h, &url));
    let all = out.both();
    let stdout = out.stdout.as_str();
    for marker in BP_MARKERS {
        assert!(!all.contains(marker), "{marker} reached the jail:\n{all}");
    }
    assert!(!stdout.contains("-LEAK-"), "{all}");
    let ph = line(stdout, "PH_ACCESS=");
    assert!(
        ph.starts_with("sk-ant-oat01-") && ph.len() == ACCESS.len(),
        "{ph}"
    );
    // The command stays as pi wrote it (pi runs it; corral never swaps or writes it).
    assert_eq!(line(stdout, "COMMAND="), "!printf from-a-command", "{all}");
    // The OAuth access token and the known key reach the API as the real ones.
    assert_eq!(line(stdout, "API1="), "\"api-ok\"", "{all}");
    assert!(line(stdout, "KEY=").contains("sk-proj-"), "{all}");
    // The unknown provider's key: a placeholder the API refuses, reflected as itself.
    let ph_unknown = line(stdout, "PH_UNKNOWN=");
    assert!(
        ph_unknown.starts_with("gsk_") && ph_unknown.len() == BP_UNKNOWN.len(),
        "{ph_unknown}"
    );
    assert_eq!(line(stdout, "UNKNOWN="), "\"bad-token\"", "{all}");
    assert!(line(stdout, "UNKNOWN_ECHO=").contains(ph_unknown), "{all}");
    let resp: serde_json::Value = serde_json::from_str(line(stdout, "TOKENRESP=")).unwrap();
    let new_ph = resp["access_token"].as_str().unwrap();
    assert!(
        new_ph.starts_with("sk-ant-oat01-") && new_ph != ph,
        "{resp}"
    );
    assert_eq!(line(stdout, "API2="), "\"api-ok\"", "{all}");
    // The jail's own refresh is answered (as placeholders) but never lands in the user's file.
    let foreign: serde_json::Value = serde_json::from_str(line(stdout, "FOREIGN=")).unwrap();
    assert!(
        foreign["access_token"]
            .as_str()
            .is_some_and(|a| a.starts_with("sk-ant-oat01-") && a != BP_FOREIGN_ACCESS),
        "{all}"
    );

    // The origin saw the real access token, the real refresh token and the known key; never
    // the unknown provider's key.
    let seen = std::fs::read_to_string(mdir.join("seen.jsonl")).unwrap();
    for real in [ACCESS, NEW_ACCESS, REFRESH, BP_KEY] {
        assert!(
            seen.contains(real),
            "{real} did not reach the origin: {seen}"
        );
    }
    assert!(!seen.contains(BP_UNKNOWN), "{seen}");
    assert!(seen.contains(ph_unknown), "{seen}");

    // Written back in place: anthropic's new tokens; every other entry as it was.
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let before = by_provider_file(h);
    assert_eq!(v["anthropic"]["access"], NEW_ACCESS, "{v}");
    assert_eq!(v["anthropic"]["refresh"], NEW_REFRESH, "{v}");
    assert_eq!(v["anthropic"]["type"], "oauth");
    assert!(v["anthropic"]["expires"].as_u64().unwrap() > 1_700_000_000_000);
    for other in ["openai", "groq", "google"] {
        assert_eq!(v[other], before[other], "{other}");
    }
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let mut logs = String::new();
    for e in walk(&w.home.join(".local/state/corral")) {
        logs.push_str(&std::fs::read_to_string(e).unwrap_or_default());
    }
    for marker in BP_MARKERS {
        assert!(!logs.contains(marker), "{marker} in the audit log");
    }
    let name = h.profile;
    assert!(
        logs.contains(&format!(
            "signin.{name}.anthropic: refreshed; new tokens kept by corral and written back"
        )),
        "{logs}"
    );
    assert!(
        logs.contains("carried no refresh token of this run"),
        "{logs}"
    );
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains("JAILSOWN"), "{text}");
}

#[test]
fn pi_auth_json_holds_placeholders_and_corral_swaps_refreshes_and_writes_back() {
    by_provider_signin(&PI);
}

#[test]
fn opencode_auth_json_holds_placeholders_and_corral_swaps_refreshes_and_writes_back() {
    by_provider_signin(&OPENCODE);
}

/// The control for both: the same run with the sign-in pointed at a file that does not exist
/// reads the real file, refresh token and unknown key included, and the unknown key reaches
/// the origin.
#[test]
fn control_without_the_by_provider_signin_the_jail_reads_the_real_tokens() {
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    for h in [PI, OPENCODE] {
        let w = World::new();
        let mdir = w.root.join("mock");
        std::fs::create_dir_all(&mdir).unwrap();
        let m = mock(&mdir, &host);
        let elsewhere = format!("{}.absent", h.rel);
        by_provider_project(&w, &h, (&host, m.port), &elsewhere);
        let url = format!("https://{host}:{}", m.port);
        let script = format!(
            "F=~/{}; cat \"$F\"; echo; \
             U=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[\"groq\"][\"key\"])' \"$F\"); \
             curl -sSk {url}/echo -H \"Authorization: Bearer $U\"; echo; echo END",
            h.rel
        );
        let out = run_jailed(&w, &mdir, h.profile, &script);
        assert!(
            out.stdout.contains(REFRESH) && out.stdout.contains(BP_UNKNOWN),
            "{}: {}",
            h.profile,
            out.both()
        );
        let seen = std::fs::read_to_string(mdir.join("seen.jsonl")).unwrap_or_default();
        assert!(
            seen.contains(BP_UNKNOWN),
            "{}: {seen}\n{}",
            h.profile,
            out.both()
        );
    }
}

/// The audit records of the run, all files under corral's state directory.
fn audit_logs(w: &World) -> String {
    walk(&w.home.join(".local/state/corral"))
        .into_iter()
        .map(|e| std::fs::read_to_string(e).unwrap_or_default())
        .collect()
}

const CODEX_KEY: &str = "sk-proj-CDXKEYrealCDXKEYrealCDXKEYreal0123456789abcdefABCDEFghij";
const CODEX_ACCESS: &str = "CDXACCESSrealCDXACCESSreal0123456789abcdefABCDEFghijklmnop";

/// Codex with an API key in `auth.json` (`OPENAI_API_KEY`), with or without a ChatGPT sign-in
/// beside it. The jail holds a placeholder that the gateway swaps for the real key only in
/// requests to the entry's `api_key_hosts` (a mock on a port of its own). The attack: the jail
/// sends the key's placeholder to the sign-in's API host (allowed, and intercepted by the
/// gateway for the access token): it arrives there as the placeholder, the real key never
/// leaves. The control: the same placeholder to the key's host is answered by a server that
/// takes the real key only.
fn codex_api_key_goes_to_its_own_host_only(with_tokens: bool) {
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let w = World::new();
    let (adir, kdir) = (w.root.join("mock"), w.root.join("keymock"));
    std::fs::create_dir_all(&adir).unwrap();
    let chat = mock_with(
        &adir,
        &host,
        &serde_json::json!({"access": CODEX_ACCESS, "refresh": "rt-unused-in-this-test",
            "new_access": "-", "new_refresh": "-", "token_path": "/oauth/token"}),
    );
    let api = mock_beside(
        &adir,
        &kdir,
        &serde_json::json!({"access": CODEX_KEY, "refresh": "-", "new_access": "-",
            "new_refresh": "-", "token_path": "/none"}),
    );
    let (pa, pk) = (chat.port, api.port);
    let auth = if with_tokens {
        serde_json::json!({"OPENAI_API_KEY": CODEX_KEY, "tokens": {"access_token": CODEX_ACCESS,
            "refresh_token": "rt_CDXREFRESHrealCDXREFRESHreal0123456789", "account_id": "acc-1"},
            "last_refresh": "2026-01-01T00:00:00Z"})
    } else {
        serde_json::json!({"OPENAI_API_KEY": CODEX_KEY, "tokens": null, "last_refresh": null})
    };
    let file = w.home.join(".codex/auth.json");
    write(&file, &serde_json::to_string_pretty(&auth).unwrap());
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [\"{host}:{pa}\", \"{host}:{pk}\"]\n\
             allow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [signin.codex]\nformat = \"codex\"\nfile = \"~/.codex/auth.json\"\n\
             api_hosts = [\"{host}:{pa}\"]\ntoken_url = \"https://{host}:{pa}/oauth/token\"\n\
             api_key_hosts = [\"{host}:{pk}\"]\n"
        ),
    );
    w.trust_project(&[]);
    let (aurl, kurl) = (
        format!("https://{host}:{pa}"),
        format!("https://{host}:{pk}"),
    );
    let markers = ["CDXKEYreal", "CDXACCESSreal", "CDXREFRESHreal"];
    let greps = leak_greps(&markers);
    let tokens_part = if with_tokens {
        format!(
            r#"A=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens"]["access_token"])' "$F")
echo "ACCESSAPI=$(curl -sS {aurl}/backend-api/codex -H "Authorization: Bearer $A")"
echo "CROSSED=$(curl -sS {kurl}/v1/responses -H "Authorization: Bearer $A")"
"#
        )
    } else {
        String::new()
    };
    let script = format!(
        r#"F=~/.codex/auth.json
K=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["OPENAI_API_KEY"])' "$F")
echo "PH_KEY=$K"
echo "KEYAPI=$(curl -sS {kurl}/v1/responses -H "Authorization: Bearer $K")"
echo "CHATAPI=$(curl -sS {aurl}/backend-api/codex -H "Authorization: Bearer $K")"
{tokens_part}{greps}echo END
"#
    );
    let out = run_jailed(&w, &adir, "codex", &script);
    let all = out.both();
    let stdout = out.stdout.as_str();
    for marker in markers {
        assert!(!all.contains(marker), "{marker} reached the jail:\n{all}");
    }
    assert!(!stdout.contains("-LEAK-"), "{all}");
    let ph = line(stdout, "PH_KEY=");
    assert!(
        ph.starts_with("sk-proj-") && ph.len() == CODEX_KEY.len() && ph != CODEX_KEY,
        "{all}"
    );
    // The control: the key's host got the real key.
    assert_eq!(line(stdout, "KEYAPI="), "\"api-ok\"", "{all}");
    let key_seen = std::fs::read_to_string(kdir.join("seen.jsonl")).unwrap();
    assert!(
        key_seen.contains(&format!("Bearer {CODEX_KEY}")),
        "{key_seen}"
    );
    // The attack: the sign-in's host got the placeholder, never the key.
    assert_eq!(line(stdout, "CHATAPI="), "\"bad-token\"", "{all}");
    let chat_seen = std::fs::read_to_string(adir.join("seen.jsonl")).unwrap();
    assert!(
        chat_seen.contains(&format!("Bearer {ph}")) && !chat_seen.contains("CDXKEYreal"),
        "{chat_seen}"
    );
    if with_tokens {
        // The sign-in's access token goes to its host, and never to the key's.
        assert_eq!(line(stdout, "ACCESSAPI="), "\"api-ok\"", "{all}");
        assert_eq!(line(stdout, "CROSSED="), "\"bad-token\"", "{all}");
        assert!(!key_seen.contains("CDXACCESSreal"), "{key_seen}");
    }
    let logs = audit_logs(&w);
    assert!(
        logs.contains("signin.codex/OPENAI_API_KEY: placeholder sent to unbound host"),
        "{logs}"
    );
    for marker in markers {
        assert!(!logs.contains(marker), "{marker} in the audit log");
    }
    // The user's file is as it was.
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(v, auth);
}

#[test]
fn codex_api_key_only_auth_json_goes_to_its_own_host_only() {
    codex_api_key_goes_to_its_own_host_only(false);
}

#[test]
fn codex_api_key_beside_a_chatgpt_sign_in_goes_to_its_own_host_only() {
    codex_api_key_goes_to_its_own_host_only(true);
}

const MCP_ACCESS: &str = "mcp-MCPACCESSrealMCPACCESSreal0123456789abcdefABCDEFghij";
const MCP_REFRESH: &str = "mcp-MCPREFRESHrealMCPREFRESHreal0123456789abcdefABCDEF";

/// Claude Code's `mcpOAuth`: a remote MCP server's OAuth tokens beside the sign-in. The jail
/// holds placeholders; the server's access token is swapped only in requests to its
/// `serverUrl`'s host (a mock on a port of its own), its refresh token nowhere. The attacks:
/// the server's placeholder sent to Claude's API host (allowed and intercepted), Claude's own
/// token and the server's refresh token sent to the server: each arrives as the placeholder.
/// The controls: the server and the API each answer their own placeholder (they take the real
/// tokens only).
#[test]
fn mcp_servers_oauth_tokens_go_to_their_own_server_only() {
    let Some(host) = loopback_name() else {
        eprintln!("skipping: this machine's host name does not resolve to loopback only");
        return;
    };
    let w = World::new();
    let (adir, mdir) = (w.root.join("mock"), w.root.join("mcpmock"));
    std::fs::create_dir_all(&adir).unwrap();
    let claude = mock(&adir, &host);
    let mcp = mock_beside(
        &adir,
        &mdir,
        &serde_json::json!({"access": MCP_ACCESS, "refresh": MCP_REFRESH, "new_access": "-",
            "new_refresh": "-", "token_path": "/none"}),
    );
    let (pa, pm) = (claude.port, mcp.port);
    let mut creds = claude_credentials();
    creds["mcpOAuth"] = serde_json::json!({"notion|0123abcd": {"serverName": "notion",
        "serverUrl": format!("https://{host}:{pm}/mcp"), "clientId": "client-1",
        "accessToken": MCP_ACCESS, "refreshToken": MCP_REFRESH,
        "expiresAt": 1_900_000_000_000u64, "scope": ""}});
    let file = w.home.join(".claude/.credentials.json");
    write(&file, &serde_json::to_string_pretty(&creds).unwrap());
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    write(
        &w.project.join("corral.toml"),
        &format!(
            "[network]\nmode = \"proxy\"\nallow = [\"{host}:{pa}\", \"{host}:{pm}\"]\n\
             allow_cidrs = [\"127.0.0.0/8\"]\n\n\
             [signin.claude]\nformat = \"claude\"\nfile = \"~/.claude/.credentials.json\"\n\
             api_hosts = [\"{host}:{pa}\"]\ntoken_url = \"https://{host}:{pa}/v1/oauth/token\"\n"
        ),
    );
    w.trust_project(&[]);
    let (aurl, murl) = (
        format!("https://{host}:{pa}"),
        format!("https://{host}:{pm}"),
    );
    let mut markers = vec!["MCPACCESSreal", "MCPREFRESHreal"];
    markers.extend(MARKERS);
    let greps = leak_greps(&markers);
    let script = format!(
        r#"F=~/.claude/.credentials.json
get() {{ python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2:]: d = d[k]
print(d)' "$F" "$@"; }}
M=$(get mcpOAuth 'notion|0123abcd' accessToken); MR=$(get mcpOAuth 'notion|0123abcd' refreshToken)
A=$(get claudeAiOauth accessToken)
echo "PH_MCP=$M"
echo "PH_MCPR=$MR"
echo "URL=$(get mcpOAuth 'notion|0123abcd' serverUrl)"
echo "MCP=$(curl -sS {murl}/mcp -H "Authorization: Bearer $M")"
echo "API=$(curl -sS {aurl}/v1/messages -H "Authorization: Bearer $A")"
echo "MCP_TO_API=$(curl -sS {aurl}/v1/messages -H "Authorization: Bearer $M")"
echo "API_TO_MCP=$(curl -sS {murl}/mcp -H "Authorization: Bearer $A")"
echo "REFRESH_TO_MCP=$(curl -sS {murl}/mcp -H "Authorization: Bearer $MR")"
{greps}echo END
"#
    );
    let out = run_jailed(&w, &adir, "claude", &script);
    let all = out.both();
    let stdout = out.stdout.as_str();
    for marker in &markers {
        assert!(!all.contains(marker), "{marker} reached the jail:\n{all}");
    }
    assert!(!stdout.contains("-LEAK-"), "{all}");
    let (ph, ph_r) = (line(stdout, "PH_MCP="), line(stdout, "PH_MCPR="));
    assert!(
        ph.starts_with("mcp-") && ph.len() == MCP_ACCESS.len(),
        "{all}"
    );
    assert_eq!(line(stdout, "URL="), format!("{murl}/mcp"));
    // The controls: each host takes its own placeholder.
    assert_eq!(line(stdout, "MCP="), "\"api-ok\"", "{all}");
    assert_eq!(line(stdout, "API="), "\"api-ok\"", "{all}");
    // The attacks: crossed placeholders arrive as themselves.
    for key in ["MCP_TO_API=", "API_TO_MCP=", "REFRESH_TO_MCP="] {
        assert_eq!(line(stdout, key), "\"bad-token\"", "{key}\n{all}");
    }
    let api_seen = std::fs::read_to_string(adir.join("seen.jsonl")).unwrap();
    let mcp_seen = std::fs::read_to_string(mdir.join("seen.jsonl")).unwrap();
    assert!(
        mcp_seen.contains(&format!("Bearer {MCP_ACCESS}")),
        "{mcp_seen}"
    );
    assert!(
        api_seen.contains(&format!("Bearer {ph}")) && !api_seen.contains("MCPACCESSreal"),
        "{api_seen}"
    );
    assert!(
        mcp_seen.contains(&format!("Bearer {ph_r}")) && !mcp_seen.contains("ACCESSrealACCESSreal"),
        "{mcp_seen}"
    );
    for seen in [&api_seen, &mcp_seen] {
        assert!(!seen.contains("MCPREFRESHreal"), "{seen}");
    }
    let logs = audit_logs(&w);
    assert!(
        logs.contains(
            "signin.claude/mcpOAuth/notion|0123abcd/accessToken: placeholder sent to unbound host"
        ),
        "{logs}"
    );
    for marker in &markers {
        assert!(!logs.contains(marker), "{marker} in the audit log");
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(v, creds);
}
