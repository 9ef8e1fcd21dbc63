//! A running container follows its policy files, as a native jail does (live.rs
//! and corral-run/src/engine.rs): `corral allow`/`deny` on the host reach the harness container
//! without a restart, an edit of `corral.toml` the user has not trusted changes nothing and is
//! recorded as refused (the control: trusting the same content applies it), the run registers
//! for `corral watch` and refuses a run-only allow (its proxy container is shared by the
//! project's runs). Every test runs once per engine (`podman::NAME`, `docker::NAME`).
//!
//! The harness's script and the test take turns through files in the project: the test waits
//! for the audit record of a change before letting the script try again; where the proxy
//! container applies a change after the record (it reloads its policy file), the script polls
//! for the new answer with a generous deadline. Nothing depends on timing.
//!
//! Needs root and the image `localhost/corral-ci-harness:latest` in each engine (see
//! engine_support). Origins are containers on the test's own network; every object carries a
//! per-test prefix and is removed at the end.

mod engine_support;
mod jail_support;
mod watch_support;

use watch_support::Watch;

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::fs::DirBuilderExt as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use engine_support::{Engine, IMAGE, World, on_every_engine, text};

on_every_engine!(
    allow_deny_and_an_untrusted_edit_reach_a_running_container_as_on_the_native_backend,
    allow_deny_and_an_untrusted_edit_reach_a_run_behind_its_own_gateway_proxy,
    a_container_run_registers_for_corral_watch_and_refuses_run_only_allows,
    corral_watch_shows_a_container_runs_denial_and_its_keys_work_through_the_files,
);

/// How long the test waits for anything asynchronous (a record, a file, the proxy's reload).
const DEADLINE: Duration = Duration::from_secs(120);

/// An HTTP origin on `network`, answering `body` on port 8000; returns once it answers.
fn start_origin(e: Engine, name: &str, network: &str, body: &str) {
    e.ok(&[
        "run",
        "--detach",
        "--name",
        name,
        "--network",
        network,
        "--pull",
        "never",
        IMAGE,
        "bash",
        "-c",
        &format!(
            "mkdir -p /tmp/w && echo {body} > /tmp/w/index.html && cd /tmp/w && exec python3 -m http.server 8000"
        ),
    ]);
    let start = Instant::now();
    while !e
        .cli(&[
            "exec",
            name,
            "curl",
            "-sf",
            "-o",
            "/dev/null",
            "http://127.0.0.1:8000/",
        ])
        .status
        .success()
    {
        assert!(
            start.elapsed() < DEADLINE,
            "the origin {name} never answered"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `[secrets]` that give a run its own gateway proxy container (the value comes from
/// `$CALLER_TOKEN`).
const SECRETS: &str =
    "\n[secrets]\nAPI_TOKEN = { from_env = \"CALLER_TOKEN\", hosts = [\"api.example.com\"] }\n";

/// A project whose policy allows nothing yet but may reach the origins' private subnet once a
/// host is allowed, plus `extra`, trusted by the user; the origin's name.
fn setup(w: &World, tag: &str, extra: &str) -> String {
    let e = w.engine;
    let external = format!("{}-external", w.prefix);
    e.ok(&["network", "create", &external]);
    let subnet = e.subnet(&external);
    let origin = format!("{}-{tag}", w.prefix);
    start_origin(e, &origin, &external, "origin-body");
    std::fs::write(
        w.project.join("corral.toml"),
        policy(&subnet, "", "") + extra,
    )
    .unwrap();
    let out = w.corral(&["trust"]);
    assert!(out.status.success(), "{}", text(&out));
    origin
}

fn policy(subnet: &str, allow: &str, deny: &str) -> String {
    format!(
        "[run]\nimage = \"{IMAGE}\"\n\n[network]\nmode = \"proxy\"\nallow = [{allow}]\n\
         deny = [{deny}]\nallow_cidrs = [\"{subnet}\"]\n"
    )
}

/// The harness's script: `step N "TEXT"` writes the file `stepN` (atomically), `wait_go N`
/// waits for the test's file `goN`; `try` is the origin's HTTP status through the proxy and
/// `until W` polls it until it is W (or the deadline passed: the last status is the answer).
fn prelude(origin: &str) -> String {
    format!(
        r#"set -u
try() {{ curl -s -o /dev/null -m 10 -w '%{{http_code}}' http://{origin}:8000/; }}
until_is() {{ s=$(try); n=0; while [ "$s" != "$1" ] && [ $n -lt 500 ]; do sleep 0.2; s=$(try); n=$((n+1)); done; echo "$s"; }}
step() {{ echo "$2" > .step$1.tmp && mv .step$1.tmp step$1; }}
wait_go() {{ n=0; while [ ! -e go$1 ] && [ $n -lt 6000 ]; do sleep 0.1; n=$((n+1)); done; }}
"#
    )
}

/// `corral run --engine E -- bash -c SCRIPT` in the background, with the control directory in
/// the test's own runtime directory.
fn start_run(w: &World, script: &str, runtime: &Path) -> std::process::Child {
    w.command(&[
        "run",
        "--engine",
        w.engine.name(),
        "--",
        "/bin/bash",
        "-c",
        script,
    ])
    .env("XDG_RUNTIME_DIR", runtime)
    .env("CALLER_TOKEN", "real-token-value")
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("corral runs")
}

fn runtime_dir(w: &World) -> PathBuf {
    let dir = w.dir.path().join("runtime");
    std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    dir
}

fn wait_file(path: &Path, child: &mut std::process::Child) -> String {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return s.trim().to_string();
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the run ended ({status}) before {} was written",
                path.display()
            );
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{} never written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn go(w: &World, n: u32) {
    std::fs::write(w.project.join(format!("go{n}")), "").unwrap();
}

fn records(w: &World) -> Vec<serde_json::Value> {
    w.audit()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn summary(r: &serde_json::Value) -> String {
    r["detail"]["summary"].as_str().unwrap_or("").to_string()
}

/// The first jail record `event` of the run `jail` that `pred` accepts, waited for.
fn wait_record(
    w: &World,
    jail: &str,
    event: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        if let Some(r) = records(w)
            .into_iter()
            .find(|r| r["kind"] == "jail" && r["jail"] == jail && r["event"] == event && pred(r))
        {
            return r;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no {event} record of {jail}:\n{}",
            w.audit()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The id of the project's one running corral run (its `start` record).
fn run_jail(w: &World) -> String {
    let start = Instant::now();
    loop {
        if let Some(r) = records(w)
            .into_iter()
            .find(|r| r["kind"] == "jail" && r["event"] == "start")
        {
            return r["jail"].as_str().unwrap().to_string();
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no start record:\n{}",
            w.audit()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The proxy containers' generated policy file on the host.
fn proxy_policy(w: &World) -> String {
    let path = w
        .state
        .join("corral")
        .join("engine")
        .join(w.key())
        .join("proxy")
        .join("policy.toml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn finish(child: std::process::Child) -> (i32, String) {
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), text(&out))
}

fn allow_deny_and_an_untrusted_edit_reach_a_running_container_as_on_the_native_backend(e: Engine) {
    live_edits(e, "l", "");
}

/// The same through the run's own gateway proxy container (`[secrets]`), which reads the
/// project's policy file too.
fn allow_deny_and_an_untrusted_edit_reach_a_run_behind_its_own_gateway_proxy(e: Engine) {
    live_edits(e, "g", SECRETS);
}

/// Allow, deny, an untrusted edit (refused) and the same edit trusted (applied), each seen from
/// the running harness; `extra` is added to every version of corral.toml.
fn live_edits(e: Engine, tag: &str, extra: &str) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, tag);
    let origin = setup(&w, "origin", extra);
    let subnet = e.subnet(&format!("{}-external", w.prefix));
    let target = format!("{origin}:8000");
    let script = format!(
        "{}step 1 \"$(try)\"\nwait_go 1\nstep 2 \"$(until_is 200)\"\nwait_go 2\n\
         step 3 \"$(until_is 403)\"\nwait_go 3\n\
         step 4 \"$(try) $(echo x >> corral.toml 2>/dev/null && echo WROTE || echo read-only)\"\n\
         wait_go 4\nstep 5 \"$(until_is 200)\"\n",
        prelude(&origin)
    );
    let runtime = runtime_dir(&w);
    let mut child = start_run(&w, &script, &runtime);
    let p = &w.project;
    assert_eq!(
        wait_file(&p.join("step1"), &mut child),
        "403",
        "denied at first"
    );
    let jail = run_jail(&w);

    // `corral allow` on the host: the running container reaches the origin.
    let out = w.corral(&["allow", &target]);
    assert!(out.status.success(), "{}", text(&out));
    let r = wait_record(&w, &jail, "live-policy", |r| {
        summary(r).contains(&format!("network.allow +{target}"))
    });
    assert!(proxy_policy(&w).contains(&format!("\"{target}\"")), "{r}");
    go(&w, 1);
    assert_eq!(
        wait_file(&p.join("step2"), &mut child),
        "200",
        "allowed live"
    );

    // `corral deny`: unreachable again.
    let out = w.corral(&["deny", &target]);
    assert!(out.status.success(), "{}", text(&out));
    wait_record(&w, &jail, "live-policy", |r| {
        summary(r).contains(&format!("network.deny +{target}"))
    });
    go(&w, 2);
    assert_eq!(
        wait_file(&p.join("step3"), &mut child),
        "403",
        "denied live"
    );

    // The attack: corral.toml rewritten as the jail (or a tool the user has not reviewed) would,
    // granting the origin, without the user's trust. Nothing changes, and it is recorded.
    let generated = proxy_policy(&w);
    std::fs::write(
        p.join("corral.toml"),
        policy(&subnet, &format!("\"{target}\""), "") + extra,
    )
    .unwrap();
    let r = wait_record(&w, &jail, "live-policy-refused", |_| true);
    assert!(summary(&r).contains("corral trust"), "{r}");
    assert_eq!(
        proxy_policy(&w),
        generated,
        "the refused edit reached the proxy"
    );
    go(&w, 3);
    assert_eq!(
        wait_file(&p.join("step4"), &mut child),
        "403 read-only",
        "an untrusted edit widened the running container (or it wrote its policy file)"
    );

    // The control: once the user trusts exactly this content, the same edit applies.
    let out = w.corral(&["trust"]);
    assert!(out.status.success(), "{}", text(&out));
    wait_record(&w, &jail, "live-policy", |r| {
        let s = summary(r);
        s.contains(&format!("network.allow +{target}")) && s.contains("network.deny -")
    });
    go(&w, 4);
    assert_eq!(
        wait_file(&p.join("step5"), &mut child),
        "200",
        "trusted edit"
    );
    let (code, t) = finish(child);
    assert_eq!(code, 0, "{t}");

    // The proxy container reloaded its policy (its own records), and `corral log` shows the
    // run's changes.
    let all = records(&w);
    if !extra.is_empty() {
        // The run's own gateway proxy decided (it records under the run's id).
        assert!(
            all.iter().any(|r| r["kind"] == "net"
                && r["jail"] == jail.as_str()
                && r["host"] == origin.as_str()
                && r["decision"] == "allow"),
            "no allow by the run's gateway proxy:\n{}",
            w.audit()
        );
    }
    assert!(
        all.iter()
            .any(|r| r["kind"] == "jail" && r["event"] == "policy-reload"),
        "{}",
        w.audit()
    );
    let log = w.corral(&["log"]);
    let log_text = String::from_utf8_lossy(&log.stdout);
    assert!(
        log_text.lines().any(|l| l.contains("live-policy-refused")),
        "{log_text}"
    );
    assert!(
        log_text
            .lines()
            .any(|l| l.contains("live-policy") && l.contains(&format!("network.allow +{target}"))),
        "{log_text}"
    );
    assert!(e.rm_force(&[&origin]).status.success());
}

/// One request line to a control socket; its answer.
fn control(socket: &Path, line: &str) -> String {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer).unwrap();
    answer.trim_end().to_string()
}

fn a_container_run_registers_for_corral_watch_and_refuses_run_only_allows(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "w");
    let origin = setup(&w, "origin", "");
    let target = format!("{origin}:8000");
    let script = format!(
        "{}step 1 \"$(try)\"\nwait_go 1\nstep 2 \"$(try)\"\n",
        prelude(&origin)
    );
    let runtime = runtime_dir(&w);
    let mut child = start_run(&w, &script, &runtime);
    assert_eq!(wait_file(&w.project.join("step1"), &mut child), "403");
    let jail = run_jail(&w);

    // The registration `corral watch` lists: the run, its project and its engine.
    let info = runtime.join("corral-jails").join(format!("{jail}.json"));
    let entry: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&info).unwrap_or_else(|e| {
            panic!("{}: {e}", info.display());
        }))
        .unwrap();
    assert_eq!(entry["engine"], e.name(), "{entry}");
    assert_eq!(
        Path::new(entry["project"].as_str().unwrap()),
        std::fs::canonicalize(&w.project).unwrap()
    );
    let socket = PathBuf::from(entry["socket"].as_str().unwrap());

    // `corral watch`'s `a`: refused, since the shared proxy would allow it for every run.
    let answer = control(&socket, &format!("allow {target}"));
    assert!(
        answer.starts_with("error ") && answer.contains("not available"),
        "{answer}"
    );
    assert!(!proxy_policy(&w).contains(&target), "{}", proxy_policy(&w));
    // `reload` answers (what `corral watch` sends after `p` or `d`).
    let answer = control(&socket, "reload");
    assert!(answer.starts_with("ok "), "{answer}");
    // A rule by method and path, which a container's proxy cannot decide: not applied (as a
    // container run refuses one at its start), recorded, and the origin stays denied.
    let out = w.corral(&["allow", &format!("GET {target}/index.html")]);
    assert!(out.status.success(), "{}", text(&out));
    let r = wait_record(&w, &jail, "live-policy-failed", |_| true);
    assert!(summary(&r).contains("method and path"), "{r}");
    assert!(!proxy_policy(&w).contains(&origin), "{}", proxy_policy(&w));
    go(&w, 1);
    assert_eq!(
        wait_file(&w.project.join("step2"), &mut child),
        "403",
        "a refused run-only allow widened the run"
    );
    let (code, t) = finish(child);
    assert_eq!(code, 0, "{t}");
    // Unregistered when the run ends.
    assert!(!info.exists() && !socket.exists());
    assert!(e.rm_force(&[&origin]).status.success());
}

fn corral_watch_shows_a_container_runs_denial_and_its_keys_work_through_the_files(e: Engine) {
    if !e.ready(&[]) {
        return;
    }
    let w = World::new(e, "t");
    let origin = setup(&w, "origin", "");
    let script = format!(
        "{}step 1 \"$(try)\"\nwait_go 1\nstep 2 \"$(until_is 200)\"\nwait_go 2\n\
         step 3 \"$(until_is 403)\"\n",
        prelude(&origin)
    );
    let runtime = runtime_dir(&w);
    let mut child = start_run(&w, &script, &runtime);
    assert_eq!(wait_file(&w.project.join("step1"), &mut child), "403");
    let jail = run_jail(&w);
    let policy_file = w.project.join("corral.toml");
    let before = std::fs::read_to_string(&policy_file).unwrap();

    // The run is listed with its engine, and the proxy container's denial is shown with the
    // rule that denied it.
    let mut watch = Watch::start({
        let mut c = w.command(&["watch"]);
        c.env("XDG_RUNTIME_DIR", &runtime);
        c
    });
    watch.wait_for(0, &jail);
    watch.wait_for(0, &format!("({}", e.name()));
    watch.wait_for(0, &origin);
    watch.wait_for(0, "network.allow");

    // `a`: refused, nothing written anywhere.
    let at = watch.len();
    watch.key("a");
    watch.wait_for(at, "shared):");
    assert_eq!(std::fs::read_to_string(&policy_file).unwrap(), before);
    assert!(!proxy_policy(&w).contains(&origin), "{}", proxy_policy(&w));

    // `p`: into corral.toml, applied by the running container.
    watch.key("p");
    wait_record(&w, &jail, "live-policy", |r| {
        summary(r).contains(&format!("network.allow +{origin}"))
    });
    assert!(
        std::fs::read_to_string(&policy_file)
            .unwrap()
            .contains(&origin)
    );
    go(&w, 1);
    assert_eq!(wait_file(&w.project.join("step2"), &mut child), "200");

    // `d` on the same denial: into corral.toml's deny list, cut again.
    watch.key("d");
    wait_record(&w, &jail, "live-policy", |r| {
        summary(r).contains(&format!("network.deny +{origin}"))
    });
    go(&w, 2);
    assert_eq!(wait_file(&w.project.join("step3"), &mut child), "403");
    let (code, t) = finish(child);
    assert_eq!(code, 0, "{t}");
    assert!(watch.quit().success());
    assert!(e.rm_force(&[&origin]).status.success());
}
