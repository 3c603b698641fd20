//! Checks on a WebSocket upgrade that a host and a gateway both make, before any frame is read:
//! Host, Origin, subprotocol, a presented token. A refusal is an HTTP response whose body is
//! `{"error": ...}`.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use racp_proto::{AppError, BEARER_SUBPROTOCOL_PREFIX, ErrorCode, SUBPROTOCOL};
use serde_json::json;

/// Refused upgrades logged per second at most: a client hammering with a bad token must not
/// flood the log (the rest are counted and reported with the next line logged).
const REFUSALS_LOGGED_PER_SECOND: u64 = 10;

/// The HTTP refusal for an error: its registry status and the error envelope as the body. Logged
/// at `info` with its code and message (which never quote a token), so an operator sees why a
/// client was turned away.
pub fn refusal(error: AppError) -> Response {
    log_refusal(&error);
    let status = StatusCode::from_u16(error.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    let body = crate::wire::encode(&json!({ "error": error }));
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn log_refusal(error: &AppError) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static WINDOW: AtomicU64 = AtomicU64::new(0);
    static IN_WINDOW: AtomicU64 = AtomicU64::new(0);
    static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
    let second = crate::clock::now_ms() / 1000;
    if WINDOW.swap(second, Ordering::Relaxed) != second {
        IN_WINDOW.store(0, Ordering::Relaxed);
    }
    if IN_WINDOW.fetch_add(1, Ordering::Relaxed) >= REFUSALS_LOGGED_PER_SECOND {
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let suppressed = SUPPRESSED.swap(0, Ordering::Relaxed);
    tracing::info!(
        code = %error.code(),
        reason = error.details().and_then(|d| d.get("reason")).and_then(|r| r.as_str()).unwrap_or(""),
        suppressed,
        "refused a connection: {}",
        error.message()
    );
}

/// The Host header names this server: a loopback name or one of `allowed` (against DNS
/// rebinding). Shared by host and gateway.
pub fn check_host_header(headers: &HeaderMap, allowed: &[String]) -> Result<(), AppError> {
    // Exactly one Host header (RFC 9112): with two, a proxy and this check could disagree.
    let host = single(headers, header::HOST).unwrap_or("");
    if host_allowed(host, allowed) {
        return Ok(());
    }
    Err(AppError::new(
        ErrorCode::Forbidden,
        "the Host header names a host this server does not answer for; start it with --allow-host NAME to answer for NAME",
    )
    .with_details(json!({"reason": "host_not_allowed"})))
}

/// The checks every RACP-WS upgrade makes, on a host and on a gateway: the Origin (when a
/// browser sends one) is allowed, `racp.v1` is offered, and a bearer token is presented (in
/// `Authorization`, or as a `racp.bearer.` subprotocol); returns the token.
pub fn presented_token<'a>(
    headers: &'a HeaderMap,
    allowed_origins: &[String],
) -> Result<&'a str, AppError> {
    if headers.contains_key(header::ORIGIN) {
        let allowed =
            single(headers, header::ORIGIN).is_some_and(|o| allowed_origins.iter().any(|a| a == o));
        if !allowed {
            return Err(AppError::new(
                ErrorCode::Forbidden,
                "requests from this Origin are not allowed; add it to the allowed origins",
            )
            .with_details(json!({"reason": "origin_not_allowed"})));
        }
    }
    let offered = offered_subprotocols(headers);
    if !offered.contains(&SUBPROTOCOL) {
        return Err(AppError::new(
            ErrorCode::ProtocolMismatch,
            format!("offer the WebSocket subprotocol {SUBPROTOCOL}"),
        )
        .with_details(json!({"expected": SUBPROTOCOL})));
    }
    bearer_token(headers)
        .or_else(|| {
            offered
                .iter()
                .find_map(|p| p.strip_prefix(BEARER_SUBPROTOCOL_PREFIX))
        })
        .ok_or_else(|| {
            AppError::new(
                ErrorCode::RemoteAuthFailed,
                "no token: send `Authorization: Bearer <token>`",
            )
        })
}

/// The header's value when it is present exactly once and readable as text.
fn single(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?.to_str().ok()?;
    values.next().is_none().then_some(value)
}

fn offered_subprotocols(headers: &HeaderMap) -> Vec<&str> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// True for a loopback literal (127.0.0.0/8 as a plain dotted quad, `[::1]`), `localhost`, or a
/// configured name. The port is not checked: a forwarded port differs from the listen port.
/// Only canonical forms pass, so `127.1`, `0177.0.0.1` and `localhost6` are refused.
pub fn host_allowed(host: &str, extra: &[String]) -> bool {
    let Some(name) = strip_port(host) else {
        return false;
    };
    name.eq_ignore_ascii_case("localhost")
        || name == "[::1]"
        || is_loopback_dotted_quad(name)
        || extra.iter().any(|e| e.eq_ignore_ascii_case(name))
}

fn strip_port(host: &str) -> Option<&str> {
    if host.is_empty() {
        return None;
    }
    let (name, port) = if host.starts_with('[') {
        let end = host.find(']')?;
        let (name, rest) = host.split_at(end + 1);
        if !rest.is_empty() && !rest.starts_with(':') {
            // `[::1]evil.example`: only a port may follow the brackets.
            return None;
        }
        (name, rest.strip_prefix(':'))
    } else {
        match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    if let Some(port) = port
        && (port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    Some(name)
}

fn is_loopback_dotted_quad(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.len() == 4
        && parts[0] == "127"
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.len() <= 3
                && p.bytes().all(|b| b.is_ascii_digit())
                && (p.len() == 1 || !p.starts_with('0'))
                && p.parse::<u16>().is_ok_and(|n| n <= 255)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_header_matrix() {
        for ok in [
            "127.0.0.1",
            "127.0.0.1:7878",
            "127.1.2.3:1",
            "localhost",
            "LOCALHOST:80",
            "[::1]",
            "[::1]:7878",
        ] {
            assert!(host_allowed(ok, &[]), "{ok} refused");
        }
        for bad in [
            "",
            "evil.example",
            "evil.example:7878",
            "localhost6",
            "localhost.evil.example",
            "127.1",
            "0177.0.0.1",
            "0x7f.0.0.1",
            "2130706433",
            "127.0.0.01",
            "127.0.0.256",
            "128.0.0.1",
            "[::2]",
            "[::1",
            "[::1]x",
            "[::1]evil.example",
            "[::1]:",
            "127.0.0.1:",
            "127.0.0.1:x",
            "::1",
        ] {
            assert!(!host_allowed(bad, &[]), "{bad} allowed");
        }
        assert!(host_allowed("box.lan:7878", &["box.lan".into()]));
    }
}
