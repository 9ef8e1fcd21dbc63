//! The user's sign-in files for a gateway that cannot reach them: the container backends' gateway
//! proxy runs in a container of its own, without the user's home. The corral process on the host
//! serves each of the run's sign-in files on a Unix socket ([`FileServer`]) that only the
//! gateway proxy's container has; the gateway asks it for the tokens the file holds now (before
//! a refresh, [`read_tokens`]) and hands it the new real tokens after one ([`write_tokens`]).
//! The host side does the same locked, checked, in-place rewrite as the native gateway
//! ([`crate::signin::write_tokens`]), so the gateway container never holds the file, only
//! the tokens it already has.
//!
//! One request a connection, one JSON line each way, each bounded; a request naming a sign-in
//! the run does not serve is refused.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use corral_policy::signin::SigninPlan;

use crate::signin::{SigninError, Slot, TokenKind, file_tokens, write_tokens as write_file};

/// Largest request or answer line.
const MAX_LINE: u64 = 1 << 20;
/// How long either side waits for the other.
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    /// The tokens the user's file holds now.
    Read { name: String },
    /// Write these real tokens of `provider` into the user's file if its refresh token is
    /// still `expected` (at the places the format keeps them: the host decides, not the
    /// gateway).
    Write {
        name: String,
        #[serde(default)]
        provider: Option<String>,
        expected: String,
        tokens: Vec<(TokenKind, String)>,
        expires_in: Option<u64>,
    },
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
enum Reply {
    Tokens {
        tokens: Vec<(Slot, String)>,
    },
    Written,
    /// The file's refresh token is not the one expected (someone else refreshed).
    Changed {
        path: PathBuf,
    },
    Failed {
        error: String,
    },
}

fn remote_err(name: &str, socket: &Path, e: impl std::fmt::Display) -> SigninError {
    SigninError::Io {
        name: name.to_string(),
        step: "asking corral on the host through",
        path: socket.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    }
}

fn call(socket: &Path, name: &str, req: &Request) -> Result<Reply, SigninError> {
    let err = |e: std::io::Error| remote_err(name, socket, e);
    let (_dir, at) = reachable(socket).map_err(err)?;
    let mut s = UnixStream::connect(at).map_err(err)?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(err)?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(err)?;
    let mut line = serde_json::to_vec(req).expect("plain data serializes");
    line.push(b'\n');
    s.write_all(&line).map_err(err)?;
    let mut answer = Vec::new();
    BufReader::new(s.take(MAX_LINE))
        .read_until(b'\n', &mut answer)
        .map_err(err)?;
    serde_json::from_slice(&answer).map_err(|e| remote_err(name, socket, e))
}

/// The tokens sign-in `name`'s file holds now, read by corral on the host.
pub fn read_tokens(socket: &Path, name: &str) -> Result<Vec<(Slot, String)>, SigninError> {
    let req = Request::Read {
        name: name.to_string(),
    };
    match call(socket, name, &req)? {
        Reply::Tokens { tokens } => Ok(tokens),
        Reply::Failed { error } => Err(remote_err(name, socket, error)),
        Reply::Written | Reply::Changed { .. } => {
            Err(remote_err(name, socket, "unexpected answer"))
        }
    }
}

/// Have corral on the host write `tokens` into sign-in `name`'s file
/// ([`crate::signin::write_tokens`]).
pub fn write_tokens(
    socket: &Path,
    name: &str,
    provider: Option<&str>,
    expected: &str,
    tokens: &[(TokenKind, String)],
    expires_in: Option<u64>,
) -> Result<(), SigninError> {
    let req = Request::Write {
        name: name.to_string(),
        provider: provider.map(str::to_string),
        expected: expected.to_string(),
        tokens: tokens.to_vec(),
        expires_in,
    };
    match call(socket, name, &req)? {
        Reply::Written => Ok(()),
        Reply::Changed { path } => Err(SigninError::Changed {
            name: name.to_string(),
            path,
        }),
        Reply::Failed { error } => Err(remote_err(name, socket, error)),
        Reply::Tokens { .. } => Err(remote_err(name, socket, "unexpected answer")),
    }
}

/// The host side: the run's sign-in files served on a Unix socket until dropped (the socket
/// file is removed then).
pub struct FileServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for FileServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileServer")
            .field("path", &self.path)
            .finish()
    }
}

impl FileServer {
    /// Listen on `path` (created here; the caller sets who may connect) and serve `plans`.
    pub fn serve(path: &Path, plans: Vec<SigninPlan>) -> std::io::Result<FileServer> {
        let listener = {
            let (_dir, at) = reachable(path)?;
            UnixListener::bind(at)?
        };
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("corral-signin-files".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if flag.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(conn) = conn {
                        answer(conn, &plans);
                    }
                }
            })?;
        Ok(FileServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    /// The socket's path on the host.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees the flag.
        let woke = reachable(&self.path)
            .and_then(|(_dir, at)| UnixStream::connect(at))
            .is_ok();
        if let Some(t) = self.thread.take()
            && woke
        {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `path` as a socket address can carry it: a socket path is limited to 107 bytes, which a
/// project's state directory can exceed, so a longer one is reached through a descriptor of its
/// directory (`/proc/self/fd/N/NAME`), kept open by the caller while it binds or connects.
fn reachable(path: &Path) -> std::io::Result<(Option<std::fs::File>, PathBuf)> {
    use std::os::fd::AsRawFd;
    const SUN_PATH_MAX: usize = 107;
    if path.as_os_str().len() <= SUN_PATH_MAX {
        return Ok((None, path.to_path_buf()));
    }
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::other(
            "a socket path needs a directory and a name",
        ));
    };
    let dir = std::fs::File::open(parent)?;
    let at = Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    Ok((Some(dir), at))
}

/// One request on `conn`, answered.
fn answer(mut conn: UnixStream, plans: &[SigninPlan]) {
    let _ = conn.set_read_timeout(Some(TIMEOUT));
    let _ = conn.set_write_timeout(Some(TIMEOUT));
    let mut line = Vec::new();
    let read = match conn.try_clone() {
        Ok(c) => BufReader::new(c.take(MAX_LINE)).read_until(b'\n', &mut line),
        Err(e) => Err(e),
    };
    let reply = match read {
        Ok(0) => return,
        Ok(_) => match serde_json::from_slice::<Request>(&line) {
            Ok(req) => handle(req, plans, SystemTime::now()),
            Err(e) => Reply::Failed {
                error: format!("not a request: {e}"),
            },
        },
        Err(e) => Reply::Failed {
            error: format!("reading the request: {e}"),
        },
    };
    let mut out = serde_json::to_vec(&reply).expect("plain data serializes");
    out.push(b'\n');
    let _ = conn.write_all(&out);
}

fn handle(req: Request, plans: &[SigninPlan], now: SystemTime) -> Reply {
    let name = match &req {
        Request::Read { name } | Request::Write { name, .. } => name,
    };
    let Some(plan) = plans.iter().find(|p| &p.name == name) else {
        return Reply::Failed {
            error: format!("this run serves no sign-in {name:?}"),
        };
    };
    let result = match req {
        Request::Read { .. } => file_tokens(plan).map(|tokens| Reply::Tokens { tokens }),
        Request::Write {
            provider,
            expected,
            tokens,
            expires_in,
            ..
        } => write_file(
            plan,
            provider.as_deref(),
            &expected,
            &tokens,
            expires_in,
            now,
        )
        .map(|()| Reply::Written),
    };
    match result {
        Ok(r) => r,
        Err(SigninError::Changed { path, .. }) => Reply::Changed { path },
        Err(e) => Reply::Failed {
            error: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_policy::domain::DomainPattern;
    use corral_policy::signin::SigninFormat;
    use std::os::unix::fs::MetadataExt;

    fn plan(file: &Path) -> SigninPlan {
        SigninPlan {
            name: "claude".into(),
            format: SigninFormat::Claude,
            file: file.to_path_buf(),
            api_hosts: vec![DomainPattern::parse("api.example.com").unwrap()],
            token_host: Some(DomainPattern::parse("auth.example.com").unwrap()),
            token_path: Some("/token".into()),
            api_key_hosts: vec![],
            providers: vec![],
        }
    }

    #[test]
    fn the_host_reads_and_rewrites_the_file_in_place_for_the_gateway() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("creds.json");
        std::fs::write(
            &file,
            r#"{"claudeAiOauth":{"accessToken":"a-old","refreshToken":"r-old","expiresAt":1,"scopes":["x"]}}"#,
        )
        .unwrap();
        let inode = std::fs::metadata(&file).unwrap().ino();
        // Deeper than a socket address can name (a project's state directory may be).
        let deep = dir.path().join("d".repeat(60)).join("e".repeat(60));
        std::fs::create_dir_all(&deep).unwrap();
        let sock = deep.join("s.sock");
        let server = FileServer::serve(&sock, vec![plan(&file)]).unwrap();
        let (_d, short) = reachable(&sock).unwrap();
        let sock = short;
        let tokens = read_tokens(&sock, "claude").unwrap();
        let kinds: Vec<(TokenKind, &str)> =
            tokens.iter().map(|(s, t)| (s.kind, t.as_str())).collect();
        assert_eq!(
            kinds,
            vec![(TokenKind::Access, "a-old"), (TokenKind::Refresh, "r-old")]
        );
        // A sign-in the run does not serve is refused.
        assert!(read_tokens(&sock, "codex").is_err());
        let new = vec![
            (TokenKind::Access, "a-new".to_string()),
            (TokenKind::Refresh, "r-new".to_string()),
        ];
        // Someone else refreshed (the file's refresh token is not the one expected): left alone.
        assert!(matches!(
            write_tokens(&sock, "claude", None, "r-other", &new, Some(60)),
            Err(SigninError::Changed { .. })
        ));
        write_tokens(&sock, "claude", None, "r-old", &new, Some(60)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(v["claudeAiOauth"]["accessToken"], "a-new");
        assert_eq!(v["claudeAiOauth"]["refreshToken"], "r-new");
        assert_eq!(v["claudeAiOauth"]["scopes"], serde_json::json!(["x"]));
        assert!(v["claudeAiOauth"]["expiresAt"].as_u64().unwrap() > 1);
        assert_eq!(std::fs::metadata(&file).unwrap().ino(), inode);
        drop(server);
        assert!(!sock.exists());
        assert!(read_tokens(&sock, "claude").is_err());
    }

    #[test]
    fn a_gateway_elsewhere_refreshes_through_corral_on_the_host_and_not_without_it() {
        use crate::signin::{FileAccess, Refreshing, Signin};
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("creds.json");
        std::fs::write(
            &file,
            r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat01-aaaaaaaaaaaaaaaaaaaa","refreshToken":"sk-ant-ort01-rrrrrrrrrrrrrrrrrrrr","expiresAt":1}}"#,
        )
        .unwrap();
        let sock = dir.path().join("s.sock");
        let host = Signin::load(plan(&file)).unwrap().unwrap();
        let remote =
            Signin::from_tokens(plan(&file), host.tokens(), FileAccess::Remote(sock.clone()))
                .unwrap();
        // Nobody answers on the host: a refresh would lose its tokens, so it is refused.
        assert!(remote.write_back_reachable().is_err());
        let _server = FileServer::serve(&sock, vec![plan(&file)]).unwrap();
        remote.write_back_reachable().unwrap();
        let r = Refreshing::of(None);
        let (jail, _) = remote
            .take_response(&r, br#"{"access_token":"sk-ant-oat01-newnewnewnewnewnewnewn","refresh_token":"sk-ant-ort01-newrefreshnewrefresh","expires_in":60}"#)
            .unwrap();
        assert!(!String::from_utf8_lossy(&jail).contains("newnewnew"));
        remote.write_back(&r, Some(60), SystemTime::now()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(
            v["claudeAiOauth"]["refreshToken"],
            "sk-ant-ort01-newrefreshnewrefresh"
        );
        assert_eq!(
            v["claudeAiOauth"]["accessToken"],
            "sk-ant-oat01-newnewnewnewnewnewnewn"
        );
    }

    #[test]
    fn a_by_provider_refresh_is_written_by_the_host_into_that_provider_only() {
        use crate::signin::{FileAccess, Signin};
        use corral_policy::signin::{ProviderPlan, parse_token_url};
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("auth.json");
        let (host, path) = parse_token_url("https://auth.example.com/token").unwrap();
        let plan = SigninPlan {
            name: "pi".into(),
            format: SigninFormat::Pi,
            file: file.clone(),
            api_hosts: vec![],
            token_host: None,
            token_path: None,
            api_key_hosts: vec![],
            providers: vec![ProviderPlan {
                id: "anthropic".into(),
                api_hosts: vec![DomainPattern::parse("api.example.com").unwrap()],
                token_host: Some(host),
                token_path: Some(path),
            }],
        };
        let before = serde_json::json!({
            "anthropic": {"type": "oauth", "access": "sk-ant-oat01-aaaaaaaaaaaaaaaaaaaa",
                "refresh": "sk-ant-ort01-rrrrrrrrrrrrrrrrrrrr", "expires": 1},
            "openai": {"type": "api_key", "key": "!pass show openai"}});
        std::fs::write(&file, before.to_string()).unwrap();
        let sock = dir.path().join("s.sock");
        let local = Signin::load(plan.clone()).unwrap().unwrap();
        let remote = Signin::from_tokens(
            plan.clone(),
            local.tokens(),
            FileAccess::Remote(sock.clone()),
        )
        .unwrap();
        let _server = FileServer::serve(&sock, vec![plan]).unwrap();
        let jailed: serde_json::Value =
            serde_json::from_slice(&local.placeholder_file().unwrap()).unwrap();
        let body = format!(
            r#"{{"refresh_token":"{}"}}"#,
            jailed["anthropic"]["refresh"].as_str().unwrap()
        );
        let at = corral_policy::domain::normalize_host("auth.example.com").unwrap();
        let (r, _) = remote
            .swap_refresh((&at, 443, "/token"), body.as_bytes(), false)
            .unwrap();
        remote
            .take_response(&r, br#"{"access_token":"sk-ant-oat01-newnewnewnewnewnewnewn","refresh_token":"sk-ant-ort01-newrefreshnewrefresh","expires_in":60}"#)
            .unwrap();
        remote.write_back(&r, Some(60), SystemTime::now()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(
            v["anthropic"]["refresh"],
            "sk-ant-ort01-newrefreshnewrefresh"
        );
        assert_eq!(v["openai"], before["openai"]);
        // The host decides where tokens go: a write naming a provider it does not serve, or
        // into a key, is refused whatever the gateway asks.
        let new = vec![
            (TokenKind::Access, "a2".to_string()),
            (TokenKind::Refresh, "r2".to_string()),
        ];
        assert!(write_tokens(&sock, "pi", Some("openai"), "x", &new, None).is_err());
        let key = vec![(TokenKind::Key, "k".to_string())];
        let refresh = "sk-ant-ort01-newrefreshnewrefresh";
        assert!(write_tokens(&sock, "pi", Some("anthropic"), refresh, &key, None).is_err());
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&std::fs::read(&file).unwrap()).unwrap(),
            v
        );
    }
}
