//! Secrets stay secret: never in the host's log (at debug level), and every file that holds one
//! is private to the user.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use tests::{Client, HostProcess};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

fn secret_of(token: &str) -> &str {
    token.split_once('.').map(|(_, secret)| secret).unwrap()
}

#[tokio::test]
async fn tokens_never_reach_the_log_and_secret_files_are_private() {
    let host = HostProcess::start(bin()).await;
    let pairing = host.pairing_token(&[]).await["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut client = Client::connect(&host.url(), &pairing).await.unwrap();
    client.hello().await;
    let paired = client.call("pair", json!({"deviceName": "laptop"})).await;
    let device_token = paired["result"]["deviceToken"]
        .as_str()
        .unwrap()
        .to_string();
    let mut device = Client::connect(&host.url(), &device_token).await.unwrap();
    device.hello().await;
    let minted = device
        .call("pairing/create", json!({"roles": ["observer"]}))
        .await;
    let second = minted["result"]["token"].as_str().unwrap().to_string();
    // A refused guess must not be echoed either.
    let guess = format!("{}.notthesecret", pairing.split_once('.').unwrap().0);
    let _ = Client::connect(&host.url(), &guess).await;
    device.call("device/list", json!({})).await;

    let log = host.log();
    assert!(
        log.contains("device paired"),
        "the log is being written at debug level"
    );
    for secret in [
        secret_of(&pairing),
        secret_of(&device_token),
        secret_of(&second),
        "notthesecret",
    ] {
        assert!(!log.contains(secret), "a secret reached the log");
    }

    let mode = |name: &str| {
        std::fs::metadata(host.data_dir.path().join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(
        std::fs::metadata(host.data_dir.path())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    assert_eq!(mode("host.key"), 0o600);
    assert_eq!(mode("pi-host.db"), 0o600);
    assert_eq!(mode("admin.sock"), 0o600);
    let db = std::fs::read(host.data_dir.path().join("pi-host.db")).unwrap();
    let wal = std::fs::read(host.data_dir.path().join("pi-host.db-wal")).unwrap_or_default();
    for secret in [
        secret_of(&pairing),
        secret_of(&device_token),
        secret_of(&second),
    ] {
        let needle = secret.as_bytes();
        let found = db.windows(needle.len()).any(|w| w == needle)
            || wal.windows(needle.len()).any(|w| w == needle);
        assert!(!found, "the store holds only digests of secrets");
    }
}
