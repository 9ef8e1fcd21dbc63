//! `[secrets]` for `corral run`: the jail gets placeholders and the gateway's CA certificate, the
//! real values are read from corral's own environment and stay in this process (the gateway in
//! the proxy puts them into requests to the hosts each secret names).

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use corral_audit::AuditLog;
use corral_gateway::signin::Signin;
use corral_gateway::{AuditSink, Gateway, GatewayConfig};
use corral_policy::plan::{NetworkMode, Plan, SecretPlan};
use corral_session::RunPlan;

/// What a run needs for its secrets; keep it alive until the jail has exited (it owns the
/// directory with the jail's CA files).
pub struct Secrets {
    gateway: Option<Gateway>,
    _trust_dir: Option<TrustDir>,
}

impl Secrets {
    /// The gateway the proxy must use, when the jail's network goes through the proxy.
    pub fn gateway(&self) -> Option<Gateway> {
        self.gateway.clone()
    }
}

/// A private directory (mode 0700) for the jail's CA files, removed when the run ends.
struct TrustDir(std::path::PathBuf);

impl TrustDir {
    fn create(path: &std::path::Path) -> anyhow::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(path)
            .with_context(|| {
                format!(
                    "cannot create {} for the jail's CA files (set TMPDIR to a writable directory)",
                    path.display()
                )
            })?;
        Ok(Self(path.to_path_buf()))
    }
}

impl Drop for TrustDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Each secret with its real value.
pub type Values = Vec<(SecretPlan, String)>;

/// Each secret of `plan` with its real value, read from corral's environment, and the sign-ins
/// (`[signin]`, [`crate::signin`]) whose credential file exists, read from it.
pub fn read(plan: &Plan) -> anyhow::Result<(Values, Vec<Signin>)> {
    let signins = crate::signin::load(plan)?;
    if plan.secrets.is_empty() && signins.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    if plan.network.mode == NetworkMode::Host {
        bail!(
            "[secrets] and sign-ins ({}) need network.mode = \"proxy\": with the host's network the gateway cannot put the real value into requests, and the jail's placeholder would be useless; use --network proxy",
            plan.secrets
                .iter()
                .map(|s| s.name.clone())
                .chain(signins.iter().map(|s| format!("signin.{}", s.plan().name)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let values = real_values(plan)?;
    Ok((values, signins))
}

/// A fresh placeholder for each secret, by name: what the jail sees instead of the real value.
pub fn placeholders(values: &[(SecretPlan, String)]) -> anyhow::Result<BTreeMap<String, String>> {
    values
        .iter()
        .map(|(s, real)| Ok((s.name.clone(), corral_gateway::placeholder_for(real)?)))
        .collect()
}

/// The host side of the secrets `run` attached: with the proxy, the gateway (holding the real
/// `values`, swapping in the run's placeholders) and its CA files in the directory `run` names.
pub fn prepare(
    mut values: Vec<(SecretPlan, String)>,
    signins: Vec<Signin>,
    state: &[corral_session::hstate::StateSecret],
    run: &RunPlan,
    jail_id: &str,
    audit: &AuditLog,
) -> anyhow::Result<Secrets> {
    let Some(attached) = &run.attachments.secrets else {
        return Ok(Secrets {
            gateway: None,
            _trust_dir: None,
        });
    };
    let Some(trust_dir) = &attached.trust_dir else {
        // No network: nothing could use the real value; the jail still gets a placeholder so
        // harnesses that check for the variable start.
        return Ok(Secrets {
            gateway: None,
            _trust_dir: None,
        });
    };
    let dir = TrustDir::create(trust_dir)?;
    // Each sign-in's placeholder file, where the RunPlan binds it over the real one.
    crate::signin::jail_files(&signins, trust_dir)?;
    if run.plan.network.mode != NetworkMode::Proxy {
        // No network: the placeholder files only; nothing could use a real token.
        return Ok(Secrets {
            gateway: None,
            _trust_dir: Some(dir),
        });
    }
    // The hosts decided by method and path: the run CA may sign for them too.
    let decided: Vec<_> = run
        .plan
        .network
        .allow_paths
        .iter()
        .map(|r| r.host().clone())
        .collect();
    // The state files' credentials (corral-session hstate/creds.rs): their placeholders are
    // in corral's copies, their real values in the host's files.
    let mut placeholders = attached.placeholders.clone();
    for s in state {
        if let Some((plan, real)) = s.for_gateway() {
            placeholders.insert(plan.name.clone(), s.placeholder.clone());
            values.push((plan, real));
        }
    }
    let (gateway, _trust) = Gateway::with_run(
        values,
        &placeholders,
        signins,
        &decided,
        GatewayConfig {
            // The system store; SSL_CERT_FILE / SSL_CERT_DIR in corral's environment (a
            // corporate CA) are honoured.
            upstream_roots: None,
            trust_dir: trust_dir.clone(),
            system_bundle: None,
            audit: Some(AuditSink {
                log: audit.clone(),
                jail: jail_id.to_string(),
            }),
        },
    )?;
    Ok(Secrets {
        gateway: Some(gateway),
        _trust_dir: Some(dir),
    })
}

/// `[secrets]` for the container backends: with `network.mode = "proxy"` the real values for
/// the run's gateway proxy container (corral_engine::gateway); with no network a plan whose
/// environment holds placeholders only (nothing could use the real value). Host mode is
/// refused by the engine's setup, as by the native run.
pub fn for_engine(
    plan: &Plan,
) -> anyhow::Result<(Option<Plan>, corral_net::standalone::SecretsFile)> {
    let mut file = corral_net::standalone::SecretsFile::default();
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
pub fn real_values(plan: &Plan) -> anyhow::Result<Vec<(corral_policy::plan::SecretPlan, String)>> {
    let mut values = Vec::new();
    for s in &plan.secrets {
        let Some(real) = std::env::var_os(&s.from_env) else {
            bail!(
                "secret {}: ${} is not set in corral's environment; export it before running corral, or remove secrets.{} from the policy",
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
