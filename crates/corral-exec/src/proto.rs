//! The wire protocol: the request bodies of `POST /execute` (seed 003) and `POST /v1/exec`, the
//! NDJSON events `/v1/exec` streams back, and seed 003's response shape. Parsed once, here, into
//! typed values; everything after this module works on [`ExecRequest`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Largest request body accepted apart from `stdin` (`command`, `env`, `cwd`, JSON overhead).
pub const MAX_BODY_BASE: usize = 1024 * 1024;
/// Largest `stdin` a request may carry.
pub const MAX_STDIN: usize = 16 * 1024 * 1024;
/// The whole request body limit: beyond it the server answers 413.
pub const MAX_BODY: usize = MAX_BODY_BASE + MAX_STDIN;

/// Why a request body was rejected (answered with 400).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("request body is not valid JSON for this endpoint: {0}")]
    Json(String),
    #[error(
        "\"command\" is empty: give the program and its arguments, e.g. {{\"command\":[\"cargo\",\"test\"]}}"
    )]
    EmptyCommand,
    #[error("\"command\"[0] is an empty string: name the program to run")]
    EmptyProgram,
    #[error("{field} contains a NUL byte, which no program can receive")]
    Nul { field: String },
    #[error("env name {name:?} is not a valid variable name (non-empty, no '=' or NUL)")]
    EnvName { name: String },
    #[error("\"stdin\" is {len} bytes; the limit is {MAX_STDIN} bytes")]
    StdinTooLarge { len: usize },
    #[error("\"timeout_ms\" must be greater than 0")]
    ZeroTimeout,
}

/// A command to run, as both endpoints describe it after parsing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecRequest {
    /// Program and arguments; never empty.
    pub command: Vec<String>,
    /// Working directory relative to the project root; `None` is the root.
    pub cwd: Option<String>,
    /// Variables set (or overridden) for this command.
    pub env: BTreeMap<String, String>,
    /// Kill the command after this long; `None` uses the server's default. Capped by the server.
    pub timeout_ms: Option<u64>,
    /// Written to the command's standard input, which is then closed. `None`: /dev/null.
    pub stdin: Option<String>,
}

/// `POST /execute` (seed 003): only `command`; other fields are ignored, as the seed's Go server
/// ignores them.
#[derive(Debug, Deserialize)]
struct LegacyBody {
    command: Vec<String>,
}

/// `POST /v1/exec`. Unknown fields are an error, so a misspelt `timeout_ms` is never silently
/// ignored.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct V1Body {
    command: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cwd: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stdin: Option<String>,
}

impl ExecRequest {
    /// A request for `command` with every other field at its default.
    pub fn new(command: Vec<String>) -> Self {
        Self {
            command,
            ..Self::default()
        }
    }

    /// Parse a `POST /execute` body.
    pub fn parse_legacy(body: &[u8]) -> Result<Self, RequestError> {
        let b: LegacyBody =
            serde_json::from_slice(body).map_err(|e| RequestError::Json(e.to_string()))?;
        let req = Self::new(b.command);
        req.validate()?;
        Ok(req)
    }

    /// Parse a `POST /v1/exec` body.
    pub fn parse_v1(body: &[u8]) -> Result<Self, RequestError> {
        let b: V1Body =
            serde_json::from_slice(body).map_err(|e| RequestError::Json(e.to_string()))?;
        let req = Self {
            command: b.command,
            cwd: b.cwd.filter(|c| !c.is_empty() && c != "."),
            env: b.env,
            timeout_ms: b.timeout_ms,
            stdin: b.stdin,
        };
        req.validate()?;
        Ok(req)
    }

    /// The `/v1/exec` body for this request (the client's side).
    pub fn to_v1_json(&self) -> Vec<u8> {
        let b = V1Body {
            command: self.command.clone(),
            cwd: self.cwd.clone(),
            env: self.env.clone(),
            timeout_ms: self.timeout_ms,
            stdin: self.stdin.clone(),
        };
        serde_json::to_vec(&b).expect("a request always serializes")
    }

    fn validate(&self) -> Result<(), RequestError> {
        let Some(program) = self.command.first() else {
            return Err(RequestError::EmptyCommand);
        };
        if program.is_empty() {
            return Err(RequestError::EmptyProgram);
        }
        for (i, arg) in self.command.iter().enumerate() {
            if arg.contains('\0') {
                return Err(RequestError::Nul {
                    field: format!("\"command\"[{i}]"),
                });
            }
        }
        if let Some(cwd) = &self.cwd
            && cwd.contains('\0')
        {
            return Err(RequestError::Nul {
                field: "\"cwd\"".into(),
            });
        }
        for (name, value) in &self.env {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(RequestError::EnvName { name: name.clone() });
            }
            if value.contains('\0') {
                return Err(RequestError::Nul {
                    field: format!("\"env\".{name}"),
                });
            }
        }
        if let Some(stdin) = &self.stdin
            && stdin.len() > MAX_STDIN
        {
            return Err(RequestError::StdinTooLarge { len: stdin.len() });
        }
        if self.timeout_ms == Some(0) {
            return Err(RequestError::ZeroTimeout);
        }
        Ok(())
    }
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// How a command ended, as the last `/v1/exec` event reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Exit {
    /// The exit status; 128+N when killed by signal N; 124 when the timeout killed it.
    pub exit: i32,
    /// The signal that ended it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub timed_out: bool,
    /// Output beyond `max_output` was dropped (a marker says where).
    #[serde(default, skip_serializing_if = "is_false")]
    pub truncated: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One line of a `/v1/exec` response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Event {
    // Variant order matters for parsing: `Error` (which has `error`) before `Exit`.
    /// Output, in the order the server read it.
    Output { stream: Stream, data: String },
    /// The command could not run or the server failed; `exit` is the status a client should
    /// report (127 not found, 126 not executable, 125 otherwise).
    Error {
        error: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit: Option<i32>,
    },
    /// The command ended (always the last event of a command that started).
    Exit(Exit),
}

impl Event {
    /// The event as one NDJSON line, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("an event always serializes");
        v.push(b'\n');
        v
    }
}

/// Seed 003's response, `{"exitCode":N,"output":"..."}`, with a trailing newline as Go's
/// `json.NewEncoder` writes it, invalid UTF-8 replaced by U+FFFD as Go does.
///
/// Every character a JSON string must or Go would escape (`"`, `\`, control characters, `<`,
/// `>`, `&`, U+2028, U+2029) is written as `\u00XX`, never as `\n` or `\\`: the same JSON
/// value, but one that survives the seed's `echo "$response" | jq` under Debian's dash, whose
/// `echo` turns `\n` and `\\` into raw bytes (and breaks the JSON) while leaving `\u` alone.
pub fn legacy_response(exit_code: i32, output: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(output.len() + 32);
    out.extend_from_slice(b"{\"exitCode\":");
    out.extend_from_slice(exit_code.to_string().as_bytes());
    out.extend_from_slice(b",\"output\":");
    echo_safe_json_string(&String::from_utf8_lossy(output), &mut out);
    out.extend_from_slice(b"}\n");
    out
}

/// A JSON string with every escape in the `\uXXXX` form (see [`legacy_response`]).
fn echo_safe_json_string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' | '\\' | '<' | '>' | '&' | '\u{2028}' | '\u{2029}' | '\0'..='\u{1f}' => {
                let n = c as u32;
                out.extend_from_slice(b"\\u");
                for shift in [12, 8, 4, 0] {
                    out.push(HEX[((n >> shift) & 0xf) as usize]);
                }
            }
            _ => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// Turns a byte stream cut at arbitrary points into UTF-8 text: a multi-byte character split
/// across two reads is held back until its end arrives; bytes that are not UTF-8 become U+FFFD.
#[derive(Debug, Default)]
pub struct Utf8Chunker {
    pending: Vec<u8>,
}

impl Utf8Chunker {
    /// The text of `pending + bytes` up to the last complete character.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::with_capacity(self.pending.len());
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // `good` is valid UTF-8: from_utf8 said so.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{fffd}');
                            rest = &bad[n..];
                        }
                        None => {
                            // An incomplete character at the end: keep it for the next read.
                            rest = bad;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Whatever is still held back (an incomplete character at end of stream), as U+FFFD.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_parses_every_field() {
        let r = ExecRequest::parse_v1(
            br#"{"command":["cargo","test"],"cwd":"sub/dir","env":{"A":"1"},"timeout_ms":5000,"stdin":"x"}"#,
        )
        .unwrap();
        let mut env = BTreeMap::new();
        env.insert("A".to_string(), "1".to_string());
        assert_eq!(
            r,
            ExecRequest {
                command: vec!["cargo".into(), "test".into()],
                cwd: Some("sub/dir".into()),
                env,
                timeout_ms: Some(5000),
                stdin: Some("x".into()),
            }
        );
        assert_eq!(ExecRequest::parse_v1(&r.to_v1_json()).unwrap(), r);
    }

    #[test]
    fn bad_bodies_are_rejected_with_reasons() {
        assert!(matches!(
            ExecRequest::parse_v1(b"{not json"),
            Err(RequestError::Json(_))
        ));
        assert!(matches!(
            ExecRequest::parse_v1(br#"{"command":"ls"}"#),
            Err(RequestError::Json(_))
        ));
        assert!(matches!(
            ExecRequest::parse_v1(br#"{"command":["ls"],"timeout":5}"#),
            Err(RequestError::Json(_))
        ));
        assert_eq!(
            ExecRequest::parse_v1(br#"{"command":[]}"#),
            Err(RequestError::EmptyCommand)
        );
        assert_eq!(
            ExecRequest::parse_legacy(br#"{"command":[""]}"#),
            Err(RequestError::EmptyProgram)
        );
        assert_eq!(
            ExecRequest::parse_v1(br#"{"command":["a\u0000b"]}"#),
            Err(RequestError::Nul {
                field: "\"command\"[0]".into()
            })
        );
        assert_eq!(
            ExecRequest::parse_v1(br#"{"command":["env"],"env":{"A=B":"1"}}"#),
            Err(RequestError::EnvName { name: "A=B".into() })
        );
        assert_eq!(
            ExecRequest::parse_v1(br#"{"command":["ls"],"timeout_ms":0}"#),
            Err(RequestError::ZeroTimeout)
        );
        // The legacy endpoint ignores extra fields, as the seed's server does.
        assert_eq!(
            ExecRequest::parse_legacy(br#"{"command":["ls"],"extra":1}"#).unwrap(),
            ExecRequest::new(vec!["ls".into()])
        );
    }

    #[test]
    fn events_serialize_as_the_spec_says() {
        let lines: Vec<String> = [
            Event::Output {
                stream: Stream::Stdout,
                data: "hi\n".into(),
            },
            Event::Output {
                stream: Stream::Stderr,
                data: "oops".into(),
            },
            Event::Exit(Exit {
                exit: 3,
                ..Exit::default()
            }),
            Event::Exit(Exit {
                exit: 124,
                signal: Some(15),
                timed_out: true,
                truncated: false,
            }),
            Event::Error {
                error: "not found".into(),
                exit: Some(127),
            },
        ]
        .iter()
        .map(|e| String::from_utf8(e.to_line()).unwrap())
        .collect();
        assert_eq!(
            lines,
            vec![
                "{\"stream\":\"stdout\",\"data\":\"hi\\n\"}\n",
                "{\"stream\":\"stderr\",\"data\":\"oops\"}\n",
                "{\"exit\":3}\n",
                "{\"exit\":124,\"signal\":15,\"timed_out\":true}\n",
                "{\"error\":\"not found\",\"exit\":127}\n",
            ]
        );
        for l in &lines {
            let e: Event = serde_json::from_str(l).unwrap();
            assert_eq!(e.to_line(), l.as_bytes());
        }
    }

    #[test]
    fn legacy_response_escapes_only_with_u_escapes() {
        let body = legacy_response(1, b"a<b>&\"c\"\n\\\x01\xff\t");
        assert_eq!(
            String::from_utf8(body.clone()).unwrap(),
            "{\"exitCode\":1,\"output\":\"a\\u003cb\\u003e\\u0026\\u0022c\\u0022\\u000a\\u005c\\u0001\u{fffd}\\u0009\"}\n"
        );
        // The same JSON value a standard encoder writes.
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"exitCode": 1, "output": "a<b>&\"c\"\n\\\u{1}\u{fffd}\t"})
        );
    }

    #[test]
    fn utf8_chunker_joins_split_characters() {
        let text = "héllo → wörld";
        let bytes = text.as_bytes();
        for cut in 0..bytes.len() {
            let mut c = Utf8Chunker::default();
            let mut s = c.push(&bytes[..cut]);
            s.push_str(&c.push(&bytes[cut..]));
            s.push_str(&c.finish());
            assert_eq!(s, text, "cut at {cut}");
        }
        let mut c = Utf8Chunker::default();
        assert_eq!(c.push(b"a\xffb\xe2\x86"), "a\u{fffd}b");
        assert_eq!(c.finish(), "\u{fffd}");
    }
}
