//! A process that holds the host's port while the host is down gets no credential
//! (docs/reliability.md §4.11): pi-remote and the RACP client pin the host's certificate by its
//! SHA-256, so a plain listener or a TLS one with another certificate is refused before the
//! upgrade that would carry the token; a profile without a pin (an older version's) is refused
//! before any connection.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use common::Remote;
use racp_proto::ErrorCode;
use racp_proto::client::{ClientOptions, RacpClient};
use racp_proto::fingerprint::CertSha256;
use serde_json::Value;
use tests::{HostProcess, Squatter};

impl Remote {
    /// Pairs with the host through the racps:// link `pi-host pair` prints.
    async fn pair(&self, host: &HostProcess) {
        let minted = host.pairing_token(&[]).await;
        let link = minted["url"].as_str().unwrap();
        assert!(link.starts_with("racps://") && link.contains("?cert=sha256:"));
        let output = self.run(&["pair", link, "--json"]).await;
        assert!(output.status.success(), "{}", text(&output.stderr));
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A host paired with a fresh pi-remote profile, then stopped: its port is free for a squatter.
async fn paired_then_stopped() -> (Remote, std::net::SocketAddr, Value) {
    let mut host = HostProcess::start(&tests::pi_host_binary()).await;
    let remote = Remote::new();
    remote.pair(&host).await;
    // Commands work against the real host, with the pin.
    let output = remote.run(&["sessions"]).await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    let profile = remote.profile();
    assert_eq!(profile["certSha256"], host.cert_sha256.unwrap().to_hex());
    assert_eq!(profile["url"], host.url());
    let addr = host.addr;
    host.kill().await;
    (remote, addr, profile)
}

fn client_options(profile: &Value) -> ClientOptions {
    let mut options = ClientOptions::new(
        profile["url"].as_str().unwrap(),
        profile["deviceToken"].as_str().unwrap(),
    );
    options.pinned_sha256 = profile["certSha256"].as_str().and_then(CertSha256::parse);
    options
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_squatter_with_another_certificate_gets_host_identity_mismatch_and_no_token() {
    let (remote, addr, profile) = paired_then_stopped().await;
    let token = profile["deviceToken"].as_str().unwrap();
    let squatter = Squatter::tls(addr).await;

    let output = remote.run(&["sessions"]).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("HOST_IDENTITY_MISMATCH"), "{stderr}");
    assert!(
        stderr.contains(profile["certSha256"].as_str().unwrap()),
        "{stderr}"
    );
    assert!(
        stderr.contains("another process may hold the port")
            || stderr.contains("Another process may hold the port"),
        "{stderr}"
    );

    let error = RacpClient::connect(client_options(&profile))
        .await
        .err()
        .expect("the client refuses the squatter");
    assert_eq!(error.code(), ErrorCode::HostIdentityMismatch, "{error}");
    assert!(!error.retriable());
    let details = error.details().unwrap();
    assert_eq!(details["expected"], profile["certSha256"]);
    let found = racp_proto::client::certificate_sha256(&squatter.certificate.as_ref().unwrap().der);
    assert_eq!(details["found"], found.to_hex());

    assert!(
        squatter.connections() >= 2,
        "both clients reached the squatter"
    );
    assert!(
        squatter.plaintext().is_empty(),
        "no TLS session was completed"
    );
    squatter.assert_got_no_credential(&[token]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_squatter_gets_no_request_at_all() {
    let (remote, addr, profile) = paired_then_stopped().await;
    let token = profile["deviceToken"].as_str().unwrap();
    let squatter = Squatter::plain(addr).await;

    // The pinned client starts TLS: the squatter sees a ClientHello, never an HTTP request.
    let output = remote.run(&["sessions"]).await;
    let stderr = text(&output.stderr);
    assert_ne!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("REMOTE_CONNECTION_FAILED"), "{stderr}");
    let error = RacpClient::connect(client_options(&profile))
        .await
        .err()
        .expect("the client refuses the squatter");
    assert_eq!(error.code(), ErrorCode::RemoteConnectionFailed, "{error}");
    assert!(squatter.connections() >= 2);
    squatter.assert_got_no_credential(&[token]);

    // The same client pointed at ws:// (as before the fix) refuses before connecting at all.
    let mut plain = client_options(&profile);
    plain.url = format!("ws://{addr}/racp");
    plain.pinned_sha256 = None;
    let before = squatter.connections();
    let error = RacpClient::connect(plain).await.err().unwrap();
    assert_eq!(error.code(), ErrorCode::RemoteConnectionFailed);
    assert_eq!(error.details().unwrap()["reason"], "plain_refused");
    assert_eq!(squatter.connections(), before, "nothing was even connected");
    squatter.assert_got_no_credential(&[token]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_without_a_fingerprint_exits_4_before_connecting() {
    let (remote, addr, mut profile) = paired_then_stopped().await;
    let token = profile["deviceToken"].as_str().unwrap().to_string();
    // What an older pi-remote stored: a ws:// URL and no certSha256.
    profile.as_object_mut().unwrap().remove("certSha256");
    profile["url"] = format!("ws://{addr}/racp").into();
    std::fs::write(remote.profile_path(), profile.to_string()).unwrap();
    let squatter = Squatter::plain(addr).await;

    let output = remote.run(&["sessions"]).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("Pair again"), "{stderr}");
    assert!(stderr.contains("older pi-remote"), "{stderr}");
    let output = remote.run(&["sessions", "--json"]).await;
    assert_eq!(output.status.code(), Some(4));
    let error: Value = serde_json::from_slice(&output.stderr).unwrap();
    assert_eq!(error["exitCode"], 4);
    assert_eq!(squatter.connections(), 0, "nothing was sent");
    squatter.assert_got_no_credential(&[&token]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_pairing_with_a_racps_link_migrates_an_old_profile() {
    let host = HostProcess::start(&tests::pi_host_binary()).await;
    let remote = Remote::new();
    remote.pair(&host).await;
    let mut profile = remote.profile();
    profile.as_object_mut().unwrap().remove("certSha256");
    std::fs::write(remote.profile_path(), profile.to_string()).unwrap();
    assert_eq!(remote.run(&["sessions"]).await.status.code(), Some(4));
    remote.pair(&host).await;
    let output = remote.run(&["sessions"]).await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(
        remote.profile()["certSha256"],
        host.cert_sha256.unwrap().to_hex()
    );
}
