//! Dialling a decided destination: resolve, check every address, connect to a checked one,
//! directly or through the upstream proxy. Never by name.

use super::*;

impl Proxy {
    /// Resolve, check every address, connect to a checked one (directly or through the upstream
    /// proxy). Never connects by name.
    pub(super) async fn dial(
        &self,
        rules: &Rules,
        host: &Host,
        port: u16,
    ) -> Result<(TcpStream, SocketAddr), Refusal> {
        let shown = host_display(host);
        let ips: Vec<IpAddr> = match host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => {
                match tokio::time::timeout(
                    self.config.connect_timeout,
                    self.resolver.resolve(name, port),
                )
                .await
                {
                    Ok(Ok(ips)) if !ips.is_empty() => ips,
                    Ok(Ok(_)) => {
                        return Err(Refusal::Failed {
                            rule: format!("{name} has no addresses"),
                            status: 502,
                        });
                    }
                    Ok(Err(e)) => {
                        return Err(Refusal::Failed {
                            rule: format!("cannot resolve {name}: {e}"),
                            status: 502,
                        });
                    }
                    Err(_) => {
                        return Err(Refusal::Failed {
                            rule: format!("resolving {name} timed out"),
                            status: 504,
                        });
                    }
                }
            }
        };
        for ip in &ips {
            if let Err(class) = check_destination(*ip, &rules.allow_cidrs) {
                let cidr = match ip {
                    IpAddr::V4(_) => format!("{ip}/32"),
                    IpAddr::V6(_) => format!("{ip}/128"),
                };
                let class = class.as_str();
                return Err(Refusal::Denied(Denial {
                    rule: format!("{shown} resolves to {ip} ({class}), not in network.allow_cidrs"),
                    fix: format!("allow with: network.allow_cidrs = [\"{cidr}\"] in corral.toml"),
                    status: 403,
                }));
            }
        }
        if let Some(upstream) = &rules.upstream {
            return self.dial_upstream(upstream, host, port, ips[0]).await;
        }
        let mut last_err = None;
        for ip in ips {
            let addr = SocketAddr::new(ip, port);
            match tokio::time::timeout(self.config.connect_timeout, TcpStream::connect(addr)).await
            {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok((s, addr));
                }
                Ok(Err(e)) if out_of_descriptors(&e) => {
                    self.fd_refused.hit(|n| {
                        format!("corral proxy: out of file descriptors: {n} connection(s) refused in the last 10 s (503: no descriptor to reach the destination)")
                    });
                    return Err(Refusal::Failed {
                        rule: format!("connect to {addr}: corral is out of file descriptors"),
                        status: 503,
                    });
                }
                Ok(Err(e)) => last_err = Some(format!("connect to {addr}: {e}")),
                Err(_) => last_err = Some(format!("connect to {addr} timed out")),
            }
        }
        Err(Refusal::Failed {
            rule: last_err.unwrap_or_else(|| "no address".into()),
            status: 502,
        })
    }

    /// A CONNECT tunnel to `host:port` through the upstream proxy. The decision (including the
    /// address check) was made locally; the upstream proxy is trusted configuration.
    async fn dial_upstream(
        &self,
        upstream: &crate::rules::Upstream,
        host: &Host,
        port: u16,
        checked: IpAddr,
    ) -> Result<(TcpStream, SocketAddr), Refusal> {
        let failed = |why: String| Refusal::Failed {
            rule: format!("upstream proxy {}:{}: {why}", upstream.host, upstream.port),
            status: 502,
        };
        let t = self.config.connect_timeout;
        let stream = tokio::time::timeout(
            t,
            TcpStream::connect((upstream.host.as_str(), upstream.port)),
        )
        .await
        .map_err(|_| failed("connect timed out".into()))?
        .map_err(|e| failed(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let mut conn = BufConn::new(stream);
        let auth = authority_string(host, port);
        conn.io
            .write_all(format!("CONNECT {auth} HTTP/1.1\r\nHost: {auth}\r\n\r\n").as_bytes())
            .await
            .map_err(|e| failed(e.to_string()))?;
        let head = conn
            .read_head_within(t, t, &self.buffers)
            .await
            .map_err(|e| failed(e.to_string()))?
            .ok_or_else(|| failed("closed the connection".into()))?;
        let resp = parse_response_head(&head).map_err(|e| failed(e.to_string()))?;
        if !(200..300).contains(&resp.status) {
            return Err(failed(format!(
                "answered {} to CONNECT {auth}",
                resp.status
            )));
        }
        if !conn.buf.is_empty() {
            return Err(failed("sent data before the tunnel was used".into()));
        }
        Ok((conn.io, SocketAddr::new(checked, port)))
    }
}
