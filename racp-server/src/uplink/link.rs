//! Connecting to NATS, for a host's uplink and for `pi-gateway` alike: TLS unless a URL says
//! `nats://` in so many words (docs/reliability.md, "The gateway's NATS links").
//!
//! An address without a scheme is `tls://`. `tls://` makes TLS required for every server the
//! client reaches, including servers a cluster announces. The server's certificate is checked
//! against the system's roots, or against the CA file given (`--nats-ca`, `--gateway-ca`)
//! instead. `nats://` is accepted only as written, with a warning that the link may be
//! cleartext.

use async_nats::{ConnectOptions, ServerAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{url:?} is not a NATS address: {reason}")]
    Address { url: String, reason: String },
    #[error("no NATS server given")]
    Empty,
    #[error(
        "the NATS server at {url} failed the TLS check: {reason}; give the CA that signed its certificate (PEM) with {ca_flag}, or check that the address names the certificate's host"
    )]
    Tls {
        url: String,
        reason: String,
        ca_flag: &'static str,
    },
    #[error(
        "the NATS server at {url} does not offer TLS: give it a `tls {{ cert_file, key_file }}` block, or, to send everything in the clear, name it nats://{url}"
    )]
    NoTls { url: String },
    #[error("cannot read the NATS CA file {path}: {reason}")]
    Ca { path: String, reason: String },
}

/// The servers to dial, and whether any of them was named `nats://` (cleartext allowed).
#[derive(Debug, Clone)]
pub struct Servers {
    pub addrs: Vec<ServerAddr>,
    /// The addresses written as `nats://`, which may carry everything in the clear.
    pub cleartext: Vec<String>,
    shown: String,
}

impl Servers {
    /// Parses comma-separated (or listed) URLs; a bare `host:port` is `tls://host:port`.
    pub fn parse<S: AsRef<str>>(urls: &[S]) -> Result<Servers, LinkError> {
        let mut addrs = Vec::new();
        let mut cleartext = Vec::new();
        for url in urls.iter().flat_map(|u| u.as_ref().split(',')) {
            let url = url.trim();
            if url.is_empty() {
                continue;
            }
            let written = if url.contains("://") {
                url.to_string()
            } else {
                format!("tls://{url}")
            };
            let scheme = written.split("://").next().unwrap_or_default();
            match scheme {
                "tls" => {}
                "nats" => cleartext.push(written.clone()),
                other => {
                    return Err(LinkError::Address {
                        // Any userinfo left out of the message.
                        url: url.rsplit('@').next().unwrap_or_default().to_string(),
                        reason: format!(
                            "use tls://host:port (or nats:// for cleartext), not {other}://"
                        ),
                    });
                }
            }
            let addr = written
                .parse::<ServerAddr>()
                .map_err(|e| LinkError::Address {
                    url: url.to_string(),
                    reason: e.to_string(),
                })?;
            if addr.has_user_pass() {
                // Named without its userinfo: the password stays out of the message.
                return Err(LinkError::Address {
                    url: format!("{}:{}", addr.host(), addr.port()),
                    reason: "credentials do not belong in the address (the nkey authenticates)"
                        .into(),
                });
            }
            addrs.push(addr);
        }
        if addrs.is_empty() {
            return Err(LinkError::Empty);
        }
        let shown = addrs
            .iter()
            .map(|a| format!("{}:{}", a.host(), a.port()))
            .collect::<Vec<_>>()
            .join(",");
        Ok(Servers {
            addrs,
            cleartext,
            shown,
        })
    }

    /// `host:port` of each server, for messages.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Logs, once, that a link named `nats://` may be cleartext.
    pub fn warn_if_cleartext(&self, link: &str) {
        if !self.cleartext.is_empty() {
            tracing::warn!(
                servers = %self.cleartext.join(","),
                "the {link} link to NATS is cleartext (nats://): anyone on the path reads and can alter every call, reply and event; use tls://"
            );
        }
    }
}

/// TLS settings for a link: the CA file (PEM) that signs the servers' certificates, if not the
/// system's roots.
#[derive(Debug, Clone, Default)]
pub struct Tls {
    pub ca: Option<PathBuf>,
    /// The flag that sets `ca`, for messages.
    pub ca_flag: &'static str,
}

impl Tls {
    /// `options` with TLS required (unless a server is named `nats://`) and the CA file, if any.
    pub fn apply(
        &self,
        options: ConnectOptions,
        servers: &Servers,
    ) -> Result<ConnectOptions, LinkError> {
        let mut options = options.require_tls(servers.cleartext.is_empty());
        if let Some(ca) = &self.ca {
            check_ca(ca)?;
            options = options.add_root_certificates(ca.clone());
        }
        Ok(options)
    }

    /// Tells a TLS failure (a server without TLS, a wrong CA, a certificate for another name)
    /// from a server that is down: the first is a configuration error to report, the second
    /// something to retry. Each TLS server that accepts a TCP connection must offer TLS in its
    /// greeting; then one connection attempt must pass the certificate check. Other failures
    /// (down, refused key) are left to the retrying client.
    pub async fn check(&self, servers: &Servers, base: ConnectOptions) -> Result<(), LinkError> {
        let mut reachable = false;
        for addr in &servers.addrs {
            if !addr.tls_required() {
                continue;
            }
            match greeting(addr.host(), addr.port()).await {
                Greeting::Down => {}
                Greeting::Tls => reachable = true,
                Greeting::NoTls => {
                    return Err(LinkError::NoTls {
                        url: format!("{}:{}", addr.host(), addr.port()),
                    });
                }
            }
        }
        if !reachable {
            return Ok(());
        }
        let options = self
            .apply(base, servers)?
            .connection_timeout(Duration::from_secs(5))
            .ignore_discovered_servers();
        match options.connect(servers.addrs.clone()).await {
            Ok(client) => {
                let _ = client.drain().await;
                Ok(())
            }
            Err(err) => {
                let reason = error_chain(&err);
                use async_nats::ConnectErrorKind::{Io, Tls};
                if matches!(err.kind(), Tls | Io) {
                    Err(LinkError::Tls {
                        url: servers.shown().to_string(),
                        reason,
                        ca_flag: self.ca_flag,
                    })
                } else {
                    tracing::debug!(error = %reason, "NATS refused the first connection");
                    Ok(())
                }
            }
        }
    }
}

enum Greeting {
    Down,
    Tls,
    NoTls,
}

/// What a NATS server says first (`INFO {...}`): whether it offers TLS.
async fn greeting(host: &str, port: u16) -> Greeting {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let patience = Duration::from_secs(5);
    let Ok(Ok(stream)) =
        tokio::time::timeout(patience, tokio::net::TcpStream::connect((host, port))).await
    else {
        return Greeting::Down;
    };
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(stream).take(64 << 10);
    let read = tokio::time::timeout(patience, reader.read_line(&mut line)).await;
    if !matches!(read, Ok(Ok(n)) if n > 0) {
        // Silent: a server that wants TLS first, or not NATS; the connection attempt decides.
        return Greeting::Tls;
    }
    let info = line
        .strip_prefix("INFO ")
        .and_then(|json| serde_json::from_str::<serde_json::Value>(json.trim()).ok());
    let offers = |key: &str| {
        info.as_ref()
            .and_then(|i| i.get(key))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    };
    if offers("tls_required") || offers("tls_available") {
        Greeting::Tls
    } else {
        Greeting::NoTls
    }
}

fn check_ca(path: &Path) -> Result<(), LinkError> {
    let text = std::fs::read_to_string(path).map_err(|e| LinkError::Ca {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    if !text.contains("-----BEGIN CERTIFICATE-----") {
        return Err(LinkError::Ca {
            path: path.display().to_string(),
            reason: "no PEM certificate in it".into(),
        });
    }
    Ok(())
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_address_is_tls_and_nats_is_cleartext_only_as_written() {
        let bare = Servers::parse(&["127.0.0.1:4222"]).unwrap();
        assert!(bare.addrs[0].tls_required());
        assert!(bare.cleartext.is_empty());
        let tls = Servers::parse(&["tls://a:1,tls://b:2"]).unwrap();
        assert_eq!(tls.addrs.len(), 2);
        assert!(tls.cleartext.is_empty());
        let plain = Servers::parse(&["nats://a:1"]).unwrap();
        assert_eq!(plain.cleartext, vec!["nats://a:1".to_string()]);
        for bad in ["ws://a:1", "tls://u:p@a:1", ""] {
            assert!(Servers::parse(&[bad]).is_err(), "{bad}");
        }
    }
}
