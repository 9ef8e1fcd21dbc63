//! Fuzz the gateway's and proxy's body relay (`corral_http1::io::relay_body`) and the
//! credential gateway's stream [`Replacer`].
//!
//! Input layout: byte 0 picks the source framing (bits 0-1: None, Length, Chunked, UntilClose)
//! and whether a replacer is used (bit 2); bytes 1-2 are a `Content-Length` (big-endian); byte 3
//! counts needle/replacement pairs (0..=3), each `len needle len replacement` (lengths mod 9);
//! then a count of read sizes and the sizes (the source hands its bytes over in those pieces,
//! which are also the split points fed to the replacer); the rest is the stream.
//!
//! Properties: nothing panics; the result does not depend on how the source's bytes arrive
//! (split reads give the same output, or the same failure, as one read); a `Length(n)` body is
//! the first `n` bytes (an error when fewer came), an until-close body is the whole stream, a
//! `None` body is empty; a chunked body re-encoded as chunks decodes back to the same bytes;
//! the count returned is the decoded length; with a replacer the output is `replace_all` of the
//! decoded body, and feeding the replacer any split of a stream equals `replace_all` of it.
#![no_main]

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use corral_http1::Framing;
use corral_http1::io::{BufConn, Replacer, relay_body};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, ReadBuf};

/// A source that hands its bytes over in the given pieces, then ends.
struct Pieces(VecDeque<Vec<u8>>);

impl AsyncRead for Pieces {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(mut p) = self.0.pop_front() {
            let n = p.len().min(buf.remaining());
            buf.put_slice(&p[..n]);
            if n < p.len() {
                self.0.push_front(p.split_off(n));
            }
        }
        Poll::Ready(Ok(()))
    }
}

fn pieces(data: &[u8], sizes: &[usize]) -> Pieces {
    let mut out = VecDeque::new();
    let mut rest = data;
    for &s in sizes {
        let s = s.min(rest.len());
        let (a, b) = rest.split_at(s);
        if !a.is_empty() {
            out.push_back(a.to_vec());
        }
        rest = b;
    }
    if !rest.is_empty() {
        out.push_back(rest.to_vec());
    }
    Pieces(out)
}

thread_local! {
    static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
}

/// Relay `data` (arriving in `sizes` pieces) framed as `from` to a buffer written as `to`:
/// the output and byte count, or `None` when the relay failed.
fn relay(
    data: &[u8],
    sizes: &[usize],
    from: Framing,
    to: Framing,
    replacer: Option<&Replacer>,
) -> Option<(Vec<u8>, u64)> {
    RT.with(|rt| {
        rt.block_on(async {
            let mut src = BufConn::new(pieces(data, sizes));
            let mut out = Vec::new();
            let mut r = replacer.cloned();
            let n = relay_body(
                &mut src,
                &mut out,
                (from, to),
                Duration::from_secs(60),
                r.as_mut(),
            )
            .await
            .ok()?;
            Some((out, n))
        })
    })
}

/// Take `n` bytes from the front of `data`.
fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if data.len() < n {
        return None;
    }
    let (a, b) = data.split_at(n);
    *data = b;
    Some(a)
}

fn replacer_splits(r: &Replacer, stream: &[u8], sizes: &[usize]) {
    let want = r.replace_all(stream);
    let mut fed = r.clone();
    let mut out = Vec::new();
    for p in pieces(stream, sizes).0 {
        fed.feed(&p, &mut out);
    }
    fed.finish(&mut out);
    assert_eq!(out, want, "a split stream is replaced differently");
    if r.preserves_length() {
        assert_eq!(want.len(), stream.len());
    }
    let same = r.same_length();
    assert!(same.preserves_length());
    assert_eq!(same.replace_all(stream).len(), stream.len());
}

fuzz_target!(|data: &[u8]| {
    let mut d = data;
    let Some(h) = take(&mut d, 4) else { return };
    let n = u16::from_be_bytes([h[1], h[2]]) as u64;
    let from = [
        Framing::None,
        Framing::Length(n),
        Framing::Chunked,
        Framing::UntilClose,
    ][(h[0] & 3) as usize];
    let mut pairs = Vec::new();
    for _ in 0..h[3] % 4 {
        let Some(l) = take(&mut d, 1) else { return };
        let Some(needle) = take(&mut d, (l[0] % 9) as usize) else {
            return;
        };
        let Some(l) = take(&mut d, 1) else { return };
        let Some(with) = take(&mut d, (l[0] % 9) as usize) else {
            return;
        };
        pairs.push((needle.to_vec(), with.to_vec()));
    }
    let replacer = (h[0] & 4 != 0).then(|| Replacer::new(pairs));
    let Some(count) = take(&mut d, 1) else { return };
    let Some(sizes) = take(&mut d, (count[0] % 16) as usize) else {
        return;
    };
    let sizes: Vec<usize> = sizes.iter().map(|&s| s as usize).collect();
    let stream = d;

    if let Some(r) = &replacer {
        replacer_splits(r, stream, &sizes);
    }

    // Decoded, in one read and in pieces: the same.
    let whole = relay(stream, &[], from, Framing::UntilClose, None);
    let split = relay(stream, &sizes, from, Framing::UntilClose, None);
    assert_eq!(whole, split, "split reads changed the body");
    match from {
        Framing::None => assert_eq!(whole, Some((Vec::new(), 0))),
        Framing::Length(n) => {
            let want = (stream.len() as u64 >= n).then(|| (stream[..n as usize].to_vec(), n));
            assert_eq!(whole, want);
        }
        Framing::UntilClose => {
            assert_eq!(whole, Some((stream.to_vec(), stream.len() as u64)));
        }
        Framing::Chunked => {}
    }
    let Some((body, count)) = whole else { return };
    assert_eq!(count, body.len() as u64);

    // Re-encoded as chunks (in pieces), it decodes back to the same body.
    let (chunked, c2) =
        relay(stream, &sizes, from, Framing::Chunked, None).expect("the same input relays");
    assert_eq!(c2, count);
    let back = relay(
        &chunked,
        &sizes,
        Framing::Chunked,
        Framing::UntilClose,
        None,
    );
    assert_eq!(back, Some((body.clone(), count)));

    // Through the replacer: replace_all of the decoded body, raw or chunked.
    if let Some(r) = &replacer {
        let want = r.replace_all(&body);
        let (raw, c3) = relay(stream, &sizes, from, Framing::UntilClose, Some(r))
            .expect("the same input relays");
        assert_eq!(c3, count);
        assert_eq!(raw, want, "the relay replaced differently");
        let (ch, _) =
            relay(stream, &sizes, from, Framing::Chunked, Some(r)).expect("the same input relays");
        let back = relay(&ch, &[], Framing::Chunked, Framing::UntilClose, None);
        assert_eq!(back.map(|(b, _)| b), Some(want));
    }
});
