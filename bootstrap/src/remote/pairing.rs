//! Pairing links: `racps://HOST:PORT/pair?cert=sha256:<hex>#TOKEN` (TLS, the host's certificate
//! fingerprint to pin), `racp://HOST:PORT/pair#TOKEN` (plain WebSocket, only with the explicit
//! plain opt-in), or a bare token with the host's address and fingerprint given apart
//! (docs/protocol.md §5.3).

use racp_proto::ENDPOINT_PATH;
use racp_proto::fingerprint::CertSha256;

/// Where to pair and with what.
#[derive(Clone, PartialEq, Eq)]
pub struct PairingTarget {
    /// The endpoint to connect to, e.g. `wss://127.0.0.1:7878/racp`.
    pub url: String,
    /// The single-use pairing token (secret).
    pub token: String,
    /// The host's certificate fingerprint, pinned from now on; `None` only for a plain link.
    pub cert_sha256: Option<CertSha256>,
}

// Hand-written so the token never reaches a log or a panic message.
impl std::fmt::Debug for PairingTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairingTarget")
            .field("url", &self.url)
            .field("token", &"<secret>")
            .field("cert_sha256", &self.cert_sha256)
            .finish()
    }
}

/// What the command line adds to a link or a bare token.
#[derive(Debug, Clone, Default)]
pub struct PairingHints<'a> {
    /// `HOST:PORT`, for a bare token.
    pub host: Option<&'a str>,
    /// The host's certificate fingerprint, for a bare token.
    pub cert_sha256: Option<CertSha256>,
    /// Accept a plain `racp://` link (a host run with `--plain`): the token then goes to
    /// whatever holds the port, unverified.
    pub plain: bool,
}

const PLAIN_REFUSED: &str = "a racp:// link is plain WebSocket: nothing proves the endpoint is \
     the host, so a process holding the port would receive the token. Use the racps:// link \
     `pi-host pair` prints, or pass --plain if the host really runs with --plain";

/// Reads a pairing link, or a bare token plus `hints.host`.
pub fn parse(link_or_token: &str, hints: &PairingHints<'_>) -> Result<PairingTarget, String> {
    let input = link_or_token.trim();
    if let Some(rest) = input.strip_prefix("racps://") {
        return parse_link(rest, true, hints);
    }
    if let Some(rest) = input.strip_prefix("racp://") {
        return parse_link(rest, false, hints);
    }
    if input.contains("://") {
        return Err("expected a racps:// pairing link or a bare pairing token".into());
    }
    parse_bare_token(input, hints)
}

/// A link's parts: where the host is, the token and the certificate the link names.
struct LinkParts<'a> {
    authority: &'a str,
    token: &'a str,
    cert_sha256: Option<CertSha256>,
}

/// A link after its scheme (`racps://` when `secure`, else `racp://`).
fn parse_link(rest: &str, secure: bool, hints: &PairingHints<'_>) -> Result<PairingTarget, String> {
    if hints.host.is_some() {
        return Err(
            "--host goes with a bare token (the host's HOST:PORT), not with a pairing \
             link; a host behind a gateway is chosen after pairing: pi-remote hosts --use HOST_ID"
                .into(),
        );
    }
    let expected = if secure {
        "racps://HOST:PORT/pair?cert=sha256:HEX#TOKEN"
    } else {
        "racp://HOST:PORT/pair#TOKEN"
    };
    let LinkParts {
        authority,
        token,
        cert_sha256: from_link,
    } = link_parts(rest, expected)?;
    if !secure {
        if from_link.is_some() {
            return Err("a racp:// (plain) link cannot carry a certificate; use racps://".into());
        }
        if !hints.plain {
            return Err(PLAIN_REFUSED.into());
        }
        return Ok(PairingTarget {
            url: format!("ws://{authority}{ENDPOINT_PATH}"),
            token: token.to_string(),
            cert_sha256: None,
        });
    }
    let cert_sha256 = match (from_link, hints.cert_sha256) {
        (Some(link), Some(given)) if link != given => {
            return Err(format!(
                "the link names certificate {link} but --cert-sha256 says {given}"
            ));
        }
        (Some(cert), _) | (None, Some(cert)) => cert,
        (None, None) => {
            return Err(format!(
                "the racps:// link names no certificate fingerprint (expected {expected}); \
                 use the link `pi-host pair` prints, or give --cert-sha256"
            ));
        }
    };
    Ok(PairingTarget {
        url: format!("wss://{authority}{ENDPOINT_PATH}"),
        token: token.to_string(),
        cert_sha256: Some(cert_sha256),
    })
}

/// `HOST:PORT/pair[?cert=sha256:HEX]#TOKEN`, each part checked; `expected` is the link's form,
/// for the messages.
fn link_parts<'a>(rest: &'a str, expected: &str) -> Result<LinkParts<'a>, String> {
    let (location, token) = rest
        .split_once('#')
        .ok_or_else(|| format!("the pairing link has no token (expected {expected})"))?;
    let (location, query) = match location.split_once('?') {
        Some((location, query)) => (location, Some(query)),
        None => (location, None),
    };
    let authority = location
        .strip_suffix("/pair")
        .ok_or_else(|| format!("the pairing link's path is not /pair (expected {expected})"))?;
    check_authority(authority)?;
    check_token(token)?;
    let cert_sha256 = match query {
        Some(query) => Some(cert_from_query(query)?),
        None => None,
    };
    Ok(LinkParts {
        authority,
        token,
        cert_sha256,
    })
}

/// A bare token: the host's address is `hints.host`, its certificate `hints.cert_sha256`.
fn parse_bare_token(token: &str, hints: &PairingHints<'_>) -> Result<PairingTarget, String> {
    let host = hints
        .host
        .ok_or("a bare pairing token needs --host HOST:PORT")?;
    check_authority(host)?;
    check_token(token)?;
    match (hints.cert_sha256, hints.plain) {
        (Some(cert), _) => Ok(PairingTarget {
            url: format!("wss://{host}{ENDPOINT_PATH}"),
            token: token.to_string(),
            cert_sha256: Some(cert),
        }),
        (None, true) => Ok(PairingTarget {
            url: format!("ws://{host}{ENDPOINT_PATH}"),
            token: token.to_string(),
            cert_sha256: None,
        }),
        (None, false) => Err(
            "a bare pairing token needs the host's certificate fingerprint too: \
             --cert-sha256 HEX (the certSha256 `pi-host pair` prints), or --plain for a host run \
             with --plain"
                .into(),
        ),
    }
}

/// `cert=sha256:<64 hex>` (other parameters are refused: the link format is fixed).
fn cert_from_query(query: &str) -> Result<CertSha256, String> {
    let value = query
        .strip_prefix("cert=sha256:")
        .ok_or_else(|| format!("unexpected pairing link parameters {query:?}"))?;
    CertSha256::parse(value).ok_or_else(|| {
        "the pairing link's certificate fingerprint is not 64 hex digits".to_string()
    })
}

fn check_authority(authority: &str) -> Result<(), String> {
    let port = authority
        .rsplit_once(':')
        .filter(|(host, _)| !host.is_empty())
        .map(|(_, port)| port);
    match port {
        Some(port) if port.parse::<u16>().is_ok_and(|p| p != 0) => {}
        _ => return Err(format!("expected HOST:PORT, got {authority:?}")),
    }
    if authority
        .chars()
        .any(|c| c.is_whitespace() || matches!(c, '/' | '#' | '?' | '@'))
    {
        return Err(format!("expected HOST:PORT, got {authority:?}"));
    }
    Ok(())
}

fn check_token(token: &str) -> Result<(), String> {
    if token.is_empty() || token.len() > 512 || !token.chars().all(|c| c.is_ascii_graphic()) {
        return Err("the pairing token is empty or malformed".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex() -> String {
        "ab".repeat(32)
    }

    fn plain() -> PairingHints<'static> {
        PairingHints {
            plain: true,
            ..PairingHints::default()
        }
    }

    #[test]
    fn reads_a_tls_pairing_link_with_its_fingerprint() {
        let link = format!(
            "racps://127.0.0.1:7878/pair?cert=sha256:{}#ppt_secret",
            hex()
        );
        let target = parse(&link, &PairingHints::default()).unwrap();
        assert_eq!(target.url, "wss://127.0.0.1:7878/racp");
        assert_eq!(target.token, "ppt_secret");
        assert_eq!(target.cert_sha256.unwrap().to_hex(), hex());
        let link = format!("racps://[::1]:7878/pair?cert=sha256:{}#ppt_x", hex());
        let target = parse(&link, &PairingHints::default()).unwrap();
        assert_eq!(target.url, "wss://[::1]:7878/racp");
    }

    #[test]
    fn a_plain_link_needs_the_explicit_opt_in() {
        let err = parse(
            "racp://127.0.0.1:7878/pair#ppt_secret",
            &PairingHints::default(),
        )
        .unwrap_err();
        assert!(err.contains("--plain"), "{err}");
        let target = parse("racp://127.0.0.1:7878/pair#ppt_secret", &plain()).unwrap();
        assert_eq!(target.url, "ws://127.0.0.1:7878/racp");
        assert_eq!(target.cert_sha256, None);
    }

    #[test]
    fn reads_a_bare_token_with_a_host_and_a_fingerprint() {
        let hints = PairingHints {
            host: Some("127.0.0.1:7878"),
            cert_sha256: CertSha256::parse(&hex()),
            plain: false,
        };
        let target = parse("ppt_secret", &hints).unwrap();
        assert_eq!(target.url, "wss://127.0.0.1:7878/racp");
        let no_host = PairingHints {
            host: None,
            ..hints.clone()
        };
        assert!(
            parse("ppt_secret", &no_host)
                .unwrap_err()
                .contains("--host")
        );
        let no_pin = PairingHints {
            cert_sha256: None,
            ..hints
        };
        assert!(
            parse("ppt_secret", &no_pin)
                .unwrap_err()
                .contains("--cert-sha256")
        );
    }

    #[test]
    fn refuses_malformed_links() {
        let none = PairingHints::default();
        for bad in [
            "racps://h:1/pair#t".to_string(),
            "racps://h:1/pair?cert=sha256:abc#t".to_string(),
            format!("racps://h:1/pair?cert=md5:{}#t", hex()),
            format!("racps://h:1/pair?cert=sha256:{}", hex()),
            format!("racps://h:1/other?cert=sha256:{}#t", hex()),
            format!("racp://127.0.0.1:1/pair?cert=sha256:{}#t", hex()),
            "racp://127.0.0.1:7878/pair".to_string(),
            "racp://127.0.0.1/pair#t".to_string(),
            "https://x/pair#t".to_string(),
        ] {
            assert!(parse(&bad, &none).is_err(), "{bad}");
            assert!(parse(&bad, &plain()).is_err(), "{bad}");
        }
    }

    #[test]
    fn debug_hides_the_token() {
        let link = format!(
            "racps://127.0.0.1:7878/pair?cert=sha256:{}#ppt_secret",
            hex()
        );
        let target = parse(&link, &PairingHints::default()).unwrap();
        assert!(!format!("{target:?}").contains("ppt_secret"));
    }
}
