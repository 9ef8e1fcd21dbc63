//! A small, strict HTTP/1.1 head parser and message-body relay.
//!
//! The gateway parses every request it forwards and re-serialises it in canonical form, so what
//! the upstream receives is exactly what was checked: CRLF line ends only, no obs-fold, no
//! whitespace before the colon, one `Host`, never both `Content-Length` and
//! `Transfer-Encoding`, `Transfer-Encoding` only as `chunked`, a bounded head size.
//!
//! Duplication note: corral-net's proxy parses request heads for the same reasons. When it
//! exposes its parser, the gateway should use that one (one parser, one set of smuggling rules);
//! until then this module is the gateway's own.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest request or response head accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header fields accepted in one head.
pub const MAX_HEADERS: usize = 128;
/// Longest chunk-size or trailer line.
const MAX_LINE: usize = 8 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("header section larger than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("more than {MAX_HEADERS} header fields")]
    TooManyHeaders,
    #[error("malformed {0}")]
    Malformed(&'static str),
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
}

impl ParseError {
    /// The status a client gets for this error.
    pub fn status(&self) -> u16 {
        match self {
            ParseError::TooLarge | ParseError::TooManyHeaders => 431,
            ParseError::Malformed(_) => 400,
            ParseError::Unsupported(_) => 501,
        }
    }
}

/// One header field, name as received (compared case-insensitively), value without OWS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: Vec<u8>,
}

/// A parsed request line and header fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub target: String,
    /// HTTP/1.`minor` (0 or 1).
    pub minor: u8,
    pub headers: Vec<Header>,
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

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_field_byte(b: u8) -> bool {
    b == b'\t' || (0x20..=0x7e).contains(&b) || b >= 0x80
}

/// Index just past the blank line ending a head, if the buffer holds one.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Split a head (without its final blank line) into CRLF lines; a bare CR or LF is an error.
fn lines(head: &[u8]) -> Result<Vec<&[u8]>, ParseError> {
    let body = &head[..head.len() - 4];
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        match rest.windows(2).position(|w| w == b"\r\n") {
            Some(i) => {
                out.push(&rest[..i]);
                rest = &rest[i + 2..];
            }
            None => {
                out.push(rest);
                break;
            }
        }
    }
    for l in &out {
        if l.contains(&b'\r') || l.contains(&b'\n') {
            return Err(ParseError::Malformed("line ending (bare CR or LF)"));
        }
    }
    Ok(out)
}

fn parse_headers(lines: &[&[u8]]) -> Result<Vec<Header>, ParseError> {
    if lines.len() > MAX_HEADERS {
        return Err(ParseError::TooManyHeaders);
    }
    let mut headers = Vec::with_capacity(lines.len());
    for line in lines {
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(ParseError::Malformed("header field (no colon)"))?;
        let name = &line[..colon];
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            // Covers obs-fold (leading whitespace) and whitespace before the colon.
            return Err(ParseError::Malformed("header field name"));
        }
        let value = &line[colon + 1..];
        if !value.iter().all(|&b| is_field_byte(b)) {
            return Err(ParseError::Malformed("header field value"));
        }
        let start = value
            .iter()
            .position(|&b| b != b' ' && b != b'\t')
            .unwrap_or(value.len());
        let end = value
            .iter()
            .rposition(|&b| b != b' ' && b != b'\t')
            .map_or(start, |i| i + 1);
        headers.push(Header {
            name: String::from_utf8(name.to_vec()).map_err(|_| ParseError::Malformed("name"))?,
            value: value[start..end].to_vec(),
        });
    }
    Ok(headers)
}

fn parse_version(v: &[u8]) -> Result<u8, ParseError> {
    match v {
        b"HTTP/1.1" => Ok(1),
        b"HTTP/1.0" => Ok(0),
        _ => Err(ParseError::Unsupported(
            "HTTP version other than 1.0 and 1.1",
        )),
    }
}

/// Parse a request head at the start of `buf`: `Ok(None)` while it is incomplete, else the head
/// and the number of bytes it used.
pub fn parse_request(buf: &[u8]) -> Result<Option<(RequestHead, usize)>, ParseError> {
    let Some(end) = head_end(buf) else {
        return if buf.len() > MAX_HEAD {
            Err(ParseError::TooLarge)
        } else {
            Ok(None)
        };
    };
    if end > MAX_HEAD {
        return Err(ParseError::TooLarge);
    }
    let lines = lines(&buf[..end])?;
    let mut parts = lines[0].split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(ParseError::Malformed("request line"));
    };
    if method.is_empty() || !method.iter().all(|&b| is_tchar(b)) {
        return Err(ParseError::Malformed("request method"));
    }
    if target.is_empty() || !target.iter().all(|&b| (0x21..=0x7e).contains(&b)) {
        return Err(ParseError::Malformed("request target"));
    }
    let minor = parse_version(version)?;
    let head = RequestHead {
        method: String::from_utf8(method.to_vec()).map_err(|_| ParseError::Malformed("method"))?,
        target: String::from_utf8(target.to_vec()).map_err(|_| ParseError::Malformed("target"))?,
        minor,
        headers: parse_headers(&lines[1..])?,
    };
    Ok(Some((head, end)))
}

/// Parse a response head at the start of `buf` (same contract as [`parse_request`]).
pub fn parse_response(buf: &[u8]) -> Result<Option<(ResponseHead, usize)>, ParseError> {
    let Some(end) = head_end(buf) else {
        return if buf.len() > MAX_HEAD {
            Err(ParseError::TooLarge)
        } else {
            Ok(None)
        };
    };
    if end > MAX_HEAD {
        return Err(ParseError::TooLarge);
    }
    let lines = lines(&buf[..end])?;
    let line = lines[0];
    if line.len() < 12 || line[8] != b' ' || (line.len() > 12 && line[12] != b' ') {
        return Err(ParseError::Malformed("status line"));
    }
    let minor = parse_version(&line[..8])?;
    let code = &line[9..12];
    if !code.iter().all(u8::is_ascii_digit) {
        return Err(ParseError::Malformed("status code"));
    }
    let status = code
        .iter()
        .fold(0u16, |acc, d| acc * 10 + u16::from(d - b'0'));
    let reason = if line.len() > 13 {
        line[13..].to_vec()
    } else {
        Vec::new()
    };
    if !reason.iter().all(|&b| is_field_byte(b)) {
        return Err(ParseError::Malformed("reason phrase"));
    }
    Ok(Some((
        ResponseHead {
            minor,
            status,
            reason,
            headers: parse_headers(&lines[1..])?,
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

fn content_length<H: Headers>(h: &H) -> Result<Option<u64>, ParseError> {
    let mut values = h.get_all("content-length");
    let Some(v) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ParseError::Malformed("Content-Length (repeated)"));
    }
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return Err(ParseError::Malformed("Content-Length"));
    }
    Ok(Some(
        v.iter().fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0')),
    ))
}

impl RequestHead {
    /// How this request's body is delimited; ambiguous framing is an error (no smuggling).
    pub fn body(&self) -> Result<Body, ParseError> {
        let te: Vec<&[u8]> = self.get_all("transfer-encoding").collect();
        let cl = content_length(self)?;
        if !te.is_empty() {
            if cl.is_some() {
                return Err(ParseError::Malformed(
                    "request with both Content-Length and Transfer-Encoding",
                ));
            }
            if self.minor == 0 {
                return Err(ParseError::Malformed("Transfer-Encoding in HTTP/1.0"));
            }
            if te.len() != 1 || !te[0].eq_ignore_ascii_case(b"chunked") {
                return Err(ParseError::Unsupported(
                    "Transfer-Encoding other than exactly `chunked`",
                ));
            }
            return Ok(Body::Chunked);
        }
        Ok(match cl {
            Some(0) | None => Body::None,
            Some(n) => Body::Length(n),
        })
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
    /// How this response's body is delimited, given the request method.
    pub fn body(&self, request_method: &str) -> Result<Body, ParseError> {
        if request_method.eq_ignore_ascii_case("HEAD")
            || (100..200).contains(&self.status)
            || self.status == 204
            || self.status == 304
        {
            return Ok(Body::None);
        }
        let te: Vec<&[u8]> = self.get_all("transfer-encoding").collect();
        if !te.is_empty() {
            let last = te
                .last()
                .and_then(|v| v.rsplit(|&b| b == b',').next())
                .map(|t| t.trim_ascii());
            return Ok(match last {
                Some(t) if t.eq_ignore_ascii_case(b"chunked") => Body::Chunked,
                _ => Body::UntilClose,
            });
        }
        Ok(match content_length(self)? {
            Some(0) => Body::None,
            Some(n) => Body::Length(n),
            None => Body::UntilClose,
        })
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
                    let digits = &line[..line.len() - 2];
                    let size_part = digits
                        .split(|&b| b == b';')
                        .next()
                        .unwrap_or_default()
                        .trim_ascii_end();
                    if size_part.is_empty()
                        || size_part.len() > 15
                        || !size_part.iter().all(u8::is_ascii_hexdigit)
                    {
                        return Err(invalid("malformed chunk size"));
                    }
                    let size = u64::from_str_radix(
                        std::str::from_utf8(size_part).map_err(|_| invalid("chunk size"))?,
                        16,
                    )
                    .map_err(|_| invalid("chunk size"))?;
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
            let (h, _) = req(b).unwrap().unwrap();
            assert!(h.body().is_err(), "{b:?} framing accepted");
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
