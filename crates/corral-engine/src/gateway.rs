//! A run's credential gateway on the container backends (`[secrets]` with `network.mode =
//! "proxy"`).
//!
//! The run gets a proxy container of its own ([`Context::gateway_container`]) running
//! `corral-proxy --secrets FILE --gateway-dir DIR`: FILE holds the real values (written here,
//! 0600, owned by the proxy's user, bound read-only into that container only, and removed as
//! soon as the proxy says it listens); the proxy generates the run CA in its own memory and
//! writes only the CA certificate, the bundle and the jail's side ([`GatewayJail`]:
//! placeholders and CA variables) under DIR. The harness gets those: placeholders in its
//! environment, the trust directory read-only, the bundle over the image's system bundles
//! ([`with_gateway`]). Everything is removed when the run ends ([`GatewayRun`]'s `Drop`).
//!
//! Sign-ins (`[signin]`) ride along: the tokens corral read from the user's file on the host go
//! into the same file; corral serves the user's credential files on a socket in the gateway's
//! directory ([`corral_gateway::signin_remote`]), through which the gateway re-reads the tokens
//! before a refresh and has the new ones written back, in place, by corral on the host. The
//! harness gets each sign-in's placeholder file ([`SigninFiles`]) bound over its credential
//! file wherever the container would see it.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use corral_gateway::signin_remote::FileServer;
use corral_net::standalone::{GATEWAY_JAIL_FILE, GATEWAY_TRUST_DIR, GatewayJail, SecretsFile};
use corral_policy::plan::{Access, Plan};

use crate::argv::{PROXY_FALLBACK_USER, volume};
use crate::{Command, Context, EngineError, EngineKind, Result};

/// This run's gateway files and container; dropping it removes both.
#[derive(Debug)]
pub struct GatewayRun {
    engine: EngineKind,
    container: String,
    dir: PathBuf,
    secrets_file: PathBuf,
    out_dir: PathBuf,
    /// The user's sign-in files served to the gateway (none without sign-ins).
    files: Option<FileServer>,
}

/// What a container run's credentials need on the host: the gateway proxy's real values and
/// sign-in tokens, and each sign-in's placeholder file for the harness (by sign-in name).
#[derive(Debug, Default)]
pub struct Credentials {
    pub gateway: SecretsFile,
    pub signin_files: std::collections::BTreeMap<String, Vec<u8>>,
}

/// This run's placeholder sign-in files ([`Context::signin_dir`]); dropping it removes them.
#[derive(Debug)]
pub struct SigninFiles {
    dir: PathBuf,
}

impl SigninFiles {
    /// Write each of the plan's sign-ins' placeholder file (from `files`, every one needed);
    /// `None` when the plan serves no sign-in.
    pub fn write(plan: &Plan, ctx: &Context, files: &Credentials) -> Result<Option<Self>> {
        if plan.signin.is_empty() {
            return Ok(None);
        }
        let dir = ctx.signin_dir();
        if let Some(parent) = dir.parent() {
            fs::create_dir_all(parent).map_err(io(parent))?;
        }
        // A leftover of the same jail id would be someone else's: refuse rather than reuse.
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io(&dir))?;
        let out = SigninFiles { dir };
        for s in &plan.signin {
            let data = files.signin_files.get(&s.name).ok_or_else(|| {
                EngineError::Gateway(format!("no placeholder file for signin.{}", s.name))
            })?;
            let path = ctx.signin_placeholder(&s.name);
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(io(&path))?;
            f.write_all(data).map_err(io(&path))?;
        }
        Ok(Some(out))
    }
}

impl Drop for SigninFiles {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EngineError + '_ {
    move |source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The uid/gid the proxy container runs as, when it is not the caller's (root runs).
fn proxy_owner(plan: &Plan) -> Option<(u32, u32)> {
    if plan.uid != 0 {
        return None;
    }
    let (u, g) = PROXY_FALLBACK_USER.split_once(':').expect("uid:gid");
    Some((u.parse().expect("uid"), g.parse().expect("gid")))
}

impl GatewayRun {
    /// Write the real values for the run's gateway proxy; `None` when the plan has no gateway.
    /// Every secret of the plan must have its value in `secrets`, and nothing else may.
    pub fn prepare(plan: &Plan, ctx: &Context, secrets: &SecretsFile) -> Result<Option<Self>> {
        if !Context::has_gateway(plan) {
            return Ok(None);
        }
        let mut want: Vec<&str> = plan.secrets.iter().map(|s| s.name.as_str()).collect();
        let mut have: Vec<&str> = secrets
            .secrets
            .iter()
            .map(|s| s.plan.name.as_str())
            .collect();
        want.sort_unstable();
        have.sort_unstable();
        if want != have {
            return Err(EngineError::Gateway(format!(
                "the plan's secrets {want:?} and the values given {have:?} differ"
            )));
        }
        let want: Vec<_> = plan.signin.iter().collect();
        let have: Vec<_> = secrets.signins.iter().map(|s| &s.plan).collect();
        if want != have {
            let names = |v: &[&corral_policy::signin::SigninPlan]| {
                v.iter().map(|s| s.name.clone()).collect::<Vec<_>>()
            };
            return Err(EngineError::Gateway(format!(
                "the plan's sign-ins {:?} and the tokens given {:?} differ",
                names(&want),
                names(&have)
            )));
        }
        let dir = ctx.gateway_dir();
        let out_dir = ctx.gateway_out_dir();
        let trust = out_dir.join(GATEWAY_TRUST_DIR);
        let mut run = GatewayRun {
            engine: ctx.engine,
            container: ctx.gateway_container(plan),
            secrets_file: ctx.secrets_file(),
            out_dir,
            dir,
            files: None,
        };
        if let Some(parent) = run.dir.parent() {
            fs::create_dir_all(parent).map_err(io(parent))?;
        }
        // A leftover of the same jail id would be someone else's: refuse rather than reuse.
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&run.dir)
            .map_err(io(&run.dir))?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&run.out_dir)
            .map_err(io(&run.out_dir))?;
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&trust)
            .map_err(io(&trust))?;
        let json = serde_json::to_vec(secrets).expect("plain data serializes");
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&run.secrets_file)
            .map_err(io(&run.secrets_file))?;
        f.write_all(&json).map_err(io(&run.secrets_file))?;
        if let Some((u, g)) = proxy_owner(plan) {
            std::os::unix::fs::fchown(&f, Some(u), Some(g)).map_err(io(&run.secrets_file))?;
            for d in [&run.dir, &run.out_dir, &trust] {
                std::os::unix::fs::chown(d, Some(u), Some(g)).map_err(io(d))?;
            }
        }
        // 0755 asked, but the umask may have taken bits: the harness's user must read it.
        fs::set_permissions(&trust, fs::Permissions::from_mode(0o755)).map_err(io(&trust))?;
        if !plan.signin.is_empty() {
            run.files = Some(serve_signin_files(plan, ctx)?);
        }
        Ok(Some(run))
    }

    /// Once the gateway proxy listens: the jail's side it wrote, and the real values' file
    /// removed (the proxy holds them in memory now).
    pub fn started(&self) -> Result<GatewayJail> {
        fs::remove_file(&self.secrets_file).map_err(io(&self.secrets_file))?;
        let path = self.out_dir.join(GATEWAY_JAIL_FILE);
        let text = fs::read_to_string(&path).map_err(io(&path))?;
        serde_json::from_str(&text).map_err(|e| {
            EngineError::Gateway(format!(
                "{} (written by the gateway proxy) is not what corral expects: {e}",
                path.display()
            ))
        })
    }
}

/// The user's sign-in files served on [`Context::signin_socket`], which only the gateway proxy
/// (its user, mode 0600) may connect to.
fn serve_signin_files(plan: &Plan, ctx: &Context) -> Result<FileServer> {
    let socket = ctx.signin_socket();
    let server = FileServer::serve(&socket, plan.signin.clone()).map_err(io(&socket))?;
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o600)).map_err(io(&socket))?;
    if let Some((u, g)) = proxy_owner(plan) {
        std::os::unix::fs::chown(&socket, Some(u), Some(g)).map_err(io(&socket))?;
    }
    Ok(server)
}

impl Drop for GatewayRun {
    fn drop(&mut self) {
        let mut rm = std::process::Command::new(self.engine.program());
        rm.args(["rm", "--force"]);
        if self.engine == EngineKind::Podman {
            rm.args(["--time", "5"]);
        }
        let _ = rm
            .arg(&self.container)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        // The gateway is gone: nothing asks for the files any more.
        drop(self.files.take());
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The harness command with the gateway's jail side merged in: each variable passed by name
/// (`--env NAME`, its value in the engine's environment), and the bundle bound read-only over
/// each system bundle path the gateway proxy's image has. Added before `--entrypoint`.
pub fn with_gateway(cmd: &Command, jail: &GatewayJail, ctx: &Context) -> Result<Command> {
    let trust = ctx.gateway_out_dir().join(GATEWAY_TRUST_DIR);
    let mut extra: Vec<String> = Vec::new();
    for (target, file) in &jail.system_overlays {
        if file.is_empty() || file.contains('/') {
            return Err(EngineError::Gateway(format!(
                "the gateway named bundle file {file:?}, not a file of its trust directory"
            )));
        }
        extra.push("--volume".into());
        extra.push(volume(ctx.engine, &trust.join(file), target, Access::Ro)?);
    }
    let mut out = cmd.clone();
    for (name, value) in &jail.env {
        if !out.env.contains_key(name) {
            extra.push("--env".into());
            extra.push(name.clone());
        }
        out.env.insert(name.clone(), value.clone());
    }
    let at = out
        .args
        .iter()
        .position(|a| a == "--entrypoint")
        .ok_or(EngineError::NoCommand)?;
    out.args.splice(at..at, extra);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::os::unix::fs::MetadataExt;

    use corral_net::standalone::SecretValue;
    use corral_policy::domain::DomainPattern;
    use corral_policy::plan::{NetworkMode, SecretPlan};
    use similar_asserts::assert_eq;

    use super::*;
    use crate::argv::{Step, setup};

    fn secret_plan() -> SecretPlan {
        SecretPlan {
            name: "API_TOKEN".into(),
            from_env: "CALLER_TOKEN".into(),
            hosts: vec![DomainPattern::parse("api.example.com").unwrap()],
        }
    }

    fn plan(root: &Path) -> Plan {
        let mut plan = Plan::minimal(root, Path::new("/root"), vec!["/bin/sh".into()]);
        plan.image = Some("img".into());
        plan.network.mode = NetworkMode::Proxy;
        plan.secrets = vec![secret_plan()];
        plan
    }

    fn ctx(state: &Path) -> Context {
        Context {
            engine: EngineKind::Docker,
            rootless: false,
            prefix: "corral".into(),
            corral_bin: PathBuf::from("/opt/c/corral"),
            proxy_bin: Some(PathBuf::from("/opt/c/corral-proxy")),
            state_dir: state.to_path_buf(),
            audit_dir: PathBuf::from("/s/log"),
            jail_id: "j1".into(),
            stdio: crate::argv::Stdio::Piped,
            proxy_image: None,
            limits_enforceable: true,
            skill_source: None,
            upstream_ca: Some(PathBuf::from("/etc/corp-ca.pem")),
            signin_real: Default::default(),
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_run_with_secrets_gets_its_own_gateway_proxy() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = plan(dir.path());
        // The harness's argv compared below without the name gate's arguments (which list
        // every bind, the trust directory's too: argv/tests.rs).
        p.git.new_repositories = true;
        let c = ctx(Path::new("/s/engine"));
        let n = c.names(&p);
        let key = &n.key;
        let s = setup(&p, &c).unwrap();
        let gw = format!("corral-{key}-j1-gateway");
        let Step::Ensure {
            what,
            check,
            create,
        } = &s.steps[2]
        else {
            panic!("{:?}", s.steps[2]);
        };
        assert_eq!(
            what,
            &format!("gateway proxy container {gw} (this run's [secrets] and sign-ins only)")
        );
        assert_eq!(
            check.argv(),
            strings(&[
                "docker",
                "container",
                "inspect",
                "--format",
                "{{.Name}}",
                &gw
            ])
        );
        let expected = strings(&[
            "docker",
            "run",
            "--detach",
            "--name",
            &gw,
            "--label",
            &format!("corral.project={key}"),
            "--label",
            "corral.role=gateway",
            "--label",
            "corral.jail=j1",
            "--pull",
            "never",
            "--init",
            "--read-only",
            "--tmpfs",
            "/tmp:rw,nosuid,nodev,mode=1777",
            "--tmpfs",
            "/var/tmp:rw,nosuid,nodev,mode=1777",
            "--tmpfs",
            "/run:rw,nosuid,nodev,mode=0755",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--security-opt",
            "seccomp=/s/engine/seccomp.json",
            "--user",
            "65534:65534",
            "--cpus",
            "1",
            "--memory",
            "512m",
            "--pids-limit",
            "64",
            "--stop-timeout",
            "5",
            "--network",
            &n.internal_network,
            "--network-alias",
            "proxy-j1",
            "--volume",
            "/opt/c/corral-proxy:/usr/local/bin/corral-proxy:ro",
            "--volume",
            "/s/engine/proxy:/etc/corral:ro",
            "--volume",
            "/s/log:/var/log/corral:rw",
            "--volume",
            "/s/engine/gateway/j1/secrets.json:/run/corral-secrets.json:ro",
            "--volume",
            "/s/engine/gateway/j1/out:/run/corral-gateway:rw",
            "--volume",
            "/etc/corp-ca.pem:/run/corral-upstream-ca.pem:ro",
            "--env",
            "SSL_CERT_FILE",
            "--entrypoint",
            "/usr/local/bin/corral-proxy",
            "img",
            "--listen",
            "0.0.0.0:3128",
            "--policy",
            "/etc/corral/policy.toml",
            "--audit-log",
            "/var/log/corral/audit.jsonl",
            "--jail",
            "j1",
            "--secrets",
            "/run/corral-secrets.json",
            "--gateway-dir",
            "/run/corral-gateway",
        ]);
        assert_eq!(create[0].argv(), expected);
        assert_eq!(
            create[0].env,
            BTreeMap::from([(
                "SSL_CERT_FILE".to_string(),
                "/run/corral-upstream-ca.pem".to_string()
            )])
        );
        assert_eq!(
            create[1].argv(),
            strings(&["docker", "network", "connect", &n.external_network, &gw])
        );

        // The harness: the plan's argv without secrets, with the proxy variables naming the
        // run's gateway proxy and the trust directory bound read-only (nothing else differs).
        let mut plain = p.clone();
        plain.secrets.clear();
        let plain = setup(&plain, &c).unwrap();
        let plain = plain.run_command().unwrap();
        let run = s.run_command().unwrap();
        let mut want = plain.argv();
        let at = want.iter().position(|a| a == "--env").unwrap();
        want.splice(
            at..at,
            strings(&[
                "--volume",
                "/s/engine/gateway/j1/out/trust:/run/corral-gateway/trust:ro",
            ]),
        );
        assert_eq!(run.argv(), want);
        let mut want_env = plain.env.clone();
        for (k, v) in want_env.iter_mut() {
            if v == "http://proxy:3128" {
                *v = "http://proxy-j1:3128".into();
            }
            assert!(!k.contains("API_TOKEN"));
        }
        assert_eq!(run.env, want_env);
        // `corral plan` says what is added at run time.
        assert!(
            crate::argv::commands(&s)
                .contains("# and, once this run's gateway proxy has started, what it wrote:")
        );
    }

    #[test]
    fn the_gateway_side_is_added_by_name_before_the_entrypoint() {
        let c = ctx(Path::new("/s/engine"));
        let mut cmd =
            Command::new("docker").args(["run", "--env", "TERM", "--entrypoint", "sh", "img"]);
        cmd.env.insert("TERM".into(), "xterm".into());
        let jail = GatewayJail {
            env: BTreeMap::from([
                ("API_TOKEN".to_string(), "sk-placeholder".to_string()),
                (
                    "SSL_CERT_FILE".to_string(),
                    "/run/corral-gateway/trust/ca-bundle.pem".to_string(),
                ),
            ]),
            system_overlays: vec![(
                PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
                "ca-bundle.pem".to_string(),
            )],
        };
        let out = with_gateway(&cmd, &jail, &c).unwrap();
        assert_eq!(
            out.argv(),
            strings(&[
                "docker",
                "run",
                "--env",
                "TERM",
                "--volume",
                "/s/engine/gateway/j1/out/trust/ca-bundle.pem:/etc/ssl/certs/ca-certificates.crt:ro",
                "--env",
                "API_TOKEN",
                "--env",
                "SSL_CERT_FILE",
                "--entrypoint",
                "sh",
                "img",
            ])
        );
        assert_eq!(
            out.env,
            BTreeMap::from([
                ("API_TOKEN".to_string(), "sk-placeholder".to_string()),
                (
                    "SSL_CERT_FILE".to_string(),
                    "/run/corral-gateway/trust/ca-bundle.pem".to_string()
                ),
                ("TERM".to_string(), "xterm".to_string()),
            ])
        );
        // A bundle name that would climb out of the trust directory is refused.
        let mut bad = jail.clone();
        bad.system_overlays[0].1 = "../../../../etc/shadow".into();
        assert!(matches!(
            with_gateway(&cmd, &bad, &c),
            Err(EngineError::Gateway(_))
        ));
    }

    #[test]
    fn the_values_file_is_private_and_goes_with_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = plan(dir.path());
        p.uid = nix_uid();
        p.gid = p.uid;
        let state = dir.path().join("state");
        let c = ctx(&state);
        let values = SecretsFile {
            secrets: vec![SecretValue {
                plan: secret_plan(),
                value: "real-value-123".into(),
            }],
            signins: vec![],
        };
        // A value for a secret the plan does not have (or a missing one) is refused.
        let wrong = SecretsFile::default();
        assert!(matches!(
            GatewayRun::prepare(&p, &c, &wrong),
            Err(EngineError::Gateway(_))
        ));
        let run = GatewayRun::prepare(&p, &c, &values).unwrap().unwrap();
        let file = c.secrets_file();
        let meta = fs::metadata(&file).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(fs::metadata(c.gateway_dir()).unwrap().mode() & 0o777, 0o700);
        assert_eq!(
            fs::metadata(c.gateway_out_dir()).unwrap().mode() & 0o777,
            0o700
        );
        let back: SecretsFile = serde_json::from_str(&fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(back, values);
        if p.uid == 0 {
            assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
        }
        // A second run with the same id does not reuse (or overwrite) the files.
        assert!(GatewayRun::prepare(&p, &c, &values).is_err());
        drop(run);
        assert!(!c.gateway_dir().exists());
    }

    fn nix_uid() -> u32 {
        fs::metadata("/proc/self").unwrap().uid()
    }
}
