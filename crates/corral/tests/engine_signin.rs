//! Sign-ins (`[signin]`) on the container backends for real, podman and
//! docker alike, with Claude Code's file shape: the user's `~/.claude/.credentials.json` holds
//! a real access and refresh token; a TLS mock (a container on the external network) serves an
//! API that accepts only the current real access token and a token endpoint that accepts only
//! the current real refresh token and rotates both. The harness container does what Claude Code
//! does with its file (read, call, refresh, rewrite, call again), tries to get at the real file
//! (unmount the placeholder, move the directory), and greps every file it can read and every
//! process environment for the real tokens. From the host, while it runs, the memory of every
//! process of the harness container is scanned and every container's configuration inspected.
//! Afterwards the user's file holds the new real tokens (same inode, mode and other fields) and
//! nothing of the run is left.
//!
//! Needs root, openssl, and the image `localhost/corral-ci-harness:latest` (ci/podman-setup.sh,
//! ci/docker-setup.sh), as engine_secrets.rs.

mod e2e_support;
mod engine_support;
mod jail_support;
mod signin_support;

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use engine_support::{Engine, IMAGE, World, on_every_engine};
use signin_support::*;

on_every_engine!(
    the_harness_holds_placeholders_and_the_host_file_gets_the_refreshed_tokens,
    without_network_the_harness_gets_the_placeholder_file_only,
    the_host_network_is_refused_for_a_signed_in_harness,
    sigterm_to_corral_removes_the_gateway_and_the_placeholder_files,
    corral_down_removes_what_a_killed_signin_run_left,
    control_without_signin_the_container_reads_the_real_refresh_token,
    after_corral_is_killed_a_refresh_is_refused_rather_than_lost,
    codex_auth_json_is_served_with_a_form_encoded_refresh_and_written_back,
    pi_auth_json_is_served_by_provider_and_written_back,
);

/// The user's home for the run, with the signed-in Claude Code file (mode 0600); the file.
fn signed_in(w: &World) -> PathBuf {
    let file = home(w).join(".claude/.credentials.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(
        &file,
        serde_json::to_string_pretty(&claude_credentials()).unwrap(),
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    file
}

fn home(w: &World) -> PathBuf {
    w.dir.path().join("home")
}

/// corral with `args` in the project, as the user whose home is [`home`].
fn corral_cmd(w: &World, args: &[&str]) -> std::process::Command {
    let mut c = w.command(args);
    c.env("HOME", home(w));
    c
}

/// A trusted project running the CI image whose `[signin.claude]` names the mock at `api:8443`
/// (reached through the proxy, `subnet` allowed for it) in network mode `mode`.
fn signin_project(w: &World, api: &str, subnet: &str, mode: &str) {
    std::fs::write(
        w.project.join("corral.toml"),
        format!(
            "[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"{mode}\"\n\
             allow = [\"{api}:8443\"]\nallow_cidrs = [\"{subnet}\"]\n\n\
             [signin.claude]\nformat = \"claude\"\nfile = \"~/.claude/.credentials.json\"\n\
             api_hosts = [\"{api}:8443\"]\ntoken_url = \"https://{api}:8443/v1/oauth/token\"\n"
        ),
    )
    .unwrap();
    let out = corral_cmd(w, &["trust"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// `corral run claude --engine E -- /bin/bash -c script`.
fn run_script(w: &World, script: &str) -> std::process::Command {
    corral_cmd(
        w,
        &[
            "run",
            "claude",
            "--engine",
            w.engine.name(),
            "--",
            "/bin/bash",
            "-c",
            script,
        ],
    )
}

/// The tokens of the Claude-shaped sign-in the mock knows.
fn claude_tokens() -> serde_json::Value {
    serde_json::json!({"access": ACCESS, "refresh": REFRESH,
        "new_access": NEW_ACCESS, "new_refresh": NEW_REFRESH, "token_path": "/v1/oauth/token"})
}

/// A world whose mock API and token endpoint (answering `tokens`) run on an external network
/// of their own: the world, the mock's name (also its alias), the network's subnet and the
/// mock's directory (its test CA `ca.pem`, the `seen.jsonl` it writes).
fn mock_world(e: Engine, tokens: &serde_json::Value) -> (World, String, String, PathBuf) {
    let w = World::new(e, "g");
    let api = format!("{}-auth", w.prefix);
    let mock = w.dir.path().join("mock");
    std::fs::create_dir_all(&mock).unwrap();
    let external = format!("{}-external", w.prefix);
    e.ok(&["network", "create", &external]);
    let subnet = e.subnet(&external);
    start_mock_with(e, &mock, (&api, &api, &external), tokens);
    (w, api, subnet, mock)
}

/// The mock ([`MOCK`]) in a container named `name` on `network` as `alias`, answering `tokens`,
/// with a certificate for `alias` from the test CA in `dir` (which it writes `seen.jsonl` into).
fn start_mock_with(
    e: Engine,
    dir: &Path,
    (name, alias, network): (&str, &str, &str),
    tokens: &serde_json::Value,
) {
    e2e_support::certs(dir, alias);
    std::fs::write(dir.join("mock.py"), MOCK).unwrap();
    std::fs::write(dir.join("tokens.json"), tokens.to_string()).unwrap();
    let volume = format!("{}:/m:rw", dir.display());
    e.ok(&[
        "run",
        "--detach",
        "--name",
        name,
        "--network",
        network,
        "--network-alias",
        alias,
        "--volume",
        &volume,
        "--workdir",
        "/m",
        "--pull",
        "never",
        "--entrypoint",
        "python3",
        IMAGE,
        "-u",
        "/m/mock.py",
        "0.0.0.0",
        "8443",
    ]);
}

/// The run's files still in the state directory: gateway directories, placeholder files.
fn run_files(w: &World) -> Vec<PathBuf> {
    e2e_support::walk(&w.state)
        .into_iter()
        .filter(|f| {
            f.components()
                .any(|c| c.as_os_str() == "gateway" || c.as_os_str() == "signin")
        })
        .collect()
}

/// The harness script: Claude Code's exchange, the attempts at the real file, the greps, then
/// `ready` and a wait for `go`. The markers it greps for are assembled at run time.
fn harness_script(url: &str, ready: &Path, go: &Path) -> String {
    let greps: String = MARKERS
        .iter()
        .map(|m| {
            let (a, b) = m.split_at(m.len() / 2);
            format!(
                "P={a}; P=${{P}}{b}; \
                 if grep -rqs --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev --exclude-dir=usr \"$P\" /; then echo FILE-LEAK-{a}; fi; \
                 if cat /proc/[0-9]*/environ 2>/dev/null | grep -q \"$P\"; then echo ENV-LEAK-{a}; fi\n"
            )
        })
        .collect();
    format!(
        r#"{exchange}
umount ~/.claude/.credentials.json 2>/dev/null && echo UMOUNTED || echo UMOUNT-REFUSED
mv ~/.claude ~/.claude-moved 2>/dev/null && echo MOVED || echo MV-REFUSED
rm -f ~/.claude/.credentials.json 2>/dev/null && echo REMOVED || echo RM-REFUSED
{greps}touch {ready}
while [ ! -e {go} ]; do sleep 0.1; done
echo END
"#,
        exchange = claude_exchange(url),
        ready = ready.display(),
        go = go.display(),
    )
}

/// What the host sees while the harness waits: the real tokens in no memory of the harness
/// container's processes (with the control that the script's own marker is found), in no
/// container's configuration, and the placeholder file's contents (returned).
fn check_while_running(w: &World) -> String {
    let e = w.engine;
    let containers = w.containers();
    assert!(
        containers.iter().any(|c| c.ends_with("-gateway")),
        "no gateway proxy container among {containers:?}"
    );
    for c in &containers {
        let config = e.ok(&["container", "inspect", c]);
        for m in MARKERS {
            assert!(!config.contains(m), "{m} in the configuration of {c}");
        }
    }
    let harness = containers
        .iter()
        .find(|c| !c.ends_with("-gateway"))
        .expect("the harness container");
    let pid: u32 = e
        .ok(&[
            "container",
            "inspect",
            "--format",
            "{{.State.Pid}}",
            harness,
        ])
        .trim()
        .parse()
        .expect("the harness container's pid");
    let mut pids = vec![pid];
    pids.extend(descendants(pid));
    let (mut found, mut readable) = (Vec::new(), 0);
    for p in &pids {
        for needle in [ACCESS, REFRESH, NEW_ACCESS, NEW_REFRESH] {
            match memory_holds(*p, needle.as_bytes()) {
                Some(true) => found.push((*p, needle)),
                Some(false) => readable += 1,
                None => {}
            }
        }
    }
    assert!(
        found.is_empty(),
        "real tokens in the harness's memory: {found:?}"
    );
    assert!(readable > 0, "no harness process's memory could be read");
    // The control: the script's shell assembled the last marker for its grep.
    assert!(
        pids.iter()
            .any(|p| memory_holds(*p, MARKERS[3].as_bytes()) == Some(true)),
        "the scan did not find the script's own marker in {pids:?}: it proves nothing"
    );
    let placeholder: Vec<PathBuf> = run_files(w)
        .into_iter()
        .filter(|f| f.ends_with("claude.json"))
        .collect();
    assert_eq!(placeholder.len(), 1, "{placeholder:?}");
    std::fs::read_to_string(&placeholder[0]).unwrap()
}

fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} line in:\n{out}"))
}

fn the_harness_holds_placeholders_and_the_host_file_gets_the_refreshed_tokens(e: Engine) {
    if !e.ready(&["openssl"]) {
        return;
    }
    let (w, api, subnet, mock) = mock_world(e, &claude_tokens());
    let file = signed_in(&w);
    let inode = std::fs::metadata(&file).unwrap().ino();
    signin_project(&w, &api, &subnet, "proxy");
    let (ready, go) = (w.project.join("ready"), w.project.join("go"));
    let url = format!("https://{api}:8443");
    let mut child = run_script(&w, &harness_script(&url, &ready, &go))
        // The gateway verifies the mock against the test CA, given as a corporate CA would be.
        .env("SSL_CERT_FILE", mock.join("ca.pem"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut placeholder_file = None;
    for _ in 0..1800 {
        if ready.exists() {
            placeholder_file = Some(check_while_running(&w));
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::fs::write(&go, "").unwrap();
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    let t = format!("exit {status:?}\n--- stdout\n{stdout}--- stderr\n{stderr}");
    let placeholder_file = placeholder_file.unwrap_or_else(|| panic!("never ready:\n{t}"));
    assert_eq!(status.code(), Some(0), "{t}");
    for m in MARKERS {
        assert!(!t.contains(m), "{m} reached the harness's output:\n{t}");
        assert!(!placeholder_file.contains(m), "{m} in the placeholder file");
    }
    assert!(!stdout.contains("-LEAK-"), "{t}");
    for l in ["UMOUNT-REFUSED", "MV-REFUSED", "RM-REFUSED", "END"] {
        assert!(stdout.lines().any(|x| x == l), "{l} missing:\n{t}");
    }
    let ph = line(&stdout, "PH_ACCESS=");
    assert!(
        ph.starts_with("sk-ant-oat01-") && ph.len() == ACCESS.len(),
        "{ph}"
    );
    // The placeholder works for the API and comes back as itself when reflected.
    assert_eq!(line(&stdout, "API1="), "\"api-ok\"", "{t}");
    assert!(line(&stdout, "ECHO=").contains(ph), "{t}");
    let resp: serde_json::Value = serde_json::from_str(line(&stdout, "TOKENRESP=")).unwrap();
    let new_ph = resp["access_token"].as_str().unwrap();
    assert!(
        new_ph.starts_with("sk-ant-oat01-") && new_ph != ph,
        "{resp}"
    );
    assert_eq!(line(&stdout, "RENAME="), "Device or resource busy", "{t}");
    assert_eq!(line(&stdout, "API2="), "\"api-ok\"", "{t}");
    assert!(line(&stdout, "REPLAY=").contains("invalid_grant"), "{t}");
    // The harness's file (the placeholder file on the host) holds the new placeholders.
    let jailed: serde_json::Value = serde_json::from_str(&placeholder_file).unwrap();
    assert_eq!(jailed["claudeAiOauth"]["accessToken"], new_ph);
    assert_eq!(
        jailed["claudeAiOauth"]["refreshToken"],
        resp["refresh_token"]
    );

    // The mock saw real tokens only.
    let seen = std::fs::read_to_string(mock.join("seen.jsonl")).unwrap();
    assert!(
        seen.contains(&format!("Bearer {ACCESS}"))
            && seen.contains(&format!("Bearer {NEW_ACCESS}")),
        "{seen}"
    );
    assert!(
        seen.contains(REFRESH) && !seen.contains(ph) && !seen.contains(new_ph),
        "{seen}"
    );

    // Written back on the host, in place: new real tokens, the rest and the mode kept.
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let o = &v["claudeAiOauth"];
    assert_eq!(o["accessToken"], NEW_ACCESS, "{v}");
    assert_eq!(o["refreshToken"], NEW_REFRESH, "{v}");
    assert_eq!(o["subscriptionType"], "max");
    assert!(o["expiresAt"].as_u64().unwrap() > 1_700_000_000_000);
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(
        meta.ino(),
        inode,
        "the user's file was replaced, not rewritten"
    );
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    // Nothing of the run is left; the audit log names the sign-in, never a token.
    let left = w.containers();
    assert!(left.is_empty(), "containers left: {left:?}");
    let files = run_files(&w);
    assert!(files.is_empty(), "files left: {files:?}");
    let audit = w.audit();
    for m in MARKERS {
        assert!(!audit.contains(m), "{m} in the audit log");
    }
    assert!(
        audit.contains("signin.claude: real refresh token put into POST /v1/oauth/token"),
        "{audit}"
    );
    assert!(audit.contains("written back to"), "{audit}");
}

/// `--network none`: the harness starts signed in (the placeholder file), holds nothing real,
/// and what it writes stays in its copy.
fn without_network_the_harness_gets_the_placeholder_file_only(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "g");
    let file = signed_in(&w);
    let before = std::fs::read(&file).unwrap();
    signin_project(&w, "auth.invalid", "10.255.255.0/24", "none");
    let script = "cat ~/.claude/.credentials.json; echo; \
        echo '{}' > ~/.claude/.credentials.json && echo WROTE; \
        rm -f ~/.claude/.credentials.json 2>/dev/null || echo RM-REFUSED; echo END";
    let out = run_script(&w, script).output().unwrap();
    let t = engine_support::text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    for m in MARKERS {
        assert!(!t.contains(m), "{m}:\n{t}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("sk-ant-ort01-") && stdout.contains("user:inference"),
        "{t}"
    );
    assert!(
        stdout.contains("WROTE") && stdout.contains("RM-REFUSED"),
        "{t}"
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "the user's file changed"
    );
    assert!(run_files(&w).is_empty(), "{:?}", run_files(&w));
}

/// `--network host`: nothing could swap the placeholders, and the real file must not be
/// mounted: refused before anything starts, naming the sign-in.
fn the_host_network_is_refused_for_a_signed_in_harness(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "g");
    signed_in(&w);
    // A project's policy may not ask for the host's network: the user passes it.
    signin_project(&w, "auth.invalid", "10.255.255.0/24", "proxy");
    let started = w.project.join("started");
    let script = format!("touch {}", started.display());
    let args = [
        "run",
        "claude",
        "--engine",
        e.name(),
        "--network",
        "host",
        "--",
    ];
    let out = corral_cmd(&w, &args)
        .args(["/bin/bash", "-c", &script])
        .output()
        .unwrap();
    let t = engine_support::text(&out);
    assert_eq!(out.status.code(), Some(125), "{t}");
    assert!(!started.exists(), "the harness ran:\n{t}");
    assert!(
        t.contains("signin.claude") && t.contains("--network proxy"),
        "{t}"
    );
    assert!(!t.contains(MARKERS[1]), "{t}");
    assert!(w.containers().is_empty(), "{:?}", w.containers());
}

/// A proxy-mode sign-in run whose harness sleeps, started with corral's output to `output()`
/// and waited for until the harness is up (or corral ended).
fn start_sleeping_harness(w: &World, output: fn() -> Stdio) -> (Child, PathBuf) {
    signed_in(w);
    signin_project(w, "auth.invalid", "10.255.255.0/24", "proxy");
    let ready = w.project.join("ready");
    let script = format!("touch {}; exec sleep 300", ready.display());
    let mut child = run_script(w, &script)
        .stdout(output())
        .stderr(output())
        .spawn()
        .unwrap();
    for _ in 0..1200 {
        if ready.exists() || child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    (child, ready)
}

/// SIGTERM to corral: the harness stops; the gateway proxy, its socket and files, and the
/// placeholder files go with it.
fn sigterm_to_corral_removes_the_gateway_and_the_placeholder_files(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "g");
    let (child, ready) = start_sleeping_harness(&w, Stdio::piped);
    assert!(
        ready.exists(),
        "never started: {:?}",
        child.wait_with_output()
    );
    let files = run_files(&w);
    assert!(
        files.iter().any(|f| f.ends_with("claude.json"))
            && files.iter().any(|f| f.ends_with("signin.sock")),
        "control: the run's placeholder file and socket: {files:?}"
    );
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    let left = w.containers();
    assert!(left.is_empty(), "containers left: {left:?}\n{out:?}");
    let files = run_files(&w);
    assert!(files.is_empty(), "files left: {files:?}");
}

/// SIGKILL to corral: nothing can clean up, but the tokens' file for the gateway is already
/// gone; `corral down` removes the containers, the gateway directory and the placeholder files.
fn corral_down_removes_what_a_killed_signin_run_left(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "g");
    let (mut child, ready) = start_sleeping_harness(&w, Stdio::null);
    assert!(ready.exists(), "the harness never started");
    child.kill().unwrap();
    child.wait().unwrap();
    let left = run_files(&w);
    assert!(
        left.iter().any(|f| f.ends_with("claude.json")),
        "control: a killed run leaves its placeholder file: {left:?}"
    );
    assert!(
        !left.iter().any(|f| f.ends_with("secrets.json")),
        "the tokens' file outlived the gateway's start: {left:?}"
    );
    let out = corral_cmd(&w, &["down", "--engine", e.name()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(w.containers().is_empty(), "{:?}", w.containers());
    assert!(run_files(&w).is_empty(), "{:?}", run_files(&w));
}

/// The control: without a sign-in entry for the file, a container that binds `~/.claude` reads
/// the real refresh token (the attack the placeholder stops).
fn control_without_signin_the_container_reads_the_real_refresh_token(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "g");
    let file = signed_in(&w);
    std::fs::write(
        w.project.join("corral.toml"),
        format!("[run]\nimage = \"{IMAGE}\"\n"),
    )
    .unwrap();
    let out = corral_cmd(&w, &["trust"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let dir = file.parent().unwrap().display().to_string();
    let args = [
        "run",
        "--engine",
        e.name(),
        "--network",
        "none",
        "--rw",
        &dir,
        "--",
    ];
    let out = corral_cmd(&w, &args)
        .args([
            "/bin/bash",
            "-c",
            "cat ~/.claude/.credentials.json; echo; echo END",
        ])
        .output()
        .unwrap();
    let t = engine_support::text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(REFRESH),
        "{t}"
    );
}

/// corral on the host killed mid-run (SIGKILL) while the containers go on: nothing could write
/// a refresh's new tokens back, so the gateway refuses the refresh (502, saying why) instead of
/// rotating the user's refresh token upstream and leaving the file with a dead one. The token
/// endpoint is never called and the user's file is untouched.
fn after_corral_is_killed_a_refresh_is_refused_rather_than_lost(e: Engine) {
    if !e.ready(&["openssl"]) {
        return;
    }
    let (w, api, subnet, mock) = mock_world(e, &claude_tokens());
    let file = signed_in(&w);
    let before = std::fs::read(&file).unwrap();
    signin_project(&w, &api, &subnet, "proxy");
    let p = &w.project;
    let (ready, go, result) = (p.join("ready"), p.join("go"), p.join("result"));
    // The harness's output goes to the engine client corral started, which outlives it: the
    // script writes its findings into the project.
    let script = format!(
        r#"R=$(python3 -c 'import json; print(json.load(open("'$HOME'/.claude/.credentials.json"))["claudeAiOauth"]["refreshToken"])')
touch {ready}
while [ ! -e {go} ]; do sleep 0.1; done
curl -sS -o {result}.body -w '%{{http_code}}' -X POST https://{api}:8443/v1/oauth/token -H 'Content-Type: application/json' -d "{{\"grant_type\":\"refresh_token\",\"refresh_token\":\"$R\"}}" > {result}.tmp
mv {result}.tmp {result}
exec sleep 300
"#,
        ready = ready.display(),
        go = go.display(),
        result = result.display(),
    );
    let mut child = run_script(&w, &script)
        .env("SSL_CERT_FILE", mock.join("ca.pem"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..1800 {
        if ready.exists() || child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(ready.exists(), "the harness never started");
    child.kill().unwrap();
    child.wait().unwrap();
    std::fs::write(&go, "").unwrap();
    for _ in 0..600 {
        if result.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let code = std::fs::read_to_string(&result).expect("the harness's refresh result");
    let body = std::fs::read_to_string(p.join("result.body")).unwrap_or_default();
    assert_eq!(code.trim(), "502", "{body}");
    assert!(body.contains("could not be written back"), "{body}");
    let seen = std::fs::read_to_string(mock.join("seen.jsonl")).unwrap_or_default();
    assert!(
        !seen.contains("oauth/token"),
        "the endpoint was called: {seen}"
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        before,
        "the user's file changed"
    );
    let out = corral_cmd(&w, &["down", "--engine", e.name()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(w.containers().is_empty(), "{:?}", w.containers());
    assert!(run_files(&w).is_empty(), "{:?}", run_files(&w));
}

/// Codex's ChatGPT sign-in through the gateway proxy container: `~/.codex/auth.json` with JWT
/// access and id tokens and an opaque refresh token, refreshed form-encoded, the file rewritten
/// in place by the harness; the user's file gets the new tokens (and `last_refresh`) through
/// corral on the host, in place.
fn codex_auth_json_is_served_with_a_form_encoded_refresh_and_written_back(e: Engine) {
    if !e.ready(&["openssl"]) {
        return;
    }
    const HEAD: &str = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9";
    const CLAIMS: &str = "eyJleHAiOjE5MDAwMDAwMDB9";
    let jwt = |sig: &str| format!("{HEAD}.{CLAIMS}.{sig}");
    let access = jwt("CDXACCESSsigCDXACCESSsigCDXACCESSsig0123456789-_abcdef");
    let id = jwt("CDXIDsigCDXIDsigCDXIDsigCDXIDsig0123456789-_abcdefghij");
    let refresh = "rt_CDXREFRESHrealCDXREFRESHreal.0123456789abcdefABCDEF";
    let new_access = jwt("CDXNEWACCESSsigCDXNEWACCESSsig0123456789-_abcdefghijkl");
    let new_refresh = "rt_CDXNEWREFRESHnewCDXNEWREFRESH.0123456789abcdefABCD";
    let markers = [
        "CDXACCESSsig",
        "CDXIDsig",
        "CDXREFRESHreal",
        "CDXNEWACCESSsig",
        "CDXNEWREFRESH",
    ];

    let tokens = serde_json::json!({"access": access, "refresh": refresh, "new_access": new_access,
        "new_refresh": new_refresh, "new_id": id, "token_path": "/oauth/token"});
    let (w, api, subnet, mock) = mock_world(e, &tokens);
    let file = home(&w).join(".codex/auth.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let auth = serde_json::json!({"OPENAI_API_KEY": null, "tokens": {"id_token": id,
        "access_token": access, "refresh_token": refresh, "account_id": "acc-1"},
        "last_refresh": "2026-01-01T00:00:00Z"});
    std::fs::write(&file, serde_json::to_string_pretty(&auth).unwrap()).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let inode = std::fs::metadata(&file).unwrap().ino();
    std::fs::write(
        w.project.join("corral.toml"),
        format!(
            "[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"proxy\"\n\
             allow = [\"{api}:8443\"]\nallow_cidrs = [\"{subnet}\"]\n\n\
             [signin.codex]\nformat = \"codex\"\nfile = \"~/.codex/auth.json\"\n\
             api_hosts = [\"{api}:8443\"]\ntoken_url = \"https://{api}:8443/oauth/token\"\n"
        ),
    )
    .unwrap();
    let out = corral_cmd(&w, &["trust"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let url = format!("https://{api}:8443");
    let greps: String = markers
        .iter()
        .map(|m| {
            let (a, b) = m.split_at(m.len() / 2);
            format!(
                "P={a}; P=${{P}}{b}; \
                 if grep -rqs --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev --exclude-dir=usr \"$P\" /; then echo FILE-LEAK-{a}; fi; \
                 if cat /proc/[0-9]*/environ 2>/dev/null | grep -q \"$P\"; then echo ENV-LEAK-{a}; fi\n"
            )
        })
        .collect();
    // Codex writes auth.json in place.
    let script = format!(
        r#"F=~/.codex/auth.json
get() {{ python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens"][sys.argv[2]])' "$F" "$1"; }}
A=$(get access_token); R=$(get refresh_token)
echo "PH_ACCESS=$A"
echo "API1=$(curl -sS {url}/backend-api/codex -H "Authorization: Bearer $A")"
RESP=$(curl -sS -X POST {url}/oauth/token -H 'Content-Type: application/x-www-form-urlencoded' --data-urlencode grant_type=refresh_token --data-urlencode "refresh_token=$R")
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
    let out = corral_cmd(
        &w,
        &[
            "run",
            "codex",
            "--engine",
            e.name(),
            "--",
            "/bin/bash",
            "-c",
            &script,
        ],
    )
    .env("SSL_CERT_FILE", mock.join("ca.pem"))
    .output()
    .unwrap();
    let t = engine_support::text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    for m in markers {
        assert!(!t.contains(m), "{m} reached the harness:\n{t}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("-LEAK-"), "{t}");
    assert!(
        line(&stdout, "PH_ACCESS=").starts_with(&format!("{HEAD}.{CLAIMS}.")),
        "{t}"
    );
    assert_eq!(line(&stdout, "API1="), "\"api-ok\"", "{t}");
    assert_eq!(line(&stdout, "API2="), "\"api-ok\"", "{t}");
    let seen = std::fs::read_to_string(mock.join("seen.jsonl")).unwrap();
    assert!(seen.contains("CDXREFRESHreal"), "{seen}");

    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(v["tokens"]["access_token"], new_access.as_str(), "{v}");
    assert_eq!(v["tokens"]["refresh_token"], new_refresh, "{v}");
    assert_eq!(v["tokens"]["id_token"], id.as_str(), "{v}");
    assert_eq!(v["tokens"]["account_id"], "acc-1");
    assert_ne!(v["last_refresh"], "2026-01-01T00:00:00Z");
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(
        meta.ino(),
        inode,
        "the user's file was replaced, not rewritten"
    );
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(w.containers().is_empty(), "{:?}", w.containers());
    assert!(run_files(&w).is_empty(), "{:?}", run_files(&w));
}

/// pi's by-provider `~/.pi/agent/auth.json` through the gateway proxy container: an Anthropic
/// OAuth sign-in and an API key the entry names, a key of a provider it does not name. The
/// harness container holds placeholders only; the mock gets the real access token and key,
/// never the unknown key; the refresh lands in the user's file (anthropic's entry only, in
/// place) through corral on the host.
fn pi_auth_json_is_served_by_provider_and_written_back(e: Engine) {
    if !e.ready(&["openssl"]) {
        return;
    }
    const KEY: &str = "sk-proj-PIKEYrealPIKEYrealPIKEYreal0123456789abcdef";
    const UNKNOWN: &str = "gsk_PIUNKNOWNrealPIUNKNOWNreal0123456789abcdef";
    let markers = [
        MARKERS[0],
        MARKERS[1],
        MARKERS[2],
        MARKERS[3],
        "PIKEYrealPIKEY",
        "PIUNKNOWNrealPI",
    ];
    let (w, api, subnet, mock) = mock_world(e, &claude_tokens());
    let file = home(&w).join(".pi/agent/auth.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let auth = serde_json::json!({
        "anthropic": {"type": "oauth", "access": ACCESS, "refresh": REFRESH, "expires": 1},
        "openai": {"type": "api_key", "key": KEY},
        "groq": {"type": "api_key", "key": UNKNOWN}});
    std::fs::write(&file, serde_json::to_string_pretty(&auth).unwrap()).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let inode = std::fs::metadata(&file).unwrap().ino();
    std::fs::write(
        w.project.join("corral.toml"),
        format!(
            "[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"proxy\"\n\
             allow = [\"{api}:8443\"]\nallow_cidrs = [\"{subnet}\"]\n\n\
             [signin.pi]\nformat = \"pi\"\nfile = \"~/.pi/agent/auth.json\"\n\
             [signin.pi.providers.anthropic]\napi_hosts = [\"{api}:8443\"]\n\
             token_url = \"https://{api}:8443/v1/oauth/token\"\n\
             [signin.pi.providers.openai]\napi_hosts = [\"{api}:8443\"]\n"
        ),
    )
    .unwrap();
    let out = corral_cmd(&w, &["trust"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let url = format!("https://{api}:8443");
    let greps: String = markers
        .iter()
        .map(|m| {
            let (a, b) = m.split_at(m.len() / 2);
            format!(
                "P={a}; P=${{P}}{b}; \
                 if grep -rqs --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev --exclude-dir=usr \"$P\" /; then echo FILE-LEAK-{a}; fi; \
                 if cat /proc/[0-9]*/environ 2>/dev/null | grep -q \"$P\"; then echo ENV-LEAK-{a}; fi\n"
            )
        })
        .collect();
    // pi writes auth.json in place.
    let script = format!(
        r#"F=~/.pi/agent/auth.json
get() {{ python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]][sys.argv[3]])' "$F" "$1" "$2"; }}
A=$(get anthropic access); R=$(get anthropic refresh); K=$(get openai key); U=$(get groq key)
echo "API1=$(curl -sS {url}/v1/messages -H "Authorization: Bearer $A")"
echo "KEY=$(curl -sS {url}/echo -H "Authorization: Bearer $K")"
echo "UNKNOWN=$(curl -sS {url}/v1/messages -H "Authorization: Bearer $U")"
RESP=$(curl -sS -X POST {url}/v1/oauth/token -H 'Content-Type: application/json' -d "{{\"grant_type\":\"refresh_token\",\"refresh_token\":\"$R\"}}")
echo "$RESP" | python3 -c '
import json, sys
r = json.load(sys.stdin); f = sys.argv[1]
d = json.load(open(f))
d["anthropic"].update(access=r["access_token"], refresh=r["refresh_token"])
open(f, "w").write(json.dumps(d))
' "$F"
echo "API2=$(curl -sS {url}/v1/messages -H "Authorization: Bearer $(get anthropic access)")"
{greps}echo END
"#
    );
    let out = corral_cmd(
        &w,
        &[
            "run",
            "pi",
            "--engine",
            e.name(),
            "--",
            "/bin/bash",
            "-c",
            &script,
        ],
    )
    .env("SSL_CERT_FILE", mock.join("ca.pem"))
    .output()
    .unwrap();
    let t = engine_support::text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    for m in markers {
        assert!(!t.contains(m), "{m} reached the harness:\n{t}");
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("-LEAK-"), "{t}");
    assert_eq!(line(&stdout, "API1="), "\"api-ok\"", "{t}");
    assert!(line(&stdout, "KEY=").contains("sk-proj-"), "{t}");
    assert_eq!(line(&stdout, "UNKNOWN="), "\"bad-token\"", "{t}");
    assert_eq!(line(&stdout, "API2="), "\"api-ok\"", "{t}");
    let seen = std::fs::read_to_string(mock.join("seen.jsonl")).unwrap();
    for real in [ACCESS, REFRESH, NEW_ACCESS, KEY] {
        assert!(seen.contains(real), "{real} did not reach the mock: {seen}");
    }
    assert!(!seen.contains(UNKNOWN), "{seen}");

    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(v["anthropic"]["access"], NEW_ACCESS, "{v}");
    assert_eq!(v["anthropic"]["refresh"], NEW_REFRESH, "{v}");
    assert_eq!(v["openai"], auth["openai"]);
    assert_eq!(v["groq"], auth["groq"]);
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(
        meta.ino(),
        inode,
        "the user's file was replaced, not rewritten"
    );
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(w.containers().is_empty(), "{:?}", w.containers());
    assert!(run_files(&w).is_empty(), "{:?}", run_files(&w));
}
