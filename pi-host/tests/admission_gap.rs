//! A revoke that lands between an upgrade's checks and the connection's registration (held open
//! by the debug-build hook `PI_HOST_TEST_ADMISSION_DELAY_MS`) still ends that connection at
//! once, though it never makes a call (docs/protocol.md §12, racp-server/src/connections.rs). So does a
//! drain that begins there, before the connection reads anything.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::Value;
use std::path::Path;
use std::time::Duration;
use tests::raw::{Ending, Raw};
use tests::{HostProcess, PATIENCE};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

async fn connections(host: &HostProcess) -> u64 {
    let (ok, out, err) = host.cli(&["status", "--json"]).await;
    assert!(ok, "{err}");
    let status: Value = serde_json::from_str(out.trim()).unwrap();
    status["connections"].as_u64().unwrap()
}

/// Waits until the host counts `wanted` admitted connections.
async fn until_connections(host: &HostProcess, wanted: u64) {
    let deadline = tokio::time::Instant::now() + PATIENCE * 2;
    while connections(host).await != wanted {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the host never counted {wanted} connections"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A host whose upgrades wait 3 s after their checks, a device, and that device's upgrade
/// admitted and waiting in the gap; `act` runs there. Returns how the connection ended.
async fn in_the_gap(act: impl AsyncFnOnce(&HostProcess, &str)) -> Ending {
    in_the_gap_with(&[], act).await
}

/// [`in_the_gap`] with more environment for the host.
async fn in_the_gap_with(
    env: &[(&str, &str)],
    act: impl AsyncFnOnce(&HostProcess, &str),
) -> Ending {
    let mut env = env.to_vec();
    env.push(("PI_HOST_TEST_ADMISSION_DELAY_MS", "3000"));
    let host = HostProcess::start_with_env(bin(), &[], &env).await;
    let (device_id, token) = host.pair_device("laptop", &[]).await;
    until_connections(&host, 0).await;
    let url = host.url();
    let upgrade = tokio::spawn(async move { Raw::connect(&url, &token).await });
    until_connections(&host, 1).await;
    act(&host, &device_id).await;
    let mut raw = upgrade.await.unwrap();
    // The connection says hello and nothing else: only the host can end it, and it must do so
    // before it reads anything.
    let hello = br#"{"id":1,"method":"hello","params":{"protocol":{"min":1,"max":1},"client":{"name":"raw","version":"0"}}}"#;
    // The host may have closed already: what it sent before is read all the same.
    let _ = raw.text(hello).await;
    let ending = tokio::time::timeout(PATIENCE * 2, raw.until_close())
        .await
        .expect("the host ended the connection in time");
    assert_eq!(ending.answered, 0, "a call was answered: {ending:?}");
    ending
}

#[tokio::test]
async fn a_revoke_in_the_gap_ends_a_connection_that_makes_no_call() {
    let ending = in_the_gap(async |host, device_id| {
        let (ok, _, err) = host.cli(&["revoke", device_id]).await;
        assert!(ok, "{err}");
    })
    .await;
    assert_eq!(
        ending.error.as_deref(),
        Some("REMOTE_AUTH_FAILED"),
        "{ending:?}"
    );
    assert_eq!(ending.close, Some(4031), "{ending:?}");
}

#[tokio::test]
async fn a_drain_that_begins_in_the_gap_ends_the_connection_before_it_reads() {
    // The drain's kill of open connections waits a minute: only the check at the connection's
    // start can end it before its hello is read.
    let ending = in_the_gap_with(
        &[("PI_HOST_TEST_DRAIN_DELAY_MS", "60000")],
        async |host, _| host.sigterm(),
    )
    .await;
    assert_eq!(
        ending.error.as_deref(),
        Some("HOST_SHUTTING_DOWN"),
        "{ending:?}"
    );
    assert_eq!(ending.close, Some(1001), "{ending:?}");
}
