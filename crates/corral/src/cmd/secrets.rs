//! `[secrets]` for `corral run`: the jail gets placeholders and the gateway's CA certificate, the
//! real values are read from corral's own environment and stay in this process (the gateway in
//! the proxy puts them into requests to the hosts each secret names).

use anyhow::{Context, bail};
use corral_audit::AuditLog;
use corral_gateway::{AuditSink, Gateway, GatewayConfig};
use corral_policy::plan::{NetworkMode, Plan};

/// What a run needs for its secrets; keep it alive until the jail has exited (it owns the
/// directory with the jail's CA files).
pub struct Secrets {
    plan: Option<Plan>,
    gateway: Option<Gateway>,
    _trust_dir: Option<TrustDir>,
}

impl Secrets {
    /// The plan to run: `base` with the placeholders and CA files added, or `base` itself.
    pub fn plan<'a>(&'a self, base: &'a Plan) -> &'a Plan {
        self.plan.as_ref().unwrap_or(base)
    }

    /// The gateway the proxy must use, when the jail's network goes through the proxy.
    pub fn gateway(&self) -> Option<Gateway> {
        self.gateway.clone()
    }
}

/// A private directory (mode 0700) for the jail's CA files, removed when the run ends.
struct TrustDir(std::path::PathBuf);

impl TrustDir {
    fn create(jail_id: &str) -> anyhow::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let path =
            std::env::temp_dir().join(format!("corral-trust-{jail_id}-{}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| {
                format!(
                    "cannot create {} for the jail's CA files (set TMPDIR to a writable directory)",
                    path.display()
                )
            })?;
        Ok(Self(path))
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TrustDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Read each secret's real value from corral's environment and prepare the jail's side.
/// Sign-in credential files (`[signin]`, [`super::signin`]) the same way: the jail gets a file of
/// placeholders, the gateway keeps the real tokens.
pub fn prepare(plan: &Plan, jail_id: &str, audit: &AuditLog) -> anyhow::Result<Secrets> {
    let signins = super::signin::load(plan)?;
    if plan.secrets.is_empty() && signins.is_empty() {
        return Ok(Secrets {
            plan: None,
            gateway: None,
            _trust_dir: None,
        });
    }
    let mut values = Vec::new();
    for s in &plan.secrets {
        let Some(real) = std::env::var_os(&s.from_env) else {
            bail!(
                "secret {}: ${} is not set in corral's environment; export it before `corral run`, or remove secrets.{} from the policy",
                s.name,
                s.from_env,
                s.name
            );
        };
        let real = real.into_string().map_err(|_| {
            anyhow::anyhow!("secret {}: ${} is not valid UTF-8", s.name, s.from_env)
        })?;
        values.push((s.clone(), real));
    }
    let mut jailed = plan.clone();
    match plan.network.mode {
        NetworkMode::Host => bail!(
            "[secrets] and sign-ins ({}) need network.mode = \"proxy\": with the host's network the gateway cannot put the real value into requests, and the jail's placeholder would be useless; use --network proxy",
            plan.secrets
                .iter()
                .map(|s| s.name.clone())
                .chain(signins.iter().map(|s| format!("signin.{}", s.plan().name)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        NetworkMode::None => {
            // No network: nothing could use the real value; the jail still gets a placeholder
            // so harnesses that check for the variable start.
            for (s, real) in &values {
                jailed
                    .env
                    .insert(s.name.clone(), corral_gateway::placeholder_for(real)?);
            }
            let dir = if signins.is_empty() {
                None
            } else {
                let dir = TrustDir::create(jail_id)?;
                jailed
                    .mounts
                    .extend(super::signin::jail_files(&signins, dir.path())?);
                Some(dir)
            };
            Ok(Secrets {
                plan: Some(jailed),
                gateway: None,
                _trust_dir: dir,
            })
        }
        NetworkMode::Proxy => {
            let dir = TrustDir::create(jail_id)?;
            let signin_mounts = super::signin::jail_files(&signins, dir.path())?;
            let (gateway, trust) = Gateway::with_signin(
                values,
                signins,
                GatewayConfig {
                    // The system store; SSL_CERT_FILE / SSL_CERT_DIR in corral's environment
                    // (a corporate CA) are honoured.
                    upstream_roots: None,
                    trust_dir: dir.path().to_path_buf(),
                    system_bundle: None,
                    audit: Some(AuditSink {
                        log: audit.clone(),
                        jail: jail_id.to_string(),
                    }),
                },
            )?;
            jailed.env.extend(trust.env);
            jailed.mounts.extend(trust.mounts);
            // The system bundles themselves (system roots + run CA), for programs that read
            // only /etc/ssl and ignore every CA variable.
            jailed.mounts.extend(trust.system_overlays);
            // After the state directories: each sign-in file over the real one.
            jailed.mounts.extend(signin_mounts);
            Ok(Secrets {
                plan: Some(jailed),
                gateway: Some(gateway),
                _trust_dir: Some(dir),
            })
        }
    }
}
