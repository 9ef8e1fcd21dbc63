//! Shared by the end-to-end harness tests: a loopback host name, a test CA, the scripted mock
//! model server (tests/fixtures/mock-model/server.py) over HTTPS, and a directory walk.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::ToSocketAddrs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::jail_support::write;

/// tests/fixtures/mock-model/server.py
const MOCK_MODEL: &str = include_str!("../fixtures/mock-model/server.py");

/// This machine's host name when it resolves to loopback only (Debian's /etc/hosts maps it to
/// 127.0.1.1): the proxy resolves it itself, and NO_PROXY (localhost) does not apply to it.
pub fn loopback_name() -> Option<String> {
    let out = Command::new("hostname").output().ok()?;
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if name.is_empty() || name == "localhost" {
        return None;
    }
    let addrs: Vec<_> = (name.as_str(), 443).to_socket_addrs().ok()?.collect();
    (!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())).then_some(name)
}

pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

fn openssl(dir: &Path, args: &[&str]) {
    let st = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl");
    assert!(st.success(), "openssl {args:?}");
}

/// A test CA and a leaf for `host` (a name or an IP literal) in `dir` (ca.pem, leaf.pem, leaf.key).
pub fn certs(dir: &Path, host: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=corral test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "leaf.key",
            "-out",
            "leaf.csr",
            "-subj",
            &format!("/CN={host}"),
        ],
    );
    // An IP literal gets an IP SAN (what TLS clients check for `https://10.0.0.2/`).
    let san = if host.parse::<std::net::IpAddr>().is_ok() {
        "IP"
    } else {
        "DNS"
    };
    write(&dir.join("ext"), &format!("subjectAltName={san}:{host}\n"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "leaf.pem",
            "-days",
            "2",
            "-extfile",
            "ext",
        ],
    );
}

pub struct Mock {
    pub child: Child,
    pub port: u16,
    pub record: PathBuf,
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Mock {
    pub fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("mock record"))
            .collect()
    }
}

pub fn mock_model(dir: &Path, steps: &serde_json::Value) -> Mock {
    // Compiled into the test binary: the rootless pass runs a copy of it as a user who may not
    // be able to read the source tree.
    let server = dir.join("server.py");
    write(&server, MOCK_MODEL);
    write(&dir.join("steps.json"), &steps.to_string());
    let record = dir.join("seen.jsonl");
    let mut child = Command::new("python3")
        .arg(&server)
        .args(["--script", "steps.json", "--record", "seen.jsonl"])
        .args(["--cert", "leaf.pem", "--key", "leaf.key"])
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().parse().expect("mock port");
    Mock {
        child,
        port,
        record,
    }
}

pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}
