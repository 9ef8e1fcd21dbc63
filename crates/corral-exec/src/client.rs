//! The client side: finding the executor (SPEC section 6) and a small blocking HTTP/1.1 client
//! for `POST /v1/exec` over TCP or a unix socket.
//!
//! The client is deliberately tiny and synchronous: `corral exec -- true` must cost well under
//! 5 ms, and it must never go through `HTTP_PROXY` (the executor is local; the proxy is for the
//! internet), so it reads no proxy variable at all.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use corral_policy::plan::ExecutorTarget;

use crate::proto::{Event, ExecRequest};

/// Port of an executor found through docker compose (seed 003's convention).
pub const COMPOSE_PORT: u16 = 8080;

/// Where the executor listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp { host, port } => write!(f, "http://{host}:{port}"),
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// An executor found by [`discover`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub endpoint: Endpoint,
    pub token: Option<String>,
    /// The project root the server's relative `cwd` is relative to, when known.
    pub project_root: Option<PathBuf>,
    /// How it was found, for error messages.
    pub found_by: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("CORRAL_EXECUTOR={value:?} is neither http://HOST:PORT nor unix:/PATH")]
    BadEnv { value: String },
    #[error("cannot read the executor token file {path} (CORRAL_EXECUTOR_TOKEN_FILE): {source}")]
    Token { path: PathBuf, source: io::Error },
    #[error("{path}: {message}")]
    Policy { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Compose { path: PathBuf, message: String },
    #[error(
        "no executor found: CORRAL_EXECUTOR is not set (corral run sets it inside a jail), and neither \
         a corral.toml with [executor] target = \"compose:SERVICE\" nor a docker-compose.override.yml \
         with services.executor.networks.*.aliases exists in {cwd} or above"
    )]
    NotFound { cwd: PathBuf },
    #[error("cannot reach the executor at {endpoint} ({found_by}): {source}; is it running?")]
    Connect {
        endpoint: Endpoint,
        found_by: String,
        source: io::Error,
    },
    #[error("executor at {endpoint}: {source}")]
    Io {
        endpoint: Endpoint,
        source: io::Error,
    },
    #[error("executor at {endpoint} sent a malformed response: {what}")]
    Protocol { endpoint: Endpoint, what: String },
    #[error("executor refused the command (HTTP {status}): {message}")]
    Refused {
        status: u16,
        message: String,
        exit: i32,
    },
}

impl ClientError {
    /// The exit status `corral exec` reports for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            ClientError::Refused { exit, .. } => *exit,
            _ => 125,
        }
    }
}

/// Parse `http://HOST:PORT` or `unix:/PATH`.
pub fn parse_endpoint(value: &str) -> Option<Endpoint> {
    if let Some(p) = value.strip_prefix("unix:") {
        return (!p.is_empty()).then(|| Endpoint::Unix(PathBuf::from(p)));
    }
    let rest = value.strip_prefix("http://")?.trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    Some(Endpoint::Tcp {
        host: host.to_string(),
        port: port.parse().ok()?,
    })
}

/// Find the executor. `env` looks up a variable of the caller; `read_target` reads the
/// `[executor] target` of a `corral.toml` (the policy crate's parser, so there is one).
///
/// Order (SPEC section 6): `CORRAL_EXECUTOR` (+ `CORRAL_EXECUTOR_TOKEN_FILE`); else the nearest
/// `corral.toml` at or above `cwd` whose target is `compose:SERVICE` (the service's first network
/// alias in `docker-compose.override.yml`, else the service name, port 8080); else the nearest
/// `docker-compose.override.yml` with `services.executor.networks.*.aliases[0]`, port 8080.
pub fn discover(
    cwd: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    read_target: &dyn Fn(&Path) -> Result<Option<ExecutorTarget>, String>,
) -> Result<Target, ClientError> {
    let env_root = env("CORRAL_PROJECT_ROOT")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    if let Some(value) = env("CORRAL_EXECUTOR").filter(|v| !v.is_empty()) {
        let endpoint = parse_endpoint(&value).ok_or(ClientError::BadEnv {
            value: value.clone(),
        })?;
        let token = match env("CORRAL_EXECUTOR_TOKEN_FILE").filter(|v| !v.is_empty()) {
            Some(path) => Some(read_token(Path::new(&path))?),
            None => None,
        };
        let project_root = env_root.or_else(|| find_up(cwd, &["corral.toml", ".git"]));
        return Ok(Target {
            endpoint,
            token,
            project_root,
            found_by: "CORRAL_EXECUTOR".into(),
        });
    }
    for dir in cwd.ancestors() {
        let policy = dir.join("corral.toml");
        if policy.is_file() {
            let target = read_target(&policy).map_err(|message| ClientError::Policy {
                path: policy.clone(),
                message,
            })?;
            if let Some(ExecutorTarget::Compose(service)) = target {
                let compose = dir.join("docker-compose.override.yml");
                let host = if compose.is_file() {
                    compose_alias(&compose, &service)?.unwrap_or_else(|| service.clone())
                } else {
                    service.clone()
                };
                return Ok(Target {
                    endpoint: Endpoint::Tcp {
                        host,
                        port: COMPOSE_PORT,
                    },
                    token: None,
                    project_root: Some(dir.to_path_buf()),
                    found_by: format!(
                        "{} [executor] target = \"compose:{service}\"",
                        policy.display()
                    ),
                });
            }
        }
        let compose = dir.join("docker-compose.override.yml");
        if compose.is_file()
            && let Some(host) = compose_alias(&compose, "executor")?
        {
            return Ok(Target {
                endpoint: Endpoint::Tcp {
                    host,
                    port: COMPOSE_PORT,
                },
                token: None,
                project_root: Some(dir.to_path_buf()),
                found_by: format!("{} services.executor", compose.display()),
            });
        }
    }
    Err(ClientError::NotFound {
        cwd: cwd.to_path_buf(),
    })
}

fn find_up(cwd: &Path, markers: &[&str]) -> Option<PathBuf> {
    cwd.ancestors()
        .find(|d| markers.iter().any(|m| d.join(m).exists()))
        .map(Path::to_path_buf)
}

fn read_token(path: &Path) -> Result<String, ClientError> {
    let t = std::fs::read_to_string(path).map_err(|source| ClientError::Token {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(t.trim().to_string())
}

/// The first network alias of `services.SERVICE` in a compose file, as seed 003's
/// `yq '.services.executor.networks["pi-internal"].aliases[0]'` reads it (any network here).
pub fn compose_alias(path: &Path, service: &str) -> Result<Option<String>, ClientError> {
    let err = |message: String| ClientError::Compose {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| err(format!("not valid YAML: {e}")))?;
    let networks = doc
        .get("services")
        .and_then(|s| s.get(service))
        .and_then(|s| s.get("networks"));
    let Some(serde_yaml_ng::Value::Mapping(networks)) = networks else {
        return Ok(None);
    };
    for (_, net) in networks {
        if let Some(alias) = net
            .get("aliases")
            .and_then(|a| a.get(0))
            .and_then(|a| a.as_str())
        {
            return Ok(Some(alias.to_string()));
        }
    }
    Ok(None)
}

/// The `cwd` to send: `dir` relative to the project root, or `None` when it is the root or
/// not below it.
pub fn relative_cwd(project_root: &Path, dir: &Path) -> Option<String> {
    let rel = dir.strip_prefix(project_root).ok()?;
    let s = rel.to_str()?;
    (!s.is_empty()).then(|| s.to_string())
}

enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf),
            Conn::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(buf),
            Conn::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.flush(),
            Conn::Unix(s) => s.flush(),
        }
    }
}

fn connect(target: &Target) -> Result<Conn, ClientError> {
    let cerr = |source| ClientError::Connect {
        endpoint: target.endpoint.clone(),
        found_by: target.found_by.clone(),
        source,
    };
    match &target.endpoint {
        Endpoint::Unix(p) => {
            // `corral run` does not wait for its executor to listen before starting the jail:
            // give a socket that is not there yet (or not accepting yet) a moment.
            let until = std::time::Instant::now() + Duration::from_secs(3);
            loop {
                match UnixStream::connect(p) {
                    Ok(s) => return Ok(Conn::Unix(s)),
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                        ) && std::time::Instant::now() < until =>
                    {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(cerr(e)),
                }
            }
        }
        Endpoint::Tcp { host, port } => {
            let addrs: Vec<_> = (host.as_str(), *port)
                .to_socket_addrs()
                .map_err(cerr)?
                .collect();
            let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
            for a in addrs {
                match TcpStream::connect_timeout(&a, Duration::from_secs(10)) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok(Conn::Tcp(s));
                    }
                    Err(e) => last = e,
                }
            }
            Err(cerr(last))
        }
    }
}

/// Run `req` on the executor, handing every event to `on_event` as it arrives. Returns the
/// command's exit status (the `exit` of its last event). A 429 (executor busy) is retried with
/// back-off for up to a minute.
pub fn run(
    target: &Target,
    req: &ExecRequest,
    on_event: &mut dyn FnMut(&Event) -> io::Result<()>,
) -> Result<i32, ClientError> {
    let mut delay = Duration::from_millis(50);
    let mut waited = Duration::ZERO;
    loop {
        match run_once(target, req, on_event) {
            Err(ClientError::Refused { status: 429, .. }) if waited < Duration::from_secs(60) => {
                std::thread::sleep(delay);
                waited += delay;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            r => return r,
        }
    }
}

fn run_once(
    target: &Target,
    req: &ExecRequest,
    on_event: &mut dyn FnMut(&Event) -> io::Result<()>,
) -> Result<i32, ClientError> {
    let ioerr = |source| ClientError::Io {
        endpoint: target.endpoint.clone(),
        source,
    };
    let proto = |what: String| ClientError::Protocol {
        endpoint: target.endpoint.clone(),
        what,
    };
    let mut stream = connect(target)?;
    let body = req.to_v1_json();
    let host = match &target.endpoint {
        Endpoint::Tcp { host, port } => format!("{host}:{port}"),
        Endpoint::Unix(_) => "localhost".into(),
    };
    let mut head = format!(
        "POST /v1/exec HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Accept: application/x-ndjson\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(t) = &target.token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    head.push_str("\r\n");
    let mut msg = head.into_bytes();
    msg.extend_from_slice(&body);
    stream.write_all(&msg).map_err(ioerr)?;

    // Small buffers first: each is zeroed, its pages faulted in, before its first read (a
    // fault costs microseconds in a VM), and `true`'s whole answer is under 200 bytes. The
    // body's buffer grows when the output fills it (below), and reads of at least this
    // reader's capacity bypass it.
    let mut r = BufReader::with_capacity(8 * 1024, stream);
    let mut line = String::new();
    r.read_line(&mut line).map_err(ioerr)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| proto(format!("bad status line {:?}", line.trim_end())))?;
    let mut chunked = false;
    let mut length: Option<u64> = None;
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(ioerr)? == 0 {
            return Err(proto("connection closed in the headers".into()));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            } else if k == "content-length" {
                length = v.parse().ok();
            }
        }
    }
    let mut body = BodyReader {
        inner: r,
        chunked,
        remaining: if chunked {
            0
        } else {
            length.unwrap_or(u64::MAX)
        },
        done: false,
    };

    if status != 200 {
        let mut text = String::new();
        let _ = body.read_to_string(&mut text);
        let (message, exit) = match serde_json::from_str::<Event>(text.trim()) {
            Ok(Event::Error { error, exit }) => (error, exit.unwrap_or(125)),
            _ => (text.trim().to_string(), 125),
        };
        let exit = if status == 401 { 125 } else { exit };
        return Err(ClientError::Refused {
            status,
            message,
            exit,
        });
    }

    // Split the body into lines as bytes arrive; hand each event on at once.
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 8 * 1024];
    loop {
        let n = body.read(&mut buf).map_err(ioerr)?;
        if n == 0 {
            break;
        }
        // A command that streams output: 64 KiB reads (straight from the socket).
        if n == buf.len() && buf.len() < 64 * 1024 {
            buf.resize(64 * 1024, 0);
        }
        pending.extend_from_slice(&buf[..n]);
        let mut start = 0;
        while let Some(i) = pending[start..].iter().position(|&b| b == b'\n') {
            let l = &pending[start..start + i];
            start += i + 1;
            if l.is_empty() {
                continue;
            }
            let ev: Event = serde_json::from_slice(l)
                .map_err(|e| proto(format!("bad event {:?}: {e}", String::from_utf8_lossy(l))))?;
            on_event(&ev).map_err(ioerr)?;
            match ev {
                Event::Exit(x) => return Ok(x.exit),
                Event::Error { exit, .. } => return Ok(exit.unwrap_or(125)),
                Event::Output { .. } => {}
            }
        }
        pending.drain(..start);
    }
    Err(proto(
        "the connection closed before the command's exit status arrived".into(),
    ))
}

/// A response body: chunked or length-delimited.
struct BodyReader<R: BufRead> {
    inner: R,
    chunked: bool,
    /// Bytes left in the current chunk (chunked) or in the body.
    remaining: u64,
    done: bool,
}

impl<R: BufRead> Read for BodyReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.chunked && self.remaining == 0 {
            let mut line = String::new();
            self.inner.read_line(&mut line)?;
            let size = line.trim_end().split(';').next().unwrap_or("");
            let size = u64::from_str_radix(size.trim(), 16).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad chunk size {line:?}"),
                )
            })?;
            if size == 0 {
                self.done = true;
                return Ok(0);
            }
            self.remaining = size;
        }
        let want = (buf.len() as u64).min(self.remaining) as usize;
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            self.done = true;
            return Ok(0);
        }
        self.remaining -= n as u64;
        if self.chunked && self.remaining == 0 {
            let mut crlf = [0u8; 2];
            self.inner.read_exact(&mut crlf)?;
        }
        if !self.chunked && self.remaining == 0 {
            self.done = true;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("http://test-project:8080"),
            Some(Endpoint::Tcp {
                host: "test-project".into(),
                port: 8080
            })
        );
        assert_eq!(
            parse_endpoint("unix:/run/corral/exec.sock"),
            Some(Endpoint::Unix("/run/corral/exec.sock".into()))
        );
        assert_eq!(
            parse_endpoint("http://[::1]:1/"),
            Some(Endpoint::Tcp {
                host: "::1".into(),
                port: 1
            })
        );
        assert_eq!(parse_endpoint("https://x:1"), None);
        assert_eq!(parse_endpoint("http://x"), None);
    }

    const SEED_OVERRIDE: &str = r#"
volumes:
  pi-shared:
    external: true
networks:
  pi-internal:
    external: true
services:
  executor:
    build: .
    command: ["/home/app/shared/executor"]
    networks:
      pi-internal:
        aliases: ["test-project"]
"#;

    fn no_target(_: &Path) -> Result<Option<ExecutorTarget>, String> {
        Ok(None)
    }

    #[test]
    fn discovery_order() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("proj");
        let sub = root.join("src/deep");
        std::fs::create_dir_all(&sub).unwrap();
        let tok = dir.path().join("token");
        std::fs::write(&tok, "s3cret\n").unwrap();

        // Nothing: a clear error.
        let empty = |_: &str| None;
        assert!(matches!(
            discover(&sub, &empty, &no_target),
            Err(ClientError::NotFound { .. })
        ));

        // The seed's override file, found from a subdirectory.
        std::fs::write(root.join("docker-compose.override.yml"), SEED_OVERRIDE).unwrap();
        let t = discover(&sub, &empty, &no_target).unwrap();
        assert_eq!(
            t,
            Target {
                endpoint: Endpoint::Tcp {
                    host: "test-project".into(),
                    port: 8080
                },
                token: None,
                project_root: Some(root.clone()),
                found_by: format!(
                    "{} services.executor",
                    root.join("docker-compose.override.yml").display()
                ),
            }
        );
        assert_eq!(relative_cwd(&root, &sub), Some("src/deep".into()));
        assert_eq!(relative_cwd(&root, &root), None);

        // corral.toml naming a compose service without an alias: the service name.
        std::fs::write(root.join("corral.toml"), "").unwrap();
        let compose_app = |_: &Path| Ok(Some(ExecutorTarget::Compose("app".into())));
        let t = discover(&sub, &empty, &compose_app).unwrap();
        assert_eq!(
            t.endpoint,
            Endpoint::Tcp {
                host: "app".into(),
                port: 8080
            }
        );

        // CORRAL_EXECUTOR wins, with its token.
        let mut vars = BTreeMap::new();
        vars.insert("CORRAL_EXECUTOR", "unix:/run/x.sock".to_string());
        vars.insert("CORRAL_EXECUTOR_TOKEN_FILE", tok.display().to_string());
        let env = |k: &str| vars.get(k).cloned();
        let t = discover(&sub, &env, &compose_app).unwrap();
        assert_eq!(t.endpoint, Endpoint::Unix("/run/x.sock".into()));
        assert_eq!(t.token.as_deref(), Some("s3cret"));
        assert_eq!(t.project_root, Some(root.clone()));

        let bad = |k: &str| (k == "CORRAL_EXECUTOR").then(|| "ftp://x".to_string());
        assert!(matches!(
            discover(&sub, &bad, &no_target),
            Err(ClientError::BadEnv { .. })
        ));
    }
}
