//! The flags of `corral proxy`, shared with the lean `corral-proxy` executable (both include
//! this file), so the two accept exactly the same command line.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Address to listen on: HOST:PORT or unix:PATH
    #[arg(long, value_name = "ADDR", default_value = corral_policy::consts::PROXY_LISTEN)]
    pub listen: String,
    /// Policy file holding the [network] rules (reloaded on SIGHUP and when it changes)
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Audit log file, or - for standard output (JSON lines) (default: the project's log under
    /// $XDG_STATE_HOME/corral/)
    #[arg(long, value_name = "FILE", env = "CORRAL_AUDIT_LOG")]
    pub audit_log: Option<PathBuf>,
    /// Jail id written into the audit records (default: a new id)
    #[arg(long, value_name = "ID", env = "CORRAL_JAIL_ID")]
    pub jail: Option<String>,
    /// Serve [secrets] through the credential gateway: a JSON file of the secrets with their
    /// real values (written 0600 by `corral run --engine podman|docker`, or a Kubernetes Secret)
    #[arg(long, value_name = "FILE", requires = "gateway_dir")]
    pub secrets: Option<PathBuf>,
    /// With --secrets: the directory the gateway writes the jail's CA certificate, bundle and
    /// placeholders into (never the CA key, which stays in the proxy's memory)
    #[arg(long, value_name = "DIR", requires = "secrets")]
    pub gateway_dir: Option<PathBuf>,
    /// With --secrets: serve this run CA certificate (PEM) instead of a fresh CA (`corral kube
    /// render` makes it, so the sandbox trusts it before the proxy runs)
    #[arg(long, value_name = "FILE", requires_all = ["secrets", "ca_key"])]
    pub ca_cert: Option<PathBuf>,
    /// With --ca-cert: that CA's private key (PEM)
    #[arg(long, value_name = "FILE", requires = "ca_cert")]
    pub ca_key: Option<PathBuf>,
    /// With --secrets: the placeholders the jail was given (JSON: secret name to placeholder)
    #[arg(long, value_name = "FILE", requires = "secrets")]
    pub placeholders: Option<PathBuf>,
}

impl ProxyArgs {
    /// The library's options.
    pub fn options(self) -> corral_net::standalone::Options {
        corral_net::standalone::Options {
            listen: self.listen,
            policy: self.policy,
            audit_log: self.audit_log,
            jail: self.jail,
            secrets: self.secrets,
            gateway_dir: self.gateway_dir,
            ca: self.ca_cert.zip(self.ca_key),
            placeholders: self.placeholders,
        }
    }

    /// These arguments as a command line for `corral-proxy` (every value explicit, so what came
    /// from the environment or a default is passed on unchanged).
    #[allow(dead_code)] // used by `corral proxy` only
    pub fn argv(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["--listen".into(), self.listen.clone().into()];
        if let Some(p) = &self.policy {
            a.extend(["--policy".into(), p.clone().into()]);
        }
        if let Some(p) = &self.audit_log {
            a.extend(["--audit-log".into(), p.clone().into()]);
        }
        if let Some(j) = &self.jail {
            a.extend(["--jail".into(), j.into()]);
        }
        if let Some(p) = &self.secrets {
            a.extend(["--secrets".into(), p.clone().into()]);
        }
        if let Some(p) = &self.gateway_dir {
            a.extend(["--gateway-dir".into(), p.clone().into()]);
        }
        if let Some(p) = &self.ca_cert {
            a.extend(["--ca-cert".into(), p.clone().into()]);
        }
        if let Some(p) = &self.ca_key {
            a.extend(["--ca-key".into(), p.clone().into()]);
        }
        if let Some(p) = &self.placeholders {
            a.extend(["--placeholders".into(), p.clone().into()]);
        }
        a
    }
}
