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
pub fn prepare(plan: &Plan, jail_id: &str, audit: &AuditLog) -> anyhow::Result<Secrets> {
    if plan.secrets.is_empty() {
        return Ok(Secrets {
            plan: None,
            gateway: None,
            _trust_dir: None,
        });
    }
    let values = real_values(plan)?;
    let mut jailed = plan.clone();
    match plan.network.mode {
        NetworkMode::Host => bail!(
            "[secrets] ({}) need network.mode = \"proxy\": with the host's network the gateway cannot put the real value into requests, and the jail's placeholder would be useless; use --network proxy",
            plan.secrets
                .iter()
                .map(|s| s.name.as_str())
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
            Ok(Secrets {
                plan: Some(jailed),
                gateway: None,
                _trust_dir: None,
            })
        }
        NetworkMode::Proxy => {
            let dir = TrustDir::create(jail_id)?;
            let (gateway, trust) = Gateway::new(
                values,
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
            Ok(Secrets {
                plan: Some(jailed),
                gateway: Some(gateway),
                _trust_dir: Some(dir),
            })
        }
    }
}

/// `[secrets]` for the container backends: with `network.mode = "proxy"` the real values for
/// the run's gateway proxy container (corral_engine::gateway); with no network a plan whose
/// environment holds placeholders only (nothing could use the real value). Host mode is
/// refused by the engine's setup, as by the native run.
pub fn for_engine(
    plan: &Plan,
) -> anyhow::Result<(Option<Plan>, corral_net::standalone::SecretsFile)> {
    let mut file = corral_net::standalone::SecretsFile { secrets: vec![] };
    if plan.secrets.is_empty() || plan.network.mode == NetworkMode::Host {
        return Ok((None, file));
    }
    let values = real_values(plan)?;
    if plan.network.mode == NetworkMode::None {
        let mut jailed = plan.clone();
        for (s, real) in &values {
            jailed
                .env
                .insert(s.name.clone(), corral_gateway::placeholder_for(real)?);
        }
        return Ok((Some(jailed), file));
    }
    file.secrets = values
        .into_iter()
        .map(|(plan, value)| corral_net::standalone::SecretValue { plan, value })
        .collect();
    Ok((None, file))
}

/// Each secret of the plan with its real value, read from corral's environment.
fn real_values(plan: &Plan) -> anyhow::Result<Vec<(corral_policy::plan::SecretPlan, String)>> {
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
    Ok(values)
}
