//! A sign-in's token endpoint inside an intercepted connection: the refresh request's body and
//! the token response are read whole (bounded by [`MAX_SIGNIN_BYTES`]), the placeholder refresh
//! token swapped for the real one on the way up, the new real tokens taken out of the answer on
//! the way down (the jail gets new placeholders) and written back to the user's file. The
//! connection closes after the exchange.

use std::pin::Pin;
use std::task::{Context, Poll};

use corral_audit::Decision;
use corral_http1::io::{BufConn, Replacer, error_response, relay_body};
use corral_http1::{
    Framing, Header, RequestHead, ResponseHead, header_values, parse_response_head,
};
use corral_policy::domain::Host;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::signin::{MAX_SIGNIN_BYTES, Refreshing, Signin};
use corral_http1::exchange::scrub_response_head;

use crate::{Dest, Gateway, GatewayError, InterceptStats};

/// A body collected in memory, refused past [`MAX_SIGNIN_BYTES`].
#[derive(Default)]
struct CappedBody(Vec<u8>);

impl AsyncWrite for CappedBody {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.0.len() + buf.len() > MAX_SIGNIN_BYTES {
            return Poll::Ready(Err(std::io::Error::other(
                "larger than the 1 MiB a sign-in exchange may carry",
            )));
        }
        self.0.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// `headers` declaring exactly `len` body bytes, and closing the connection when `close`.
fn fixed_length(headers: &mut Vec<Header>, len: usize, close: bool) {
    headers.retain(|h| {
        let framing = h.name.eq_ignore_ascii_case("content-length")
            || h.name.eq_ignore_ascii_case("transfer-encoding");
        !(framing || close && h.name.eq_ignore_ascii_case("connection"))
    });
    headers.push(Header {
        name: "Content-Length".into(),
        value: len.to_string().into_bytes(),
    });
    if close {
        headers.push(Header {
            name: "Connection".into(),
            value: b"close".to_vec(),
        });
    }
}

impl Gateway {
    /// The sign-in whose token endpoint `target` on `host:port` is.
    pub(crate) fn token_endpoint(&self, host: &Host, port: u16, target: &str) -> Option<&Signin> {
        self.inner
            .signin
            .iter()
            .find(|s| s.is_token_request(host, port, target))
    }

    /// Answer `status` with `why` to the jail and record the refusal.
    async fn refuse_signin<D: AsyncWrite + Unpin>(
        &self,
        down: &mut D,
        d: &Dest<'_>,
        status: u16,
        why: String,
    ) -> GatewayError {
        let body = format!("corral credential gateway: {why}\n");
        let _ = down.write_all(&error_response(status, &body)).await;
        let _ = down.shutdown().await;
        self.refused(d, "POST", why)
    }

    /// One refresh request and its answer (see the module docs). `req` was checked, its
    /// headers already rewritten and `Accept-Encoding: identity` set.
    pub(crate) async fn refresh_exchange<D, U>(
        &self,
        s: &Signin,
        (down, up): (&mut BufConn<D>, &mut BufConn<U>),
        mut req: RequestHead,
        d: &Dest<'_>,
        stats: &mut InterceptStats,
    ) -> Result<(), GatewayError>
    where
        D: AsyncRead + AsyncWrite + Unpin + Send,
        U: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let t = self.timeouts.idle;
        let id = format!("signin.{}", s.plan().name);
        let path = crate::path_without_query(&req.target).to_string();
        let method = req.method.clone();
        let mut body = CappedBody::default();
        if let Err(e) =
            relay_body(down, &mut body, (req.framing, Framing::UntilClose), t, None).await
        {
            let why = format!("{method} {path}: request body: {e}");
            return Err(self.refuse_signin(&mut down.io, d, 400, why).await);
        }
        if let Err(e) = s.write_back_reachable() {
            let why = format!(
                "{method} {path}: refresh refused, its new tokens could not be written back: {e}"
            );
            return Err(self.refuse_signin(&mut down.io, d, 502, why).await);
        }
        let form = header_values(&req.headers, "content-type").any(|v| {
            v.to_ascii_lowercase()
                .starts_with(b"application/x-www-form-urlencoded")
        });
        let (refreshing, body) = match s.swap_refresh((d.host, d.port, &req.target), &body.0, form)
        {
            Some((r, b)) => {
                let rule = format!("{id}: real refresh token put into {method} {path}");
                self.record(d, &method, Decision::Allow, rule, Some(id.clone()));
                (Some(r), b)
            }
            None => {
                let rule = format!(
                    "{id}: no placeholder refresh token of this run in {method} {path}; sent as it is"
                );
                self.record(d, &method, Decision::Deny, rule, Some(id.clone()));
                (s.refresh_at(d.host, d.port, &req.target), body.0)
            }
        };
        ask_for_json(&mut req.headers);
        fixed_length(&mut req.headers, body.len(), false);
        req.framing = Framing::Length(body.len() as u64);
        let mut bytes = req.to_bytes();
        bytes.extend_from_slice(&body);
        let relay = |e| crate::GatewayError::Relay {
            host: d.host.to_string(),
            source: e,
        };
        up.io.write_all(&bytes).await.map_err(relay)?;
        stats.bytes_up += bytes.len() as u64;
        stats.requests += 1;
        let Some(refreshing) = refreshing else {
            let why = format!("{method} {path}: not a token endpoint of this sign-in");
            return Err(self.refuse_signin(&mut down.io, d, 502, why).await);
        };
        self.refresh_answer((s, &refreshing), (down, up), d, stats, &id)
            .await
    }

    /// Read the token endpoint's answer, take the new tokens, send the jail its version.
    async fn refresh_answer<D, U>(
        &self,
        s: (&Signin, &Refreshing),
        (down, up): (&mut BufConn<D>, &mut BufConn<U>),
        d: &Dest<'_>,
        stats: &mut InterceptStats,
        id: &str,
    ) -> Result<(), GatewayError>
    where
        D: AsyncRead + AsyncWrite + Unpin + Send,
        U: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let t = self.timeouts.idle;
        let upstream = |why: String| GatewayError::Relay {
            host: d.host.to_string(),
            source: std::io::Error::other(why),
        };
        let mut resp = loop {
            let head = up
                .read_head(t, t)
                .await
                .map_err(|e| upstream(format!("token response: {e}")))?
                .ok_or_else(|| upstream("token endpoint closed before answering".into()))?;
            let r =
                parse_response_head(&head).map_err(|e| upstream(format!("token response: {e}")))?;
            if !(100..200).contains(&r.status) {
                break r;
            }
        };
        let framing = corral_http1::response_framing(&resp, "POST")
            .map_err(|e| upstream(format!("token response framing: {e}")))?;
        if let Err(why) = scrub_response_head(&mut resp, framing, &self.scrubber()) {
            return Err(self.refuse_signin(&mut down.io, d, 502, why).await);
        }
        let mut body = CappedBody::default();
        if let Err(e) = relay_body(up, &mut body, (framing, Framing::UntilClose), t, None).await {
            let why = format!("token response body: {e}");
            return Err(self.refuse_signin(&mut down.io, d, 502, why).await);
        }
        let out = match self.jail_answer(s, &resp, &body.0, d, id) {
            Ok(out) => out,
            Err(why) => return Err(self.refuse_signin(&mut down.io, d, 502, why).await),
        };
        // The jail's head is built here, not relayed: status and reason (scrubbed, now that the
        // new tokens are in the scrubber too), and what frames a JSON body. No origin header
        // reaches the jail from a token endpoint.
        resp.reason = self.scrubber().replace_all(&resp.reason);
        resp.headers = vec![
            Header {
                name: "Content-Type".into(),
                value: b"application/json".to_vec(),
            },
            Header {
                name: "Cache-Control".into(),
                value: b"no-store".to_vec(),
            },
        ];
        fixed_length(&mut resp.headers, out.len(), true);
        let mut bytes = resp.to_bytes();
        bytes.extend_from_slice(&out);
        down.io
            .write_all(&bytes)
            .await
            .map_err(|e| crate::GatewayError::Relay {
                host: d.host.to_string(),
                source: e,
            })?;
        stats.bytes_down += bytes.len() as u64;
        let _ = down.io.shutdown().await;
        Ok(())
    }

    /// The jail's version of the token endpoint's answer, or why there is none (the jail is then
    /// answered 502): a `200` must be a JSON token response corral takes whole
    /// ([`Signin::take_response`]), a `4xx`/`5xx` a JSON OAuth error, of which the jail gets the
    /// `error` fields only. Anything else (form encoding, another content type, a redirect, a
    /// token where corral does not take it) is refused: it may carry a live token corral cannot
    /// replace.
    fn jail_answer(
        &self,
        s: (&Signin, &Refreshing),
        resp: &ResponseHead,
        body: &[u8],
        d: &Dest<'_>,
        id: &str,
    ) -> Result<Vec<u8>, String> {
        let status = resp.status;
        if !json_content(&resp.headers) {
            let ct: Vec<String> = header_values(&resp.headers, "content-type")
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .collect();
            return Err(format!(
                "the token endpoint answered {status} with content type {ct:?}, not the JSON corral asked for; refused, it may carry tokens corral cannot replace"
            ));
        }
        let out = match status {
            200 => self.take_tokens(s, body, d, id)?,
            400..=599 => oauth_error(body).map_err(|why| {
                format!("the token endpoint answered {status} with {why}; refused, it may carry tokens corral cannot replace")
            })?,
            _ => {
                return Err(format!(
                    "the token endpoint answered {status}; corral relays a 200 token response or a 4xx/5xx OAuth error only"
                ));
            }
        };
        Ok(scrub_json(&out, &self.scrubber()))
    }

    /// The jail's version of a successful token response; the real tokens kept and written back.
    fn take_tokens(
        &self,
        (s, r): (&Signin, &Refreshing),
        body: &[u8],
        d: &Dest<'_>,
        id: &str,
    ) -> Result<Vec<u8>, String> {
        let secret = Some(match r.provider() {
            Some(p) => format!("{id}.{p}"),
            None => id.to_string(),
        });
        let id = secret.as_deref().unwrap_or(id);
        match s.take_response(r, body) {
            Ok((out, expires_in)) => {
                let file = s.plan().file.display().to_string();
                let (decision, rule) = match s.write_back(
                    r,
                    expires_in,
                    std::time::SystemTime::now(),
                ) {
                    Ok(()) => (
                        Decision::Allow,
                        format!(
                            "{id}: refreshed; new tokens kept by corral and written back to {file}"
                        ),
                    ),
                    Err(e) => (Decision::Deny, format!("{id}: refreshed; {e}")),
                };
                self.record(d, "POST", decision, rule, secret);
                Ok(out)
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

/// A JSON answer for the jail with every real value of the run, in every encoding corral
/// produced, replaced: in each string and key as the jail's parser will read them (a value the
/// origin quoted JSON-escaped, `1\/\/...`, is escaped once more when re-serialised), then in
/// the bytes.
pub(crate) fn scrub_json(json: &[u8], scrub: &Replacer) -> Vec<u8> {
    fn walk(v: &mut serde_json::Value, scrub: &Replacer) {
        let text = |s: &str| String::from_utf8_lossy(&scrub.replace_all(s.as_bytes())).into_owned();
        match v {
            serde_json::Value::String(s) => *s = text(s),
            serde_json::Value::Array(items) => items.iter_mut().for_each(|i| walk(i, scrub)),
            serde_json::Value::Object(map) => {
                let old = std::mem::take(map);
                for (k, mut val) in old {
                    walk(&mut val, scrub);
                    map.insert(text(&k), val);
                }
            }
            _ => {}
        }
    }
    let out = match serde_json::from_slice::<serde_json::Value>(json) {
        Ok(mut v) => {
            walk(&mut v, scrub);
            serde_json::to_vec(&v).unwrap_or_default()
        }
        Err(_) => json.to_vec(),
    };
    scrub.replace_all(&out)
}

/// Ask the token endpoint for the one format corral parses: the jail's `Accept` (it may ask for
/// form encoding, which GitHub-style endpoints honour) is replaced by `application/json`; no
/// piece of the answer (`Range`) either.
fn ask_for_json(headers: &mut Vec<Header>) {
    headers.retain(|h| {
        !(h.name.eq_ignore_ascii_case("accept")
            || h.name.eq_ignore_ascii_case("range")
            || h.name.eq_ignore_ascii_case("if-range"))
    });
    headers.push(Header {
        name: "Accept".into(),
        value: b"application/json".to_vec(),
    });
}

/// Whether the answer declares exactly one content type, and it is JSON (`application/json`,
/// or a `+json` type), parameters aside.
fn json_content(headers: &[Header]) -> bool {
    let mut types = header_values(headers, "content-type");
    let (Some(v), None) = (types.next(), types.next()) else {
        return false;
    };
    let media = v.split(|&b| b == b';').next().unwrap_or_default();
    let media = media.trim_ascii().to_ascii_lowercase();
    media == b"application/json"
        || (media.starts_with(b"application/") && media.ends_with(b"+json"))
}

/// The jail's copy of an OAuth error answer (RFC 6749 §5.2): a JSON object, of which the
/// string fields `error`, `error_description` and `error_uri` are kept; `Err` why not.
pub(crate) fn oauth_error(body: &[u8]) -> Result<Vec<u8>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("a body that is not JSON ({e})"))?;
    let serde_json::Value::Object(map) = v else {
        return Err("a JSON body that is not an object".into());
    };
    let mut kept = serde_json::Map::new();
    for field in ["error", "error_description", "error_uri"] {
        if let Some(serde_json::Value::String(text)) = map.get(field) {
            kept.insert(field.into(), serde_json::Value::String(text.clone()));
        }
    }
    if !kept.contains_key("error") {
        return Err("a JSON body without an `error` field".into());
    }
    serde_json::to_vec(&serde_json::Value::Object(kept)).map_err(|e| e.to_string())
}
