//! The gateway's HTTP/1.1 side: request and response heads parsed by `corral-http1` (the
//! parser corral-net's proxy uses: one parser, one set of smuggling rules), re-serialised in
//! canonical form, and message bodies relayed (chunked bodies verbatim).
//!
//! What the upstream receives is exactly what was checked: CRLF line ends only, no obs-fold,
//! no whitespace before the colon, no control bytes, at most one `Content-Length` of plain
//! digits and one `Transfer-Encoding` that is exactly `chunked`, never both, a bounded head.

use corral_http1::{Framing, Version};
pub use corral_http1::{Header, ParseError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest request or response head accepted (the shared parser's bound).
pub const MAX_HEAD: usize = corral_http1::MAX_HEAD_BYTES;
/// Longest chunk-size or trailer line.
const MAX_LINE: usize = 8 * 1024;

/// The status a client gets for a parse error.
pub trait ErrorStatus {
    fn status(&self) -> u16;
}

impl ErrorStatus for ParseError {
    fn status(&self) -> u16 {
        match self {
            ParseError::TooLarge => 431,
            ParseError::Malformed(_) => 400,
        }
    }
}

/// A parsed request line and header fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub target: String,
    /// HTTP/1.`minor` (0 or 1).
    pub minor: u8,
    pub headers: Vec<Header>,
    /// The body framing the shared parser derived (and checked) from the head.
    framing: Body,
}

/// A parsed status line and header fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub minor: u8,
    pub status: u16,
    pub reason: Vec<u8>,
    pub headers: Vec<Header>,
}

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    None,
    Length(u64),
    Chunked,
    /// Until the sender closes (responses only).
    UntilClose,
}

impl From<Framing> for Body {
    fn from(f: Framing) -> Body {
        match f {
            Framing::None | Framing::Length(0) => Body::None,
            Framing::Length(n) => Body::Length(n),
            Framing::Chunked => Body::Chunked,
            Framing::UntilClose => Body::UntilClose,
        }
    }
}

fn minor(v: Version) -> u8 {
    match v {
        Version::Http10 => 0,
        Version::Http11 => 1,
    }
}

/// Parse a request head at the start of `buf`: `Ok(None)` while it is incomplete, else the head
/// and the number of bytes it used. Ambiguous framing is an error here already.
pub fn parse_request(buf: &[u8]) -> Result<Option<(RequestHead, usize)>, ParseError> {
    let Some(end) = corral_http1::find_head_end(buf)? else {
        return Ok(None);
    };
    let h = corral_http1::parse_request_head(&buf[..end])?;
    Ok(Some((
        RequestHead {
            method: h.method,
            target: h.target,
            minor: minor(h.version),
            headers: h.headers,
            framing: h.framing.into(),
        },
        end,
    )))
}

/// Parse a response head at the start of `buf` (same contract as [`parse_request`]).
pub fn parse_response(buf: &[u8]) -> Result<Option<(ResponseHead, usize)>, ParseError> {
    let Some(end) = corral_http1::find_head_end(buf)? else {
        return Ok(None);
    };
    let h = corral_http1::parse_response_head(&buf[..end])?;
    Ok(Some((
        ResponseHead {
            minor: minor(h.version),
            status: h.status,
            reason: h.reason,
            headers: h.headers,
        },
        end,
    )))
}

/// Header lookups shared by requests and responses.
pub trait Headers {
    fn headers(&self) -> &[Header];
    fn headers_mut(&mut self) -> &mut Vec<Header>;

    /// Every value of the field `name`.
    fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers()
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.as_slice())
    }

    fn get(&self, name: &str) -> Option<&[u8]> {
        self.headers()
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.as_slice())
    }

    fn remove(&mut self, name: &str) {
        self.headers_mut()
            .retain(|h| !h.name.eq_ignore_ascii_case(name));
    }

    /// Whether a comma-separated field (`Connection`, `Upgrade`) lists `token`.
    fn has_token(&self, name: &str, token: &str) -> bool {
        self.get_all(name).any(|v| {
            v.split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
        })
    }
}

impl Headers for RequestHead {
    fn headers(&self) -> &[Header] {
        &self.headers
    }
    fn headers_mut(&mut self) -> &mut Vec<Header> {
        &mut self.headers
    }
}

impl Headers for ResponseHead {
    fn headers(&self) -> &[Header] {
        &self.headers
    }
    fn headers_mut(&mut self) -> &mut Vec<Header> {
        &mut self.headers
    }
}

impl RequestHead {
    /// How this request's body is delimited (checked when the head was parsed).
    pub fn body(&self) -> Result<Body, ParseError> {
        Ok(self.framing)
    }

    /// The canonical bytes of this head.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(self.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.target.as_bytes());
        out.extend_from_slice(if self.minor == 0 {
            b" HTTP/1.0\r\n"
        } else {
            b" HTTP/1.1\r\n"
        });
        write_headers(&mut out, &self.headers);
        out
    }
}

impl ResponseHead {
    /// How this response's body is delimited, given the request method (the shared rules:
    /// ambiguous framing is an error).
    pub fn body(&self, request_method: &str) -> Result<Body, ParseError> {
        let version = if self.minor == 0 {
            Version::Http10
        } else {
            Version::Http11
        };
        let method = request_method.to_ascii_uppercase();
        corral_http1::response_body_framing(self.status, version, &self.headers, &method)
            .map(Body::from)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(if self.minor == 0 {
            b"HTTP/1.0 "
        } else {
            b"HTTP/1.1 "
        });
        out.extend_from_slice(format!("{:03} ", self.status).as_bytes());
        out.extend_from_slice(&self.reason);
        out.extend_from_slice(b"\r\n");
        write_headers(&mut out, &self.headers);
        out
    }
}

fn write_headers(out: &mut Vec<u8>, headers: &[Header]) {
    for h in headers {
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(&h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// A simple error response with a text body; the connection closes after it.
pub fn error_response(status: u16, reason: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// [`parse_request`] or [`parse_response`].
pub type HeadParser<T> = fn(&[u8]) -> Result<Option<(T, usize)>, ParseError>;

/// A stream with a read buffer, for reading heads and relaying bodies.
pub struct Buffered<S> {
    pub io: S,
    pub buf: Vec<u8>,
}

fn invalid(msg: &'static str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg)
}

/// Errors reading a head.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("connection closed in the middle of a message head")]
    Truncated,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Buffered<S> {
    pub fn new(io: S) -> Self {
        Self {
            io,
            buf: Vec::with_capacity(8 * 1024),
        }
    }

    async fn fill(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.io.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// Read one head with `parse`; `Ok(None)` when the peer closed before sending a byte.
    pub async fn read_head<T>(&mut self, parse: HeadParser<T>) -> Result<Option<T>, HeadError> {
        loop {
            if let Some((head, used)) = parse(&self.buf)? {
                self.buf.drain(..used);
                return Ok(Some(head));
            }
            if self.fill().await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(HeadError::Truncated)
                };
            }
        }
    }

    async fn read_line(&mut self) -> std::io::Result<Vec<u8>> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                return Ok(self.buf.drain(..i + 2).collect());
            }
            if self.buf.len() > MAX_LINE {
                return Err(invalid("chunk line too long"));
            }
            if self.fill().await? == 0 {
                return Err(invalid("connection closed inside a chunked body"));
            }
        }
    }

    async fn relay_exact<W: AsyncWrite + Unpin>(
        &mut self,
        mut n: u64,
        out: &mut W,
    ) -> std::io::Result<()> {
        while n > 0 {
            if self.buf.is_empty() && self.fill().await? == 0 {
                return Err(invalid("connection closed inside a message body"));
            }
            let take = self.buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
            out.write_all(&self.buf[..take]).await?;
            self.buf.drain(..take);
            n -= take as u64;
        }
        Ok(())
    }

    /// Copy one message body, delimited by `body`, to `out`; returns the bytes copied.
    pub async fn relay_body<W: AsyncWrite + Unpin>(
        &mut self,
        body: Body,
        out: &mut W,
    ) -> std::io::Result<u64> {
        let total = match body {
            Body::None => 0,
            Body::Length(n) => {
                self.relay_exact(n, out).await?;
                n
            }
            Body::Chunked => {
                let mut total = 0u64;
                loop {
                    let line = self.read_line().await?;
                    let size = corral_http1::parse_chunk_size(&line[..line.len() - 2])
                        .map_err(|_| invalid("malformed chunk size"))?;
                    out.write_all(&line).await?;
                    total += line.len() as u64;
                    if size == 0 {
                        // Trailer fields, then the final blank line.
                        loop {
                            let t = self.read_line().await?;
                            out.write_all(&t).await?;
                            total += t.len() as u64;
                            if t == b"\r\n" {
                                break;
                            }
                        }
                        break;
                    }
                    self.relay_exact(size, out).await?;
                    let crlf = self.read_line().await?;
                    if crlf != b"\r\n" {
                        return Err(invalid("chunk data not followed by CRLF"));
                    }
                    out.write_all(b"\r\n").await?;
                    total += size + 2;
                }
                total
            }
            Body::UntilClose => {
                let mut total = self.buf.len() as u64;
                out.write_all(&self.buf).await?;
                self.buf.clear();
                total += tokio::io::copy(&mut self.io, out).await?;
                total
            }
        };
        out.flush().await?;
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(s: &str) -> Result<Option<(RequestHead, usize)>, ParseError> {
        parse_request(s.as_bytes())
    }

    #[test]
    fn parses_and_reserialises_canonically() {
        let raw = "POST /v1/messages HTTP/1.1\r\nHost: api.example.com\r\nx-api-key:  k  \r\nContent-Length: 3\r\n\r\nabc";
        let (h, used) = req(raw).unwrap().unwrap();
        assert_eq!(used, raw.len() - 3);
        assert_eq!(h.method, "POST");
        assert_eq!(h.get("X-API-KEY"), Some(&b"k"[..]));
        assert_eq!(h.body().unwrap(), Body::Length(3));
        assert_eq!(
            String::from_utf8(h.to_bytes()).unwrap(),
            "POST /v1/messages HTTP/1.1\r\nHost: api.example.com\r\nx-api-key: k\r\nContent-Length: 3\r\n\r\n"
        );
        assert_eq!(req("GET / HTTP/1.1\r\nHost: a").unwrap(), None);
    }

    #[test]
    fn rejects_smuggling_shapes() {
        let bad = [
            "GET / HTTP/1.1\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost : a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
            "GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
            "GET / HTTP/2.0\r\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n",
        ];
        for b in bad {
            assert!(req(b).is_err(), "{b:?} accepted");
        }
        let framing = [
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        ];
        for b in framing {
            // Rejected when the head is parsed (the shared parser checks framing there).
            let rejected = match req(b) {
                Err(_) => true,
                Ok(Some((h, _))) => h.body().is_err(),
                Ok(None) => false,
            };
            assert!(rejected, "{b:?} framing accepted");
        }
        let huge = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(req(&huge).unwrap_err(), ParseError::TooLarge);
    }

    #[test]
    fn response_framing() {
        let (r, _) = parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(r.body("GET").unwrap(), Body::Chunked);
        assert_eq!(r.body("HEAD").unwrap(), Body::None);
        let (r, _) = parse_response(b"HTTP/1.1 204 No Content\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(r.body("GET").unwrap(), Body::None);
        let (r, _) = parse_response(b"HTTP/1.0 200\r\n\r\n").unwrap().unwrap();
        assert_eq!(r.body("GET").unwrap(), Body::UntilClose);
    }

    #[tokio::test]
    async fn relays_chunked_bodies_verbatim() {
        let (a, mut b) = tokio::io::duplex(1 << 16);
        let body = b"4\r\nWiki\r\n5;x=y\r\npedia\r\n0\r\nT: v\r\n\r\nNEXT";
        b.write_all(body).await.unwrap();
        let mut r = Buffered::new(a);
        let mut out = Vec::new();
        let n = r.relay_body(Body::Chunked, &mut out).await.unwrap();
        assert_eq!(&out[..], &body[..body.len() - 4]);
        assert_eq!(n as usize, out.len());
        // Data past the body stays buffered for the next message.
        assert!(r.buf.starts_with(b"NEXT"));
    }
}
