//! A strict HTTP/1.1 message-head parser and the framing rules corral's egress proxy
//! (corral-net, re-exported there as `corral_net::http`) and its credential gateway
//! (corral-gateway) both rely on: one parser, one set of smuggling rules; and in [`io`] the one
//! buffered connection, body relay, limits and timeouts both use.
//!
//! Everything ambiguous is an error: neither forwards a request it could not parse
//! exactly (request smuggling lives in the gap between two lenient parsers). Rejected: bare LF,
//! obs-fold, control characters (NUL, CR, DEL, ...) in names or values, whitespace before the
//! colon, more than one Content-Length (even equal ones), a Content-Length that is not plain
//! digits (`+3`, `0x10`, ` 1 2`), any Transfer-Encoding but exactly `chunked` (case-sensitive),
//! more than one Transfer-Encoding header, Content-Length together with Transfer-Encoding,
//! Transfer-Encoding on HTTP/1.0, chunk sizes beyond 16 hex digits.

pub mod exchange;
pub mod io;

/// The largest request or response head accepted (request line plus headers).
pub const MAX_HEAD_BYTES: usize = 32 * 1024;
/// The most header fields accepted in one head.
pub const MAX_HEADERS: usize = 128;
/// The longest chunk-size line accepted.
pub const MAX_CHUNK_LINE: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The head exceeds [`MAX_HEAD_BYTES`] or [`MAX_HEADERS`] (answered with 431).
    #[error("header section larger than {MAX_HEAD_BYTES} bytes or {MAX_HEADERS} fields")]
    TooLarge,
    /// Anything else (answered with 400).
    #[error("{0}")]
    Malformed(&'static str),
}

use ParseError::Malformed;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
}

impl Version {
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
    /// Responses only: the body runs until the origin closes.
    UntilClose,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// As sent (case kept); compare with `eq_ignore_ascii_case`.
    pub name: String,
    pub value: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub target: String,
    pub version: Version,
    pub headers: Vec<Header>,
    pub framing: Framing,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub version: Version,
    pub status: u16,
    pub reason: Vec<u8>,
    pub headers: Vec<Header>,
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_field_vchar(b: u8) -> bool {
    b == b'\t' || (0x20..=0x7e).contains(&b) || b >= 0x80
}

/// Where the head in `buf` ends (index just past the empty line), `Ok(None)` if more bytes are
/// needed. Leading empty lines (RFC 9112 section 2.2) are skipped. A line ending in a bare LF is
/// malformed; a head longer than [`MAX_HEAD_BYTES`] is [`ParseError::TooLarge`].
pub fn find_head_end(buf: &[u8]) -> Result<Option<usize>, ParseError> {
    let mut line_start = 0;
    let mut seen_line = false;
    let mut i = 0;
    while i < buf.len() {
        if buf[i] == b'\n' {
            if i == 0 || buf[i - 1] != b'\r' {
                return Err(Malformed("bare LF line ending"));
            }
            let empty = i - 1 == line_start;
            if empty && seen_line {
                return Ok(Some(i + 1));
            }
            if !empty {
                seen_line = true;
            }
            line_start = i + 1;
        }
        i += 1;
        if i > MAX_HEAD_BYTES {
            return Err(ParseError::TooLarge);
        }
    }
    Ok(None)
}

/// The head's lines, without CRLF, leading empty lines skipped; the final empty line excluded.
fn head_lines(head: &[u8]) -> Result<Vec<&[u8]>, ParseError> {
    let mut lines = Vec::new();
    let mut rest = head;
    while !rest.is_empty() {
        let nl = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or(Malformed("unterminated header line"))?;
        if nl == 0 || rest[nl - 1] != b'\r' {
            return Err(Malformed("bare LF line ending"));
        }
        let line = &rest[..nl - 1];
        rest = &rest[nl + 1..];
        if line.is_empty() {
            if lines.is_empty() {
                continue;
            }
            break;
        }
        if line.contains(&b'\r') {
            return Err(Malformed("bare CR in header section"));
        }
        lines.push(line);
    }
    if lines.is_empty() {
        return Err(Malformed("empty request"));
    }
    Ok(lines)
}

/// Parse one header field line.
pub fn parse_header_line(line: &[u8]) -> Result<Header, ParseError> {
    if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
        return Err(Malformed("obsolete line folding"));
    }
    let colon = line
        .iter()
        .position(|&b| b == b':')
        .ok_or(Malformed("header line without a colon"))?;
    let name = &line[..colon];
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        return Err(Malformed("invalid header name"));
    }
    let mut value = &line[colon + 1..];
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    if !value.iter().all(|&b| is_field_vchar(b)) {
        return Err(Malformed("control character in header value"));
    }
    Ok(Header {
        // tchars are ASCII.
        name: String::from_utf8_lossy(name).into_owned(),
        value: value.to_vec(),
    })
}

fn parse_headers(lines: &[&[u8]]) -> Result<Vec<Header>, ParseError> {
    if lines.len() > MAX_HEADERS {
        return Err(ParseError::TooLarge);
    }
    lines.iter().map(|l| parse_header_line(l)).collect()
}

fn parse_version(v: &[u8]) -> Result<Version, ParseError> {
    match v {
        b"HTTP/1.1" => Ok(Version::Http11),
        b"HTTP/1.0" => Ok(Version::Http10),
        _ => Err(Malformed("unsupported HTTP version")),
    }
}

/// All values of header `name`.
pub fn header_values<'a>(headers: &'a [Header], name: &str) -> impl Iterator<Item = &'a [u8]> {
    headers
        .iter()
        .filter(move |h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_slice())
}

/// The only value of header `name`: `Ok(None)` if absent, an error if repeated.
pub fn single_header<'a>(
    headers: &'a [Header],
    name: &str,
    err: &'static str,
) -> Result<Option<&'a [u8]>, ParseError> {
    let mut it = header_values(headers, name);
    let first = it.next();
    if it.next().is_some() {
        return Err(Malformed(err));
    }
    Ok(first)
}

/// `Content-Length`: 1 to 19 ASCII digits, nothing else.
pub fn parse_content_length(v: &[u8]) -> Result<u64, ParseError> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return Err(Malformed("invalid Content-Length"));
    }
    v.iter()
        .try_fold(0u64, |acc, &d| {
            acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })
        .ok_or(Malformed("invalid Content-Length"))
}

/// The framing headers of a message: at most one Content-Length, at most one Transfer-Encoding
/// which must be exactly `chunked`, never both.
fn declared_framing(headers: &[Header], version: Version) -> Result<Framing, ParseError> {
    let cl = single_header(headers, "content-length", "multiple Content-Length headers")?;
    let te = single_header(
        headers,
        "transfer-encoding",
        "multiple Transfer-Encoding headers",
    )?;
    match (cl, te) {
        (Some(_), Some(_)) => Err(Malformed("both Content-Length and Transfer-Encoding")),
        (None, Some(te)) => {
            if version == Version::Http10 {
                return Err(Malformed("Transfer-Encoding in an HTTP/1.0 message"));
            }
            if te != b"chunked" {
                return Err(Malformed("Transfer-Encoding other than exactly `chunked`"));
            }
            Ok(Framing::Chunked)
        }
        (Some(cl), None) => Ok(Framing::Length(parse_content_length(cl)?)),
        (None, None) => Ok(Framing::None),
    }
}

/// Parse a complete request head (as delimited by [`find_head_end`]).
pub fn parse_request_head(head: &[u8]) -> Result<RequestHead, ParseError> {
    if head.len() > MAX_HEAD_BYTES {
        return Err(ParseError::TooLarge);
    }
    let lines = head_lines(head)?;
    let mut parts = lines[0].split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Malformed("request line is not `METHOD TARGET VERSION`"));
    };
    if method.is_empty() || method.len() > 32 || !method.iter().all(|&b| is_tchar(b)) {
        return Err(Malformed("invalid method"));
    }
    if target.is_empty() || !target.iter().all(|&b| (0x21..=0x7e).contains(&b)) {
        return Err(Malformed("invalid request target"));
    }
    let version = parse_version(version)?;
    let headers = parse_headers(&lines[1..])?;
    let framing = declared_framing(&headers, version)?;
    Ok(RequestHead {
        method: String::from_utf8_lossy(method).into_owned(),
        target: String::from_utf8_lossy(target).into_owned(),
        version,
        headers,
        framing,
    })
}

/// Parse a complete response head.
pub fn parse_response_head(head: &[u8]) -> Result<ResponseHead, ParseError> {
    if head.len() > MAX_HEAD_BYTES {
        return Err(ParseError::TooLarge);
    }
    let lines = head_lines(head)?;
    let line = lines[0];
    if line.len() < 12 || line[8] != b' ' || (line.len() > 12 && line[12] != b' ') {
        return Err(Malformed("invalid status line"));
    }
    let version = parse_version(&line[..8])?;
    let code = &line[9..12];
    if !code.iter().all(u8::is_ascii_digit) || code[0] == b'0' {
        return Err(Malformed("invalid status code"));
    }
    let status = code
        .iter()
        .fold(0u16, |acc, &d| acc * 10 + u16::from(d - b'0'));
    let reason = line.get(13..).unwrap_or_default();
    if !reason.iter().all(|&b| is_field_vchar(b)) {
        return Err(Malformed("control character in reason phrase"));
    }
    let headers = parse_headers(&lines[1..])?;
    Ok(ResponseHead {
        version,
        status,
        reason: reason.to_vec(),
        headers,
    })
}

/// The body framing of a response to a request with `method`.
pub fn response_framing(resp: &ResponseHead, method: &str) -> Result<Framing, ParseError> {
    response_body_framing(resp.status, resp.version, &resp.headers, method)
}

/// [`response_framing`] from the parts of a response head.
pub fn response_body_framing(
    status: u16,
    version: Version,
    headers: &[Header],
    method: &str,
) -> Result<Framing, ParseError> {
    if method == "HEAD" || status < 200 || status == 204 || status == 304 {
        return Ok(Framing::None);
    }
    match declared_framing(headers, version)? {
        Framing::None => Ok(Framing::UntilClose),
        f => Ok(f),
    }
}

/// Parse a chunk-size line (without its CRLF): 1 to 16 hex digits, optionally followed by
/// `;extension` made of visible characters. Returns the size.
pub fn parse_chunk_size(line: &[u8]) -> Result<u64, ParseError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(Malformed("invalid chunk size"));
    }
    if digits > 16 {
        return Err(Malformed("chunk size overflow"));
    }
    let rest = &line[digits..];
    if !rest.is_empty()
        && (rest[0] != b';'
            || !rest
                .iter()
                .all(|&b| b == b'\t' || (0x20..=0x7e).contains(&b)))
    {
        return Err(Malformed("invalid chunk extension"));
    }
    let mut size = 0u64;
    for &d in &line[..digits] {
        let v = (d as char).to_digit(16).unwrap_or(0);
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(u64::from(v)))
            .ok_or(Malformed("chunk size overflow"))?;
    }
    Ok(size)
}

/// Tokens named in the Connection headers, lower case.
pub fn connection_tokens(headers: &[Header]) -> Vec<String> {
    header_values(headers, "connection")
        .flat_map(|v| v.split(|&b| b == b','))
        .map(|t| String::from_utf8_lossy(t).trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}

/// Headers the proxy never forwards: hop-by-hop ones, the framing it re-adds itself, and the
/// proxy's own credentials.
const STRIPPED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
    "expect",
];

/// The end-to-end headers of a message: `headers` minus [`STRIPPED`] and every header named
/// in a Connection header.
pub fn end_to_end(headers: &[Header]) -> impl Iterator<Item = &Header> {
    let named = connection_tokens(headers);
    headers.iter().filter(move |h| {
        let n = h.name.to_ascii_lowercase();
        !STRIPPED.contains(&n.as_str()) && !named.contains(&n)
    })
}

fn push_framing(out: &mut Vec<u8>, framing: Framing) {
    match framing {
        Framing::None | Framing::UntilClose => {}
        Framing::Length(n) => out.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes()),
        Framing::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
    }
}

fn push_headers<'a>(out: &mut Vec<u8>, headers: impl Iterator<Item = &'a Header>) {
    for h in headers {
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(&h.value);
        out.extend_from_slice(b"\r\n");
    }
}

impl RequestHead {
    /// This head in canonical form: every field as parsed (names as sent, values trimmed),
    /// CRLF line ends, nothing added or dropped.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(self.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.target.as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.version.as_str().as_bytes());
        out.extend_from_slice(b"\r\n");
        push_headers(&mut out, self.headers.iter());
        out.extend_from_slice(b"\r\n");
        out
    }
}

impl ResponseHead {
    /// This head in canonical form (see [`RequestHead::to_bytes`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(self.version.as_str().as_bytes());
        out.extend_from_slice(format!(" {:03} ", self.status).as_bytes());
        out.extend_from_slice(&self.reason);
        out.extend_from_slice(b"\r\n");
        push_headers(&mut out, self.headers.iter());
        out.extend_from_slice(b"\r\n");
        out
    }
}

/// The request as the proxy forwards it: origin-form, Host from the checked authority,
/// end-to-end headers only, framing re-declared from the parsed form.
pub fn serialize_request(
    method: &str,
    path: &str,
    host_header: &str,
    headers: &[Header],
    framing: Framing,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(
        format!("{method} {path} HTTP/1.1\r\nHost: {host_header}\r\n").as_bytes(),
    );
    push_headers(&mut out, end_to_end(headers));
    if method != "GET" && method != "HEAD" && framing == Framing::None {
        out.extend_from_slice(b"Content-Length: 0\r\n");
    }
    push_framing(&mut out, framing);
    out.extend_from_slice(b"\r\n");
    out
}

/// The response as the proxy relays it to the client.
pub fn serialize_response(resp: &ResponseHead, framing: Framing, close: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(format!("HTTP/1.1 {} ", resp.status).as_bytes());
    out.extend_from_slice(&resp.reason);
    out.extend_from_slice(b"\r\n");
    push_headers(&mut out, end_to_end(&resp.headers));
    push_framing(&mut out, framing);
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(s: &str) -> Result<RequestHead, ParseError> {
        let b = s.as_bytes();
        let end = find_head_end(b)?.expect("complete head");
        parse_request_head(&b[..end])
    }

    #[test]
    fn parses_absolute_form_get() {
        let r = req("GET http://example.org/a?b HTTP/1.1\r\nHost: example.org\r\nX: y \r\n\r\n")
            .unwrap();
        assert_eq!(
            r,
            RequestHead {
                method: "GET".into(),
                target: "http://example.org/a?b".into(),
                version: Version::Http11,
                headers: vec![
                    Header {
                        name: "Host".into(),
                        value: b"example.org".to_vec()
                    },
                    Header {
                        name: "X".into(),
                        value: b"y".to_vec()
                    },
                ],
                framing: Framing::None,
            }
        );
    }

    #[test]
    fn incomplete_head_waits() {
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\nHost: a\r\n"), Ok(None));
        assert_eq!(
            find_head_end(b"\r\n\r\nGET / HTTP/1.1\r\n\r\n"),
            Ok(Some(22))
        );
    }

    #[test]
    fn rejects_smuggling_forms() {
        let cases = [
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                "both",
            ),
            (
                "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n",
                "exactly",
            ),
            (
                "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
                "exactly",
            ),
            (
                "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                "exactly",
            ),
            (
                "POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                "multiple Transfer",
            ),
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
                "multiple Content",
            ),
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                "multiple Content",
            ),
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: +3\r\n\r\n",
                "invalid Content-Length",
            ),
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\n",
                "invalid Content-Length",
            ),
            (
                "POST http://a/ HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
                "invalid Content-Length",
            ),
            (
                "POST http://a/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                "HTTP/1.0",
            ),
            ("GET http://a/ HTTP/1.1\r\nX: a\r\n b\r\n\r\n", "folding"),
            ("GET http://a/ HTTP/1.1\r\nX : a\r\n\r\n", "header name"),
            ("GET http://a/ HTTP/1.1\r\nX: a\0b\r\n\r\n", "control"),
            ("GET http://a/ HTTP/1.1\r\nX: a\rb\r\n\r\n", "bare CR"),
            ("GET http://a/ HTTP/1.1\r\nX\0: a\r\n\r\n", "header name"),
            ("GET http://a/  HTTP/1.1\r\n\r\n", "request line"),
            ("GET http://a/ HTTP/1.2\r\n\r\n", "version"),
            ("G(T http://a/ HTTP/1.1\r\n\r\n", "method"),
        ];
        for (raw, want) in cases {
            match req(raw) {
                Err(Malformed(m)) => assert!(m.contains(want), "{raw:?}: got {m:?}, want {want:?}"),
                other => panic!("{raw:?} should be rejected, got {other:?}"),
            }
        }
    }

    #[test]
    fn bare_lf_is_rejected_early() {
        assert_eq!(
            find_head_end(b"GET http://a/ HTTP/1.1\nHost: a\n\n"),
            Err(Malformed("bare LF line ending"))
        );
    }

    #[test]
    fn oversized_head_is_too_large() {
        let mut raw = b"GET http://a/ HTTP/1.1\r\n".to_vec();
        while raw.len() <= MAX_HEAD_BYTES {
            raw.extend_from_slice(b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        assert_eq!(find_head_end(&raw), Err(ParseError::TooLarge));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("H{i}: v\r\n")).collect();
        assert_eq!(
            req(&format!("GET http://a/ HTTP/1.1\r\n{many}\r\n")),
            Err(ParseError::TooLarge)
        );
    }

    #[test]
    fn framing_of_valid_bodies() {
        assert_eq!(
            req("POST http://a/ HTTP/1.1\r\nContent-Length: 0012\r\n\r\n")
                .unwrap()
                .framing,
            Framing::Length(12)
        );
        assert_eq!(
            req("POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
                .unwrap()
                .framing,
            Framing::Chunked
        );
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(parse_chunk_size(b"1a"), Ok(26));
        assert_eq!(parse_chunk_size(b"0"), Ok(0));
        assert_eq!(parse_chunk_size(b"ffffffffffffffff"), Ok(u64::MAX));
        assert_eq!(parse_chunk_size(b"a;name=value"), Ok(10));
        assert_eq!(
            parse_chunk_size(b"1ffffffffffffffff"),
            Err(Malformed("chunk size overflow"))
        );
        assert_eq!(parse_chunk_size(b""), Err(Malformed("invalid chunk size")));
        assert_eq!(
            parse_chunk_size(b"-1"),
            Err(Malformed("invalid chunk size"))
        );
        assert_eq!(
            parse_chunk_size(b"0x10"),
            Err(Malformed("invalid chunk extension"))
        );
        assert_eq!(
            parse_chunk_size(b"10 "),
            Err(Malformed("invalid chunk extension"))
        );
    }

    #[test]
    fn forwarded_request_drops_hop_by_hop_and_named_headers() {
        let r = req("POST http://a.example/x HTTP/1.1\r\nHost: a.example\r\nConnection: keep-alive, X-Secret, connection\r\nX-Secret: s\r\nProxy-Authorization: Basic Zm9v\r\nKeep-Alive: 5\r\nTE: trailers\r\nAccept: */*\r\nContent-Length: 2\r\n\r\n").unwrap();
        let out = serialize_request("POST", "/x", "a.example", &r.headers, r.framing);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "POST /x HTTP/1.1\r\nHost: a.example\r\nAccept: */*\r\nContent-Length: 2\r\n\r\n"
        );
    }

    #[test]
    fn responses() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
        let r = parse_response_head(raw).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(response_framing(&r, "GET"), Ok(Framing::Chunked));
        assert_eq!(response_framing(&r, "HEAD"), Ok(Framing::None));
        let r = parse_response_head(b"HTTP/1.0 204 \r\n\r\n").unwrap();
        assert_eq!(response_framing(&r, "GET"), Ok(Framing::None));
        let r = parse_response_head(b"HTTP/1.1 200\r\n\r\n").unwrap();
        assert_eq!(response_framing(&r, "GET"), Ok(Framing::UntilClose));
        assert!(parse_response_head(b"HTTP/1.1 20 OK\r\n\r\n").is_err());
    }
}
