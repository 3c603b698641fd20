//! Pairing links: `racp://HOST:PORT/pair#TOKEN` (plain WebSocket) and `racps://…` (TLS), or a
//! bare token with the host's address given apart (docs/protocol.md §5).

use racp_proto::ENDPOINT_PATH;

/// Where to pair and with what.
#[derive(Clone, PartialEq, Eq)]
pub struct PairingTarget {
    /// The endpoint to connect to, e.g. `ws://127.0.0.1:7878/racp`.
    pub url: String,
    /// The single-use pairing token (secret).
    pub token: String,
}

// Hand-written so the token never reaches a log or a panic message.
impl std::fmt::Debug for PairingTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairingTarget")
            .field("url", &self.url)
            .field("token", &"<secret>")
            .finish()
    }
}

/// Reads a pairing URL, or a bare token plus `host` (`HOST:PORT`).
pub fn parse(link_or_token: &str, host: Option<&str>) -> Result<PairingTarget, String> {
    let input = link_or_token.trim();
    if input.starts_with("racps://") {
        return Err(
            "racps:// (TLS) pairing links are not supported by pi-remote yet; \
                    pair over a loopback racp:// link (e.g. through an SSH port forward)"
                .into(),
        );
    }
    if let Some(rest) = input.strip_prefix("racp://") {
        let (location, token) = rest
            .split_once('#')
            .ok_or("the pairing link has no token (expected racp://HOST:PORT/pair#TOKEN)")?;
        let authority = location
            .strip_suffix("/pair")
            .ok_or("the pairing link's path is not /pair (expected racp://HOST:PORT/pair#TOKEN)")?;
        check_authority(authority)?;
        check_token(token)?;
        if host.is_some() {
            return Err("--host goes with a bare token, not with a pairing link".into());
        }
        return Ok(PairingTarget {
            url: format!("ws://{authority}{ENDPOINT_PATH}"),
            token: token.to_string(),
        });
    }
    if input.contains("://") {
        return Err("expected a racp:// pairing link or a bare pairing token".into());
    }
    let host = host.ok_or("a bare pairing token needs --host HOST:PORT")?;
    check_authority(host)?;
    check_token(input)?;
    Ok(PairingTarget {
        url: format!("ws://{host}{ENDPOINT_PATH}"),
        token: input.to_string(),
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

    #[test]
    fn reads_a_pairing_link() {
        let target = parse("racp://127.0.0.1:7878/pair#ppt_secret", None).unwrap();
        assert_eq!(target.url, "ws://127.0.0.1:7878/racp");
        assert_eq!(target.token, "ppt_secret");
        let target = parse("racp://[::1]:7878/pair#ppt_x", None).unwrap();
        assert_eq!(target.url, "ws://[::1]:7878/racp");
    }

    #[test]
    fn reads_a_bare_token_with_a_host() {
        let target = parse("ppt_secret", Some("127.0.0.1:7878")).unwrap();
        assert_eq!(target.url, "ws://127.0.0.1:7878/racp");
        assert!(parse("ppt_secret", None).unwrap_err().contains("--host"));
    }

    #[test]
    fn refuses_tls_links_and_malformed_ones() {
        assert!(
            parse("racps://h:1/pair#t", None)
                .unwrap_err()
                .contains("not supported")
        );
        assert!(parse("racp://127.0.0.1:7878/pair", None).is_err());
        assert!(parse("racp://127.0.0.1/pair#t", None).is_err());
        assert!(parse("racp://127.0.0.1:7878/other#t", None).is_err());
        assert!(parse("https://x/pair#t", None).is_err());
    }

    #[test]
    fn debug_hides_the_token() {
        let target = parse("racp://127.0.0.1:7878/pair#ppt_secret", None).unwrap();
        assert!(!format!("{target:?}").contains("ppt_secret"));
    }
}
