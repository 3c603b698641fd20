//! The drain (docs/protocol.md §12) against a real host: an open RACP connection ends with
//! HOST_SHUTTING_DOWN and close 1001; held between the drain's flag and its kill of connections
//! by the debug-build hook `PI_HOST_TEST_DRAIN_DELAY_MS`, an HTTP connection opened before the
//! SIGTERM and upgraded after it is refused with 503 HOST_SHUTTING_DOWN, and a call that
//! arrives as the drain begins is not started.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;
use tests::raw::Raw;
use tests::{Client, HostProcess, PATIENCE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

const HELLO: &[u8] = br#"{"id":1,"method":"hello","params":{"protocol":{"min":1,"max":1},"client":{"name":"raw","version":"0"}}}"#;

#[tokio::test]
async fn a_drain_closes_open_connections_going_away() {
    let host = HostProcess::start(bin()).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut open = Raw::connect(&host.url(), &token).await;
    assert!(open.reply(HELLO).await.get("result").is_some());
    host.sigterm();
    let ending = tokio::time::timeout(PATIENCE * 2, open.until_close())
        .await
        .expect("the open connection was closed in time");
    assert_eq!(
        ending.error.as_deref(),
        Some("HOST_SHUTTING_DOWN"),
        "{ending:?}"
    );
    assert_eq!(ending.close, Some(1001), "{ending:?}");
}

/// An HTTP connection opened before the SIGTERM whose upgrade request ends after the drain
/// began. The drain is held between its flag and its kill of connections
/// (`PI_HOST_TEST_DRAIN_DELAY_MS`), so the request is answered whatever the machine's load (else
/// it could arrive after the drain's grace, when its socket is closed unanswered).
#[tokio::test]
async fn an_upgrade_begun_before_the_drain_and_ended_during_it_is_refused() {
    let host =
        HostProcess::start_with_env(bin(), &[], &[("PI_HOST_TEST_DRAIN_DELAY_MS", "60000")]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    // The request line sent, the rest of the upgrade held back.
    let mut late = host.stream().await;
    late.write_all(b"GET /racp HTTP/1.1\r\n").await.unwrap();
    late.flush().await.unwrap();
    host.sigterm();
    until_draining(&host, &token).await;
    let rest = format!(
        "Host: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: racp.v1\r\n\
         Authorization: Bearer {token}\r\n\r\n"
    );
    late.write_all(rest.as_bytes()).await.unwrap();
    // Read until the refusal's code shows (or the connection ends).
    let mut answer = Vec::new();
    let read = async {
        let mut chunk = [0; 4096];
        while !String::from_utf8_lossy(&answer).contains("HOST_SHUTTING_DOWN") {
            match late.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("an answer in time");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 503"),
        "an upgrade during the drain: {answer}"
    );
    assert!(answer.contains("HOST_SHUTTING_DOWN"), "{answer}");
}

/// Waits until the drain has begun (the host logs it once its flag is up), then checks that a
/// new upgrade is refused: a host that took it fails here at once, not at a deadline.
async fn until_draining(host: &HostProcess, token: &str) {
    host.until_logged(
        "drain begun: new connections and calls are refused",
        PATIENCE * 2,
        "the host never began to drain",
    )
    .await;
    match Client::connect(&host.url(), token).await {
        Err(refused) => assert_eq!(
            refused.body["error"]["code"], "HOST_SHUTTING_DOWN",
            "{:?}",
            refused.body
        ),
        Ok(_) => panic!("a draining host took a new connection"),
    }
}

#[tokio::test]
async fn a_call_that_arrives_as_the_drain_begins_is_not_started() {
    // The drain's kill of open connections waits a minute, so the call below lands where only
    // the drain's flag stands between it and its handler.
    let host =
        HostProcess::start_with_env(bin(), &[], &[("PI_HOST_TEST_DRAIN_DELAY_MS", "60000")]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut open = Raw::connect(&host.url(), &token).await;
    assert!(open.reply(HELLO).await.get("result").is_some());
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
