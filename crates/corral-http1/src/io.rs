//! The one HTTP/1.1 connection layer of corral's proxy and credential gateway: a buffered
//! connection whose every read has a deadline, the body relay (one framing, one set of limits),
//! and the error responses both send.
//!
//! Bodies are decoded and re-encoded, never forwarded verbatim: a chunked body's sizes are
//! parsed (at most 16 hex digits, a chunk-size line of at most [`MAX_CHUNK_LINE`] bytes, CRLF
//! only) and re-declared in canonical lower-case hex; its trailer fields are parsed with the
//! header rules and dropped (never relayed: a trailer is where a lenient next hop would find a
//! smuggled request); a Content-Length body is copied exactly. A body error found while
//! streaming is returned as [`BodyError::Source`]: the caller drops the destination connection,
//! so the next hop never sees a complete message.

use std::io;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{Framing, MAX_CHUNK_LINE, MAX_HEAD_BYTES, ParseError, find_head_end, parse_chunk_size};

/// The deadlines of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Time a client has to send a complete request head once its first byte arrived
    /// (slow-loris bound; 408 after it).
    pub head: Duration,
    /// Time without a byte before a kept-alive connection, a body or a pending response is
    /// given up.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            head: Duration::from_secs(15),
            idle: Duration::from_secs(300),
        }
    }
}

/// A connection with its read buffer.
pub struct BufConn<S> {
    pub io: S,
    pub buf: BytesMut,
}

/// Why reading a message failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Parse(#[from] ParseError),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("timed out")]
    Timeout,
}

fn eof() -> ReadError {
    ReadError::Io(io::ErrorKind::UnexpectedEof.into())
}

impl<S: AsyncRead + Unpin> BufConn<S> {
    pub fn new(io: S) -> Self {
        BufConn {
            io,
            buf: BytesMut::with_capacity(8192),
        }
    }

    /// Read more bytes within `t`; `Ok(0)` at end of stream.
    pub async fn fill(&mut self, t: Duration) -> Result<usize, ReadError> {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(16 * 1024);
        }
        match tokio::time::timeout(t, self.io.read_buf(&mut self.buf)).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(ReadError::Timeout),
        }
    }

    /// A complete head; `Ok(None)` on a clean end of stream before its first byte. The first
    /// byte may take `first_byte` (keep-alive idle), the whole head at most `whole` from then.
    pub async fn read_head(
        &mut self,
        first_byte: Duration,
        whole: Duration,
    ) -> Result<Option<BytesMut>, ReadError> {
        if self.buf.is_empty() && self.fill(first_byte).await? == 0 {
            return Ok(None);
        }
        let deadline = Instant::now() + whole;
        loop {
            if let Some(end) = find_head_end(&self.buf)? {
                return Ok(Some(self.buf.split_to(end)));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ReadError::Timeout);
            }
            if self.fill(left).await? == 0 {
                return Err(eof());
            }
        }
    }

    /// One CRLF-terminated line (without the CRLF), at most `max` bytes.
    pub async fn read_line(&mut self, max: usize, t: Duration) -> Result<BytesMut, ReadError> {
        loop {
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                if nl == 0 || self.buf[nl - 1] != b'\r' {
                    return Err(ParseError::Malformed("bare LF in chunked body").into());
                }
                if nl - 1 > max {
                    return Err(ParseError::Malformed("chunk line too long").into());
                }
                let mut line = self.buf.split_to(nl + 1);
                line.truncate(nl - 1);
                if line.contains(&b'\r') {
                    return Err(ParseError::Malformed("bare CR in chunked body").into());
                }
                return Ok(line);
            }
            if self.buf.len() > max {
                return Err(ParseError::Malformed("chunk line too long").into());
            }
            if self.fill(t).await? == 0 {
                return Err(eof());
            }
        }
    }

    /// Exactly `n` bytes, each read within `t`.
    pub async fn read_exact_buf(&mut self, n: usize, t: Duration) -> Result<BytesMut, ReadError> {
        while self.buf.len() < n {
            if self.fill(t).await? == 0 {
                return Err(eof());
            }
        }
        Ok(self.buf.split_to(n))
    }
}

/// Why relaying a body failed.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The source sent a body that does not parse, or ended early, or was too slow.
    #[error("reading the body: {0}")]
    Source(ReadError),
    /// Writing to the destination failed.
    #[error("writing the body: {0}")]
    Dest(io::Error),
}

/// Replaces byte strings in a stream, a match split across reads included: bytes at the end of
/// what was fed that could begin a needle are held back until more data (or the end) shows
/// whether they do; everything else is passed on at once (a streamed answer is not delayed).
/// Used by the credential gateway to put placeholders back where a response reflects a real
/// value. Left-most match first; at one position the longest needle wins.
#[derive(Debug, Clone, Default)]
pub struct Replacer {
    /// (needle, replacement), longest needle first.
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    held: Vec<u8>,
}

impl Replacer {
    /// A replacer for `pairs` (empty needles are ignored).
    pub fn new(pairs: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>) -> Self {
        let mut r = Replacer::default();
        for (n, w) in pairs {
            r.add(n, w);
        }
        r
    }

    /// Add a pair (a needle already present keeps its first replacement).
    pub fn add(&mut self, needle: Vec<u8>, with: Vec<u8>) {
        if needle.is_empty() || self.pairs.iter().any(|(n, _)| *n == needle) {
            return;
        }
        self.pairs.push((needle, with));
        self.pairs.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
    }

    /// Whether every replacement has its needle's length (a body keeps its Content-Length).
    pub fn preserves_length(&self) -> bool {
        self.pairs.iter().all(|(n, w)| n.len() == w.len())
    }

    /// The same needles, each replacement cut or padded (with `*`) to its needle's length:
    /// for a stream whose framing cannot change (websocket frames after an upgrade).
    pub fn same_length(&self) -> Replacer {
        Replacer::new(self.pairs.iter().map(|(n, w)| {
            let mut w = w.clone();
            w.resize(n.len(), b'*');
            (n.clone(), w)
        }))
    }

    /// Replace in `data` (taken whole, nothing held back).
    pub fn replace_all(&self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len());
        let used = self.scan(data, true, &mut out);
        debug_assert_eq!(used, data.len());
        out
    }

    /// Replace in `data`, appending the output to `out`; unless `at_end`, stop before a tail
    /// that could still become a match. Returns how much of `data` was consumed.
    fn scan(&self, data: &[u8], at_end: bool, out: &mut Vec<u8>) -> usize {
        let mut i = 0;
        let mut run = 0;
        while i < data.len() {
            let rest = &data[i..];
            if !at_end
                && self
                    .pairs
                    .iter()
                    .any(|(n, _)| rest.len() < n.len() && n.starts_with(rest))
            {
                break;
            }
            match self.pairs.iter().find(|(n, _)| rest.starts_with(n)) {
                Some((n, w)) => {
                    out.extend_from_slice(&data[run..i]);
                    out.extend_from_slice(w);
                    i += n.len();
                    run = i;
                }
                None => i += 1,
            }
        }
        out.extend_from_slice(&data[run..i]);
        i
    }

    /// Feed stream bytes; the output that is certain is appended to `out`.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.pairs.is_empty() {
            out.extend_from_slice(data);
        } else if self.held.is_empty() {
            let used = self.scan(data, false, out);
            self.held.extend_from_slice(&data[used..]);
        } else {
            self.held.extend_from_slice(data);
            let held = std::mem::take(&mut self.held);
            let used = self.scan(&held, false, out);
            self.held = held[used..].to_vec();
        }
    }

    /// End of stream: the held-back bytes, replaced where they match.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let held = std::mem::take(&mut self.held);
        out.extend_from_slice(&self.replace_all(&held));
    }
}

/// Where the decoded body bytes go: straight to the destination, or through a [`Replacer`]
/// first; written raw or as chunks.
struct Sink<'a, B> {
    dst: &'a mut B,
    chunked: bool,
    replacer: Option<&'a mut Replacer>,
    scratch: Vec<u8>,
}

impl<B: AsyncWrite + Unpin> Sink<'_, B> {
    async fn write_out(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if self.chunked {
            self.dst
                .write_all(format!("{:x}\r\n", data.len()).as_bytes())
                .await?;
            self.dst.write_all(data).await?;
            self.dst.write_all(b"\r\n").await
        } else {
            self.dst.write_all(data).await
        }
    }

    async fn data(&mut self, data: &[u8]) -> io::Result<()> {
        match self.replacer.as_deref_mut() {
            None => self.write_out(data).await,
            Some(r) => {
                let mut out = std::mem::take(&mut self.scratch);
                out.clear();
                r.feed(data, &mut out);
                let res = self.write_out(&out).await;
                self.scratch = out;
                res
            }
        }
    }

    async fn end(&mut self) -> io::Result<()> {
        if let Some(r) = self.replacer.as_deref_mut() {
            let mut out = Vec::new();
            r.finish(&mut out);
            self.write_out(&out).await?;
        }
        if self.chunked {
            self.dst.write_all(b"0\r\n\r\n").await?;
        }
        self.dst.flush().await
    }
}

/// Copy one body, delimited by `from`, from `src` to `dst`, written as `to` says:
/// [`Framing::Chunked`] re-encodes it in chunks, anything else writes the data raw (the caller
/// declared its `Content-Length`, or the body runs until close). With `replacer` the data goes
/// through it first (a `Content-Length` then stays right only if it
/// [preserves length](Replacer::preserves_length)). Every read waits at most `t`. Returns the
/// body bytes read.
pub async fn relay_body<A, B>(
    src: &mut BufConn<A>,
    dst: &mut B,
    (from, to): (Framing, Framing),
    t: Duration,
    replacer: Option<&mut Replacer>,
) -> Result<u64, BodyError>
where
    A: AsyncRead + Unpin,
    B: AsyncWrite + Unpin,
{
    use BodyError::{Dest, Source};
    let mut sink = Sink {
        dst,
        chunked: to == Framing::Chunked,
        replacer,
        scratch: Vec::new(),
    };
    let mut total = 0u64;
    match from {
        Framing::None => {}
        Framing::Length(n) => total += copy_exact(src, &mut sink, n, t).await?,
        Framing::UntilClose => loop {
            if src.buf.is_empty() {
                match src.fill(t).await {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => return Err(Source(e)),
                }
            }
            let chunk = src.buf.split();
            total += chunk.len() as u64;
            sink.data(&chunk).await.map_err(Dest)?;
        },
        Framing::Chunked => {
            loop {
                let line = src.read_line(MAX_CHUNK_LINE, t).await.map_err(Source)?;
                let size = parse_chunk_size(&line).map_err(|e| Source(e.into()))?;
                if size == 0 {
                    break;
                }
                total += copy_exact(src, &mut sink, size, t).await?;
                let crlf = src.read_exact_buf(2, t).await.map_err(Source)?;
                if &crlf[..] != b"\r\n" {
                    return Err(Source(
                        ParseError::Malformed("chunk data not followed by CRLF").into(),
                    ));
                }
            }
            drop_trailers(src, t).await.map_err(Source)?;
        }
    }
    sink.end().await.map_err(Dest)?;
    Ok(total)
}

/// A chunked body's trailer section: each field parsed with the header rules, the section
/// bounded like a head, then dropped.
async fn drop_trailers<A: AsyncRead + Unpin>(
    src: &mut BufConn<A>,
    t: Duration,
) -> Result<(), ReadError> {
    let mut trailer_bytes = 0;
    loop {
        let line = src.read_line(MAX_HEAD_BYTES, t).await?;
        if line.is_empty() {
            return Ok(());
        }
        trailer_bytes += line.len();
        if trailer_bytes > MAX_HEAD_BYTES {
            return Err(ParseError::TooLarge.into());
        }
        crate::parse_header_line(&line)?;
    }
}

async fn copy_exact<A, B>(
    src: &mut BufConn<A>,
    sink: &mut Sink<'_, B>,
    mut n: u64,
    t: Duration,
) -> Result<u64, BodyError>
where
    A: AsyncRead + Unpin,
    B: AsyncWrite + Unpin,
{
    let want = n;
    while n > 0 {
        if src.buf.is_empty() {
            match src.fill(t).await {
                Ok(0) => return Err(BodyError::Source(eof())),
                Ok(_) => {}
                Err(e) => return Err(BodyError::Source(e)),
            }
        }
        let take = (src.buf.len() as u64).min(n) as usize;
        let chunk = src.buf.split_to(take);
        sink.data(&chunk).await.map_err(BodyError::Dest)?;
        n -= take as u64;
    }
    Ok(want)
}

/// The reason phrase corral's own responses use for `status`.
pub fn status_text(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// A complete error response with a text body, from corral (`X-Corral-Proxy: 1`); the
/// connection is closed after it.
pub fn error_response(status: u16, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nX-Corral-Proxy: 1\r\n\r\n{body}",
        status_text(status),
        body.len()
    )
    .into_bytes()
}

/// The status a client gets for a head that does not parse.
pub fn parse_error_status(e: &ParseError) -> u16 {
    match e {
        ParseError::TooLarge => 431,
        ParseError::Malformed(_) => 400,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(5);

    async fn relay(input: &[u8], from: Framing, to: Framing) -> Result<Vec<u8>, BodyError> {
        let (a, mut b) = tokio::io::duplex(1 << 16);
        b.write_all(input).await.unwrap();
        drop(b);
        let mut src = BufConn::new(a);
        let mut out = Vec::new();
        relay_body(&mut src, &mut out, (from, to), T, None).await?;
        Ok(out)
    }

    #[tokio::test]
    async fn chunked_is_reencoded_and_trailers_dropped() {
        let out = relay(
            b"4\r\nWiki\r\n0005;x=y\r\npedia\r\n0\r\nT: v\r\n\r\n",
            Framing::Chunked,
            Framing::Chunked,
        )
        .await
        .unwrap();
        assert_eq!(out, b"4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n");
        let raw = relay(
            b"4\r\nWiki\r\n0\r\n\r\n",
            Framing::Chunked,
            Framing::UntilClose,
        )
        .await
        .unwrap();
        assert_eq!(raw, b"Wiki");
    }

    #[tokio::test]
    async fn bad_chunked_bodies_are_refused() {
        for bad in [
            &b"4\nWiki\r\n0\r\n\r\n"[..],
            b"4\r\nWiki\r\n0\r\nX: a\nGET / HTTP/1.1\r\n\r\n",
            b"4\r\nWiki\r\n0\r\nnot a header\r\n\r\n",
            b"4\r\nWikiXX0\r\n\r\n",
            b"10000000000000004\r\nWiki\r\n0\r\n\r\n",
        ] {
            let r = relay(bad, Framing::Chunked, Framing::Chunked).await;
            assert!(
                matches!(r, Err(BodyError::Source(_))),
                "{:?}: {r:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = format!("1;{}\r\na\r\n0\r\n\r\n", "x".repeat(MAX_CHUNK_LINE));
        assert!(
            relay(long.as_bytes(), Framing::Chunked, Framing::Chunked)
                .await
                .is_err()
        );
    }

    #[test]
    fn replacer_across_every_split() {
        let r = Replacer::new([
            (b"SECRETvalue".to_vec(), b"PLACEHOLDR1".to_vec()),
            (b"U0VDUkVU".to_vec(), b"UExBQ0VI".to_vec()),
        ]);
        assert!(r.preserves_length());
        let input = b"a SECRETvalue b SECRETvalueSECRETvalue U0VDUkVU SECRETvalu";
        let want = r.replace_all(input);
        assert_eq!(
            want,
            b"a PLACEHOLDR1 b PLACEHOLDR1PLACEHOLDR1 UExBQ0VI SECRETvalu"
        );
        for cut1 in 0..input.len() {
            for cut2 in cut1..input.len() {
                let mut r = r.clone();
                let mut out = Vec::new();
                r.feed(&input[..cut1], &mut out);
                r.feed(&input[cut1..cut2], &mut out);
                r.feed(&input[cut2..], &mut out);
                r.finish(&mut out);
                assert_eq!(out, want, "cuts {cut1} {cut2}");
            }
        }
        // A tail that cannot begin a needle is not held back (a stream is not delayed); one
        // that can is, until the rest shows it is no match.
        let mut r = r.clone();
        let mut out = Vec::new();
        r.feed(b"data: {}\n\n", &mut out);
        assert_eq!(out, b"data: {}\n\n");
        r.feed(b"x SECRET", &mut out);
        assert_eq!(out, b"data: {}\n\nx ");
        r.feed(b"!", &mut out);
        assert_eq!(out, b"data: {}\n\nx SECRET!");
    }
}
