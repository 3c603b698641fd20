//! The drain (docs/protocol.md §12) against a real host: an HTTP connection opened before the
//! SIGTERM and upgraded after it is refused with 503 HOST_SHUTTING_DOWN, an open RACP
//! connection ends with HOST_SHUTTING_DOWN and close 1001, and a call that arrives as the drain
//! begins (held there by the debug-build hook `PI_HOST_TEST_DRAIN_DELAY_MS`) is not started.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;
use tests::raw::Raw;
use tests::{Client, HostProcess, PATIENCE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

#[tokio::test]
async fn a_drain_refuses_late_upgrades_and_closes_open_connections_going_away() {
    let host = HostProcess::start(bin()).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let hello = br#"{"id":1,"method":"hello","params":{"protocol":{"min":1,"max":1},"client":{"name":"raw","version":"0"}}}"#;
    let mut open = Raw::connect(&host.url(), &token).await;
    assert!(open.reply(hello).await.get("result").is_some());
    // An HTTP connection with its request line sent, the rest of the upgrade held back.
    let mut late = host.stream().await;
    late.write_all(b"GET /racp HTTP/1.1\r\n").await.unwrap();
    late.flush().await.unwrap();

    host.sigterm();
    let drain_began = std::time::Instant::now();
    let ending = tokio::time::timeout(PATIENCE * 2, open.until_close())
        .await
        .expect("the open connection was closed in time");
    assert_eq!(
        ending.error.as_deref(),
        Some("HOST_SHUTTING_DOWN"),
        "{ending:?}"
    );
    assert_eq!(ending.close, Some(1001), "{ending:?}");

    let rest = format!(
        "Host: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: racp.v1\r\n\
         Authorization: Bearer {token}\r\n\r\n"
    );
    // A request under way keeps its HTTP connection through the drain's grace (1 s,
    // racp-server's DRAIN_GRACE) and its upgrade is refused; past the grace its socket is closed
    // unanswered (a loaded machine may take that long to get here).
    if late.write_all(rest.as_bytes()).await.is_ok() {
        let written_after = drain_began.elapsed();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(PATIENCE * 2, late.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        if answer.is_empty() && written_after >= std::time::Duration::from_millis(500) {
            return;
        }
        assert!(
            answer.starts_with("HTTP/1.1 503"),
            "an upgrade during the drain: {answer}"
        );
        assert!(answer.contains("HOST_SHUTTING_DOWN"), "{answer}");
    }
}

/// Waits until the host refuses new upgrades: its drain has begun.
async fn until_draining(host: &HostProcess, token: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE * 2;
    loop {
        match Client::connect(&host.url(), token).await {
            Err(refused) if refused.body["error"]["code"] == "HOST_SHUTTING_DOWN" => return,
            _ => assert!(
                tokio::time::Instant::now() < deadline,
                "the host never began to drain"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_call_that_arrives_as_the_drain_begins_is_not_started() {
    // The drain's kill of open connections waits a minute, so the call below lands where only
    // the drain's flag stands between it and its handler.
    let host =
        HostProcess::start_with_env(bin(), &[], &[("PI_HOST_TEST_DRAIN_DELAY_MS", "60000")]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let hello = br#"{"id":1,"method":"hello","params":{"protocol":{"min":1,"max":1},"client":{"name":"raw","version":"0"}}}"#;
    let mut open = Raw::connect(&host.url(), &token).await;
    assert!(open.reply(hello).await.get("result").is_some());
    host.sigterm();
    until_draining(&host, &token).await;
    let reply = open
        .reply(br#"{"id":2,"method":"session/list","params":{}}"#)
        .await;
    assert_eq!(reply["error"]["code"], "HOST_SHUTTING_DOWN", "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not started")),
        "{reply}"
    );
}
