//! The one request loop of corral's HTTP/1 forwarding, run by both the egress proxy's
//! plain-HTTP path and the credential gateway's TLS-terminated path.
//!
//! [`serve_requests`] reads request heads from the client (every head counted in the caller's
//! [`Budget`], every read under its [`Timeouts`]), answers the ones that cannot be read with
//! one set of statuses ([`HeadRefusal`]), and hands each parsed request to the caller's
//! [`Requests::request`]: the step that decides the request and rewrites its head (the proxy's
//! policy decision; the gateway's check, credential swap and `Accept-Encoding: identity`).
//! The caller then runs [`exchange`]: the head written upstream, the body relayed, interim
//! responses relayed, the final response's framing decided, its head and body relayed (through
//! the caller's [`Replacer`], if any, which scrubs them), and whether either side closes.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::io::{BodyError, Budget, BufConn, ReadError, Replacer, Timeouts, relay_body};
use crate::{
    Framing, Header, MAX_HEAD_BYTES, ParseError, RequestHead, ResponseHead, Version,
    connection_tokens, header_values, parse_request_head, parse_response_head, response_framing,
    serialize_response,
};

/// A request head that could not be read or parsed: what the client is answered before the
/// connection closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadRefusal {
    pub status: u16,
    /// Why, without a prefix (each caller says who answers).
    pub why: String,
    /// The head was refused because the budget for partial heads is spent (the proxy counts
    /// these for its end-of-run summary).
    pub over_budget: bool,
}

/// What the loop does after one request.
pub enum Flow<T> {
    /// Read the next request.
    Continue,
    /// Close the connection (the caller has answered, or the exchange said so).
    Close,
    /// End the loop and give the connection to the caller (a CONNECT, an upgrade).
    Handoff(T),
}

/// The per-request steps of a [`serve_requests`] loop.
pub trait Requests<C>: Send {
    /// What a request can hand back besides continuing or closing.
    type Handoff: Send;

    /// Answer a head that could not be read (the connection closes afterwards).
    fn refuse_head(
        &mut self,
        client: &mut BufConn<C>,
        refusal: HeadRefusal,
    ) -> impl Future<Output = ()> + Send;

    /// Decide, rewrite and forward one request (usually through [`exchange`]).
    fn request(
        &mut self,
        client: &mut BufConn<C>,
        req: RequestHead,
    ) -> impl Future<Output = Flow<Self::Handoff>> + Send;
}

/// Serve requests on `client` until it closes, goes idle for `t.idle`, a request closes it, or
/// one is handed off (returned). The first head may take `t.head` to start; a head, once
/// started, must be complete within `t.head`. Every head is counted in `budget` while it is read.
pub async fn serve_requests<C, R>(
    client: &mut BufConn<C>,
    steps: &mut R,
    t: Timeouts,
    budget: &Budget,
) -> Option<R::Handoff>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    R: Requests<C>,
{
    let mut first_wait = t.head;
    loop {
        let req = match next_request(client, first_wait, t.head, budget).await {
            Ok(Some(req)) => req,
            Ok(None) => return None,
            Err(refusal) => {
                steps.refuse_head(client, refusal).await;
                return None;
            }
        };
        first_wait = t.idle;
        match steps.request(client, req).await {
            Flow::Continue => continue,
            Flow::Close => return None,
            Flow::Handoff(h) => return Some(h),
        }
    }
}

/// The next request head, parsed: `Ok(None)` when the client closed, or went idle between
/// requests (closed quietly).
async fn next_request<C>(
    client: &mut BufConn<C>,
    first_byte: Duration,
    whole: Duration,
    budget: &Budget,
) -> Result<Option<RequestHead>, HeadRefusal>
where
    C: AsyncRead + Unpin,
{
    let refuse = |status, why: String| HeadRefusal {
        status,
        why,
        over_budget: false,
    };
    let head = match client.read_head_within(first_byte, whole, budget).await {
        Ok(Some(h)) => h,
        Ok(None) | Err(ReadError::Io(_)) => return Ok(None),
        Err(ReadError::Timeout) if client.buf.is_empty() => return Ok(None),
        Err(ReadError::Timeout) => {
            return Err(refuse(408, "request head not received in time".into()));
        }
        Err(ReadError::Parse(ParseError::TooLarge)) => {
            let why = format!("request header section exceeds {MAX_HEAD_BYTES} bytes");
            return Err(refuse(431, why));
        }
        Err(ReadError::Parse(e)) => return Err(refuse(400, format!("malformed request: {e}"))),
        Err(ReadError::Budget) => {
            return Err(HeadRefusal {
                status: 503,
                why: "too many partial request heads from this jail; try again".into(),
                over_budget: true,
            });
        }
    };
    match parse_request_head(&head) {
        Ok(r) => Ok(Some(r)),
        Err(ParseError::TooLarge) => Err(refuse(431, "too many header fields".into())),
        Err(e) => Err(refuse(400, format!("malformed request: {e}"))),
    }
}

/// One request as it goes upstream, and the limits of its exchange.
pub struct Outgoing<'a> {
    /// The head as it is sent (the caller serialized its rewritten request).
    pub head: &'a [u8],
    /// The method, for the response's framing (`HEAD`).
    pub method: &'a str,
    /// The request body's framing.
    pub framing: Framing,
    /// The client's HTTP version (interim responses only to 1.1; a body re-framed for 1.0).
    pub version: Version,
    /// Answer `100 Continue` before relaying the body.
    pub expect_continue: bool,
    /// The client asked to close after this exchange.
    pub client_close: bool,
    /// The request asks for a protocol upgrade that the caller forwards: a `101` ends the
    /// exchange with [`Done::Upgraded`]. Otherwise a `101` is an invalid response.
    pub upgrade: bool,
    /// Longest wait for a byte from either side.
    pub idle: Duration,
    /// Response heads are counted here while read.
    pub budget: &'a Budget,
}

/// Bytes moved by exchanges: heads and bodies, as read from each side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    pub up: u64,
    pub down: u64,
}

/// How an exchange ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// The response was relayed. `origin_close`: the upstream connection cannot be used
    /// again; `close`: the client connection closes (the response said `Connection: close`).
    Replied { origin_close: bool, close: bool },
    /// The `101` was relayed: the connection now carries another protocol.
    Upgraded,
}

/// Why an exchange failed. In every case the upstream connection must be dropped (the origin
/// may hold an incomplete request).
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The client's body is malformed, ended early or was too slow.
    #[error("reading the request body: {0}")]
    RequestBody(ReadError),
    /// Writing the request upstream failed.
    #[error("sending the request: {0}")]
    Send(io::Error),
    /// The origin sent no valid response (closed, timed out, malformed).
    #[error("no valid response: {0}")]
    Response(String),
    /// The origin switched protocols where no upgrade is forwarded.
    #[error("protocol upgrades are not forwarded")]
    Upgrade,
    /// The response cannot be relayed as the caller requires (a compressed body that must be
    /// scrubbed).
    #[error("{0}")]
    Refused(String),
    /// The client went away while being answered.
    #[error("writing to the client: {0}")]
    Client(io::Error),
    /// The response body failed midway: the client has a truncated response.
    #[error("relaying the response body: {0}")]
    ResponseBody(BodyError),
}

impl ExchangeError {
    /// The status and text the client is answered, `upstream` naming the origin; `None` when
    /// it cannot be answered (gone, or its response already started).
    pub fn answer(&self, upstream: &str) -> Option<(u16, String)> {
        match self {
            ExchangeError::RequestBody(ReadError::Timeout) => {
                Some((408, "request body not received in time".into()))
            }
            ExchangeError::RequestBody(ReadError::Parse(e)) => {
                Some((400, format!("malformed request body: {e}")))
            }
            ExchangeError::RequestBody(_) | ExchangeError::Client(_) => None,
            ExchangeError::ResponseBody(_) => None,
            ExchangeError::Send(e) => {
                Some((502, format!("sending the request to {upstream}: {e}")))
            }
            ExchangeError::Response(why) => {
                Some((502, format!("no valid response from {upstream}: {why}")))
            }
            ExchangeError::Upgrade => Some((502, self.to_string())),
            ExchangeError::Refused(why) => Some((502, format!("response from {upstream}: {why}"))),
        }
    }
}

/// Send `out` upstream on `up` (calling `sent` once its head is written: the moment a rewritten
/// credential really left), relay its body from `client`, then the response back: interim
/// `1xx` heads to HTTP/1.1 clients, the final head and body through `scrub` if given (a
/// compressed body is then refused: it could not be scrubbed), re-framed where scrubbing may
/// change the length or the client speaks HTTP/1.0.
pub async fn exchange<C, U>(
    client: &mut BufConn<C>,
    up: &mut BufConn<U>,
    out: Outgoing<'_>,
    scrub: Option<&mut Replacer>,
    sent: impl FnOnce() + Send,
    moved: &mut Moved,
) -> Result<Done, ExchangeError>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
{
    use ExchangeError as E;
    if out.expect_continue && out.framing != Framing::None {
        let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
        client.io.write_all(interim).await.map_err(E::Client)?;
    }
    up.io.write_all(out.head).await.map_err(E::Send)?;
    moved.up += out.head.len() as u64;
    sent();
    let both = (out.framing, out.framing);
    match relay_body(client, &mut up.io, both, out.idle, None).await {
        Ok(n) => moved.up += n,
        Err(BodyError::Source(e)) => return Err(E::RequestBody(e)),
        Err(BodyError::Dest(e)) => return Err(E::Send(e)),
    }
    let mut resp = final_response(client, up, &out, scrub.as_deref(), moved).await?;
    if resp.status == 101 {
        if let Some(s) = scrub.as_deref() {
            scrub_head(&mut resp, s);
        }
        // The upgrade's own hop-by-hop fields (Connection, Upgrade) go through as sent.
        let b = resp.to_bytes();
        client.io.write_all(&b).await.map_err(E::Client)?;
        return Ok(Done::Upgraded);
    }
    let framing = response_framing(&resp, &out.method.to_ascii_uppercase())
        .map_err(|e| E::Response(format!("invalid response framing: {e}")))?;
    if let Some(s) = scrub.as_deref() {
        scrub_response_head(&mut resp, framing, s).map_err(E::Refused)?;
    }
    let origin_close = framing == Framing::UntilClose
        || resp.version == Version::Http10
        || connection_tokens(&resp.headers)
            .iter()
            .any(|t| t == "close");
    let close = out.client_close || origin_close;
    let keeps_length = scrub.as_ref().is_none_or(|s| s.preserves_length());
    let to_client = client_framing(framing, out.version, keeps_length);
    let mut head = serialize_response(&resp, to_client, close);
    // A small body already read with its head goes out in the same write: one syscall and
    // one segment per small response instead of two.
    if let (Framing::Length(n), None) = (framing, &scrub)
        && up.buf.len() as u64 >= n
        && to_client == framing
    {
        head.extend_from_slice(&up.buf.split_to(n as usize));
        client.io.write_all(&head).await.map_err(E::Client)?;
        client.io.flush().await.map_err(E::Client)?;
        moved.down += n;
        return Ok(Done::Replied {
            origin_close,
            close,
        });
    }
    client.io.write_all(&head).await.map_err(E::Client)?;
    let both = (framing, to_client);
    let n = relay_body(up, &mut client.io, both, out.idle, scrub)
        .await
        .map_err(E::ResponseBody)?;
    moved.down += n;
    Ok(Done::Replied {
        origin_close,
        close,
    })
}

/// The final response head: interim `1xx` heads (scrubbed) are relayed to HTTP/1.1 clients
/// and dropped for HTTP/1.0 ones. A `101` is returned only when `out.upgrade`.
async fn final_response<C, U>(
    client: &mut BufConn<C>,
    up: &mut BufConn<U>,
    out: &Outgoing<'_>,
    scrub: Option<&Replacer>,
    moved: &mut Moved,
) -> Result<ResponseHead, ExchangeError>
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
{
    use ExchangeError as E;
    loop {
        let head = match up.read_head_within(out.idle, out.idle, out.budget).await {
            Ok(Some(h)) => h,
            Ok(None) => return Err(E::Response("closed the connection".into())),
            Err(ReadError::Timeout) => return Err(E::Response("timed out".into())),
            Err(e) => return Err(E::Response(e.to_string())),
        };
        moved.down += head.len() as u64;
        let mut r = parse_response_head(&head)
            .map_err(|e| E::Response(format!("invalid response: {e}")))?;
        match r.status {
            101 if out.upgrade => return Ok(r),
            101 => return Err(E::Upgrade),
            0..=99 => return Err(E::Response(format!("invalid status {}", r.status))),
            100..=199 => {}
            _ => return Ok(r),
        }
        if out.version == Version::Http11 {
            if let Some(s) = scrub {
                scrub_head(&mut r, s);
            }
            let b = serialize_response(&r, Framing::None, false);
            client.io.write_all(&b).await.map_err(E::Client)?;
        }
    }
}

/// How a body read with `framing` goes to a client of `version`: a chunked body to HTTP/1.0
/// runs until close; a Content-Length body whose scrubbing may change its length (not
/// `keeps_length`) is chunked for HTTP/1.1, until close for HTTP/1.0.
pub fn client_framing(framing: Framing, version: Version, keeps_length: bool) -> Framing {
    match (framing, version) {
        (Framing::Chunked, Version::Http10) => Framing::UntilClose,
        (Framing::Length(_), Version::Http11) if !keeps_length => Framing::Chunked,
        (Framing::Length(_), Version::Http10) if !keeps_length => Framing::UntilClose,
        (f, _) => f,
    }
}

/// Ask for an answer that can be scrubbed: whole and uncompressed. `Accept-Encoding: identity`
/// (compressed bytes cannot be scrubbed), and no `Range` or `If-Range` (a reflected value
/// fetched in pieces would reach the client in parts, none of which the whole-value scrubber
/// recognises).
pub fn identity_only(headers: &mut Vec<Header>) {
    headers.retain(|h| {
        !(h.name.eq_ignore_ascii_case("accept-encoding")
            || h.name.eq_ignore_ascii_case("range")
            || h.name.eq_ignore_ascii_case("if-range"))
    });
    headers.push(Header {
        name: "accept-encoding".into(),
        value: b"identity".to_vec(),
    });
}

/// Scrub an answer's head; refuse (the reason) a body that is compressed anyway.
pub fn scrub_response_head(
    resp: &mut ResponseHead,
    framing: Framing,
    scrub: &Replacer,
) -> Result<(), String> {
    if framing != Framing::None && encoded(resp) {
        return Err("the origin sent a compressed response although the gateway asked for identity; it cannot be checked for reflected credentials".into());
    }
    scrub_head(resp, scrub);
    Ok(())
}

/// Whether the response body carries a content coding other than `identity`.
fn encoded(resp: &ResponseHead) -> bool {
    header_values(&resp.headers, "content-encoding").any(|v| {
        v.split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
            .any(|t| !t.is_empty() && !t.eq_ignore_ascii_case(b"identity"))
    })
}

/// Replace real values in the status line and every header value.
pub fn scrub_head(resp: &mut ResponseHead, scrub: &Replacer) {
    resp.reason = scrub.replace_all(&resp.reason);
    for h in &mut resp.headers {
        h.value = scrub.replace_all(&h.value);
    }
}
